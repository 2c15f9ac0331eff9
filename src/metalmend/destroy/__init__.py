"""Drydock's part of node teardown in ``metalmend serve`` (docs/destroy.md): stored tasks
(``tables``, ``model``, ``store``) and the destroy of one node (``destroy``)."""
