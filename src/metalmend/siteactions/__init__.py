"""Shipyard's configdocs and site actions in ``metalmend serve`` (docs/site-actions.md):
the rules (``policy/``), the steps of the same names (``deploysite``, ``redeploy``), what a
step is given (``steps``), stored actions (``tables``, ``model``, ``store``), configdocs
and the admission of an action (``configdocs``), the action worker (``worker``) and the
router (``routes``)."""
