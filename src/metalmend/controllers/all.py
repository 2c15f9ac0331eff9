"""Importing this module registers every controller in REGISTRY."""

from metalmend.controllers import (  # noqa: F401
    healthcheck,
    hostpower,
    machineremediation,
    nodelink,
    remediation,
)
