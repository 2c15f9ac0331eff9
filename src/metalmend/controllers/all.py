"""Importing this module registers every controller in REGISTRY."""

from metalmend.controllers import nodelink  # noqa: F401
