"""What the routers of ``metalmend serve`` share, below every component: the gate
(``auth``), Status bodies (``status``), the context marker, the bounded body reader, the
settings section ``serve`` and the dependencies the application provides
(docs/architecture.md)."""
