"""The metadata every table of the service is declared on (the design store's, the task
store's, the action store's, the store identity's), with constraint names fixed by
convention."""

from __future__ import annotations

from sqlalchemy import MetaData

# Constraint names fixed by convention, so a migration can name the constraint it drops
# on every database (SQLite and PostgreSQL name unnamed ones differently).
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)
