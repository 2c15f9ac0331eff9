"""Promenade's node teardown in ``metalmend serve`` (docs/teardown.md): each step's pure
policy (``policy/``) beside its executor of the same name, etcd membership (``etcd/``),
the teardown claim (``interlock``) and the routers (``routes``, ``etcd/routes``,
``decommission``)."""
