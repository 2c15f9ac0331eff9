"""Drydock's destroy, decided purely: standard library and ``metalmend.api`` only."""
