"""Site actions, decided purely: standard library and ``metalmend.api`` only."""
