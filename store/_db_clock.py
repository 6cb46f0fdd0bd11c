"""The database's own clock, as SQL: what leases, sessions and claims shared by several nodes are
timed by.

Every node over one store reads the same clock this way, so a lease one node wrote is judged
lapsed or not alike on every node, whatever their own clocks say. Instants come out in the
log's form (``YYYY-MM-DDTHH:MM:SS.ffffffZ``, UTC), which sorts as it reads; SQLite's clock
has milliseconds, padded to the same width.
"""

from __future__ import annotations

from sqlalchemy import func, literal
from sqlalchemy.sql.elements import ColumnElement

_PG_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'


def db_now(dialect: str) -> ColumnElement:
    """The database's clock now, as an instant."""
    return db_after(dialect, 0.0)


def db_after(dialect: str, seconds: float) -> ColumnElement:
    """The database's clock ``seconds`` from now, as an instant."""
    if dialect == "sqlite":
        # 'now' is read once per statement, so two of these in one statement agree.
        stamp = func.strftime("%Y-%m-%dT%H:%M:%f", "now", literal(f"{seconds:+.3f} seconds"))
        return stamp.op("||")(literal("000Z"))
    # The statement's own instant (clock_timestamp): a claim taken after a wait on a lock is
    # timed from when it is taken.
    moment = func.timezone("UTC", func.clock_timestamp()) + func.make_interval(
        0, 0, 0, 0, 0, 0, literal(float(seconds))
    )
    return func.to_char(moment, _PG_FORMAT)
