"""Agent definitions and graph documents, content-addressed (``store.definitions``).

Rules of this module:

* A row is keyed by its content's hash and written once: a second registration of the same hash
  keeps the first row (an agent's name excepted: registering under another name renames it).
* Listings read no document and no definition text they do not return.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ._append_rows import now_instant
from ._records import (
    GRAPH_SUMMARY_KEYS,
    GraphSummary,
    StoredAgent,
    StoredGraph,
    agent_from_row,
    graph_from_row,
    graph_summary_from_row,
)
from ._repository import Repository
from ._schema import agents, graphs
from ._view_codec import dumps

# The texts an agent definition is kept in: TOML, JSON, or a markdown agent file.
AGENT_FORMATS = ("toml", "json", "md")

_AGENT_COLUMNS = (
    agents.c.agent_def_hash,
    agents.c.format,
    agents.c.definition,
    agents.c.name,
    agents.c.created_at,
    agents.c.source_path,
)
_GRAPH_SUMMARY_COLUMNS = (
    graphs.c.graph_hash,
    graphs.c.node_count,
    graphs.c.edge_count,
    graphs.c.entry_nodes,
    graphs.c.terminal_nodes,
    graphs.c.created_at,
)
_SELECT_GRAPH = select(graphs.c.graph_hash, graphs.c.document, graphs.c.created_at).where(
    graphs.c.graph_hash == bindparam("graph_hash")
)
# Oldest first, as the agents are listed; the document itself is not read.
_LIST_GRAPHS = select(*_GRAPH_SUMMARY_COLUMNS).order_by(graphs.c.created_at, graphs.c.graph_hash)


class Definitions(Repository):
    """The ``agents`` and ``graphs`` tables."""

    # -- agents ---------------------------------------------------------------

    def put_agent(
        self,
        agent_def_hash: str,
        *,
        format: str,
        definition: str,
        name: str | None,
        source_path: str | None = None,
    ) -> bool:
        """Register an agent definition under its hash.

        ``name`` is no part of the hash: registering a registered definition under
        another name renames it (its stored text becomes the one that names it); one
        that names nothing leaves the name it has. ``source_path``: the file it was read
        from on the daemon's side, kept (the newest such file) once one is given; None
        leaves the one it has.

        Returns:
            True when it was stored now, False when that hash was already registered.

        Raises:
            StoreUnavailable: the database failed; nothing was written (a rename either
                happened whole or not at all).
        """
        if format not in AGENT_FORMATS:
            raise ValueError(f'an agent definition is "toml", "json" or "md", not {format!r}')
        row = {
            "agent_def_hash": agent_def_hash,
            "format": format,
            "definition": definition,
            "name": name,
            "created_at": now_instant(),
            "source_path": source_path,
        }
        if self._insert_once(agents, row, "register an agent"):
            return True
        held = agents.c.agent_def_hash == agent_def_hash
        if name is not None:
            rename = (
                update(agents)
                .where(held, agents.c.name.is_distinct_from(name))
                .values(format=format, definition=definition, name=name)
            )
            with self._writing("rename an agent") as connection:
                connection.execute(rename)
        if source_path is not None:
            located = (
                update(agents)
                .where(held, agents.c.source_path.is_distinct_from(source_path))
                .values(source_path=source_path)
            )
            with self._writing("locate an agent") as connection:
                connection.execute(located)
        return False

    def get_agent(self, agent_def_hash: str) -> StoredAgent | None:
        statement = select(*_AGENT_COLUMNS).where(agents.c.agent_def_hash == agent_def_hash)
        with self._reading("read an agent") as connection:
            row = connection.execute(statement).first()
        return None if row is None else agent_from_row(row)

    def list_agents(self) -> list[StoredAgent]:
        """Every registered agent, oldest first."""
        statement = select(*_AGENT_COLUMNS).order_by(agents.c.created_at, agents.c.agent_def_hash)
        with self._reading("list agents") as connection:
            return [agent_from_row(row) for row in connection.execute(statement)]

    # -- graphs ---------------------------------------------------------------

    def put_graph(self, graph_hash: str, *, document: Any, summary: dict) -> bool:
        """Store a validated graph document under its hash, with its shape summary.

        The document is kept as submitted (the parsed JSON value, its keys in
        the order they came); a second submission of the same hash keeps the
        first one's row untouched.

        Args:
            graph_hash: ``Graph.hash``.
            document: ``Graph.document``.
            summary: ``Graph.summary()`` (``GRAPH_SUMMARY_KEYS``).

        Returns:
            True when it was stored now, False when that hash was already stored.

        Raises:
            ValueError: ``summary`` does not hold exactly ``GRAPH_SUMMARY_KEYS``;
                nothing was written.
            StoreUnavailable: the database failed; nothing was written.
        """
        if set(summary) != set(GRAPH_SUMMARY_KEYS):
            raise ValueError(
                f"a graph's summary holds {sorted(GRAPH_SUMMARY_KEYS)}, not {sorted(summary)}"
            )
        row = {
            "graph_hash": graph_hash,
            "document": dumps(document),
            "node_count": summary["node_count"],
            "edge_count": summary["edge_count"],
            "entry_nodes": dumps(list(summary["entry_nodes"])),
            "terminal_nodes": dumps(list(summary["terminal_nodes"])),
            "created_at": now_instant(),
        }
        return self._insert_once(graphs, row, "store a graph")

    def get_graph(self, graph_hash: str) -> StoredGraph | None:
        """The graph document stored under ``graph_hash``, or None."""
        with self._reading("read a graph") as connection:
            row = connection.execute(_SELECT_GRAPH, {"graph_hash": graph_hash}).first()
        return None if row is None else graph_from_row(row)

    def list_graphs(self) -> list[GraphSummary]:
        """Every stored graph's hash and shape, oldest first; no document is read."""
        with self._reading("list graphs") as connection:
            return [graph_summary_from_row(row) for row in connection.execute(_LIST_GRAPHS)]

    def _insert_once(self, table: Any, row: dict, doing: str) -> bool:
        """Insert a content-addressed row; False when its key was already there (kept as it was).

        Raises:
            StoreUnavailable: the database failed (``doing`` names what); nothing was written.
        """
        try:
            with self._engine.begin() as connection:
                connection.execute(insert(table), row)
        except IntegrityError:
            return False
        except SQLAlchemyError as exc:
            self._forget_connections_after(exc)
            raise self._failed(exc, doing) from None
        return True
