"""Flows kept by name (``store.named_flows``): ``namespace/name`` -> the graph hash of its current
version, with every version it had.

Rules of this module:

* Versions are numbered from 1 and never changed or removed: a run started on one keeps the graph
  hash its head names, so an older version is history, not garbage.
* Naming a flow with the graph its current version already has is no new version.
* The graph a version names is stored before it is named (``store.definitions``); this module does
  not read graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, insert, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ._append_rows import now_instant
from ._errors import StoreUnavailable
from ._repository import Repository
from ._schema import flow_versions

# How often naming retries after a racing writer took the version it meant to write (PostgreSQL
# only: SQLite's writes take the lock before they read).
_RACES = 8


@dataclass(frozen=True, slots=True)
class FlowVersion:
    """One version of a named flow: its number, its graph, when, and the run that wrote it
    (None: a caller of the API)."""

    version: int
    graph_hash: str
    created_at: str
    run_id: str | None


@dataclass(frozen=True, slots=True)
class NamedFlow:
    """A named flow as a listing shows it: its current version (the highest, which is also how
    many it has had) and when that was written."""

    namespace: str
    name: str
    version: int
    graph_hash: str
    updated_at: str


@dataclass(frozen=True, slots=True)
class Naming:
    """What naming a flow did: the version ``namespace/name`` now stands at, and whether this call
    made it (False: its current version already had that graph)."""

    version: int
    created: bool


_COLUMNS = (
    flow_versions.c.version,
    flow_versions.c.graph_hash,
    flow_versions.c.created_at,
    flow_versions.c.run_id,
)


def _is(namespace: str, name: str):
    return (flow_versions.c.namespace == namespace) & (flow_versions.c.name == name)


class NamedFlows(Repository):
    """The ``flow_versions`` table."""

    def name(self, namespace: str, name: str, graph_hash: str, *, run_id: str | None) -> Naming:
        """Set ``namespace/name`` to the stored graph ``graph_hash``: a new version when its
        current one names another graph (or it has none), else nothing.

        Raises:
            StoreUnavailable: the database failed; no version was written.
        """
        for _ in range(_RACES):
            try:
                with self._turns.taken(), self._engine.begin() as connection:
                    return self._name_txn(connection, namespace, name, graph_hash, run_id)
            except IntegrityError:
                continue  # another writer took that version first: read the new current one
            except SQLAlchemyError as exc:
                self._forget_connections_after(exc)
                raise self._failed(exc, "name a flow") from None
        raise StoreUnavailable(
            f"the store at {self.url} failed to name a flow: {_RACES} writers took each "
            "version it meant to write first",
            transient=True,
        )

    @staticmethod
    def _name_txn(
        connection: Connection, namespace: str, name: str, graph_hash: str, run_id: str | None
    ) -> Naming:
        current = connection.execute(
            select(flow_versions.c.version, flow_versions.c.graph_hash)
            .where(_is(namespace, name))
            .order_by(flow_versions.c.version.desc())
            .limit(1)
        ).first()
        if current is not None and current.graph_hash == graph_hash:
            return Naming(current.version, False)
        version = 1 if current is None else current.version + 1
        connection.execute(
            insert(flow_versions).values(
                namespace=namespace,
                name=name,
                version=version,
                graph_hash=graph_hash,
                run_id=run_id,
                created_at=now_instant(),
            )
        )
        return Naming(version, True)

    def versions(self, namespace: str, name: str) -> list[FlowVersion]:
        """Every version of ``namespace/name``, oldest first; empty when it names no flow.

        Raises:
            StoreUnavailable: the database failed.
        """
        statement = select(*_COLUMNS).where(_is(namespace, name)).order_by(flow_versions.c.version)
        with self._reading("read a flow's versions") as connection:
            return [FlowVersion(*row) for row in connection.execute(statement)]

    def current(self, namespace: str, name: str) -> FlowVersion | None:
        """The current version of ``namespace/name``, or None when it names no flow.

        Raises:
            StoreUnavailable: the database failed.
        """
        statement = (
            select(*_COLUMNS)
            .where(_is(namespace, name))
            .order_by(flow_versions.c.version.desc())
            .limit(1)
        )
        with self._reading("read a flow") as connection:
            row = connection.execute(statement).first()
        return None if row is None else FlowVersion(*row)

    def list(self) -> list[NamedFlow]:
        """Every named flow at its current version, by namespace and name.

        Raises:
            StoreUnavailable: the database failed.
        """
        newest = (
            select(
                flow_versions.c.namespace,
                flow_versions.c.name,
                func.max(flow_versions.c.version).label("version"),
            )
            .group_by(flow_versions.c.namespace, flow_versions.c.name)
            .subquery()
        )
        statement = (
            select(
                flow_versions.c.namespace,
                flow_versions.c.name,
                flow_versions.c.version,
                flow_versions.c.graph_hash,
                flow_versions.c.created_at,
            )
            .join(
                newest,
                (flow_versions.c.namespace == newest.c.namespace)
                & (flow_versions.c.name == newest.c.name)
                & (flow_versions.c.version == newest.c.version),
            )
            .order_by(flow_versions.c.namespace, flow_versions.c.name)
        )
        with self._reading("list named flows") as connection:
            return [NamedFlow(*row) for row in connection.execute(statement)]
