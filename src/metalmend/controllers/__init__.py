"""The controllers ``metalmend run`` can start, by name.

Each entry wires one controller into a Manager: it asks the manager for the informers it
needs and adds its Controller (``registry.py`` lists them by name).
"""

from __future__ import annotations

from collections.abc import Callable

from metalmend.kube.manager import Manager
from metalmend.settings import Settings

Setup = Callable[[Manager, Settings], None]
"""Wires one controller into a manager, reading what it needs from the settings tree."""
