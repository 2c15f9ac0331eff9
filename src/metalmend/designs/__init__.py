"""Deckhand's design revisions in ``metalmend serve`` (docs/design-store.md): documents and
rules (no I/O), the store and its tables, design references, how routers read the store
(``access``) and the router (``routes``)."""
