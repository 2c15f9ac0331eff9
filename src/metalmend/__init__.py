"""metalmend: keeps bare-metal Kubernetes clusters healthy."""

__version__ = "0.1.0"
