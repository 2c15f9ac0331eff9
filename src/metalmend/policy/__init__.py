"""Pure decisions, one module per controller: observed state (and ``now``) in, what to do
out. No I/O here, so every rule is tested by a table."""
