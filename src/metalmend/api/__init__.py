"""The Kubernetes API surface metalmend reads and writes: kinds, names and parsers."""
