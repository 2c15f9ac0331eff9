"""Shipyard's site actions in ``metalmend serve`` (docs/site-actions.md)."""
