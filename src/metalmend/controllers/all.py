"""Importing this module registers every controller in REGISTRY."""

from metalmend.controllers import hostpower, nodelink  # noqa: F401
