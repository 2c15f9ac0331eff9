"""Drydock's part of node teardown in ``metalmend serve`` (docs/destroy.md): the pure
decision (``policy/destroy``) and the destroy of one node (``destroy``), stored tasks
(``tables``, ``model``, ``store``), the task worker (``worker``) and the router (``routes``)."""
