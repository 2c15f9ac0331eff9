"""``metalmend serve``: the REST service hosting Airship's node-teardown API (Promenade's,
under ``/promenade/api/v1.0``) over the cluster it runs against (docs/teardown.md).

Importing this package loads nothing web: ``metalmend.settings`` reads its settings."""
