"""``metalmend serve``: the application that assembles the components' routers (Promenade,
Deckhand, Drydock, Shipyard: ``metalmend.teardown``, ``designs``, ``destroy``,
``siteactions``) into one REST service (``app``) and runs it (``server``) against the
cluster it serves (docs/architecture.md).

Importing this package loads nothing web."""
