"""The tags Shipyard puts on Deckhand's design revisions (Shipyard's API reference,
"configdocs" and "actions"): a commit, a rollback's commit, a site action's outcome. Shared
by the design store's routes (which keep these tags from being deleted by hand) and the
site actions (which set them)."""

from __future__ import annotations

COMMITTED_TAG = "committed"
ROLLBACK_COMMIT_TAG = "rollback_commit"  # Shipyard's tag on a rollback; a commit too
SUCCESS_TAG = "site-action-success"
FAILURE_TAG = "site-action-failure"
COMMIT_TAGS = frozenset({COMMITTED_TAG, ROLLBACK_COMMIT_TAG})
SITE_ACTION_TAGS = frozenset({SUCCESS_TAG, FAILURE_TAG})
