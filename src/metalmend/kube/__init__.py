"""metalmend's small controller runtime on lightkube: clients, CRD installation, and more."""
