"""metalmend's small controller runtime on lightkube: clients, CRD installation, and more."""

from metalmend.kube import generic as _generic

_generic.install()
