"""Importing this module registers every controller in REGISTRY."""

from metalmend.controllers import healthcheck, hostpower, nodelink  # noqa: F401
