"""Benchmarks: they print numbers (ratios side by side where there is a comparison) and
assert nothing. Run them all with ``make bench``."""
