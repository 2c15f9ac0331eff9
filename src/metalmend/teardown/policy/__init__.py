"""The node-teardown steps, decided purely: standard library and ``metalmend.api`` only."""
