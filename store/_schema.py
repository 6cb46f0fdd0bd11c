"""Every table of the store, and how an older store is brought up to this build.

Rules of this module:

* It is the one source of truth for the schema: SQLite and PostgreSQL are
  created from these definitions, and an upgrade step may only create what
  they declare or move data into it, never restate a table by hand.
* JSON lives in ``Text`` columns, not JSONB: an event payload's bytes are part
  of the pinned wire form, and JSONB would reorder its keys.
* Instants are ``Text`` in the log's own form (``YYYY-MM-DDTHH:MM:SS.ffffffZ``,
  UTC), which sorts as it reads, so ordering and ``wake_at <= now`` are plain
  string comparisons on both databases.
* ``STORE_VERSION`` goes up by one whenever this module changes shape, with a
  step in ``UPGRADES`` that takes a store from the previous version to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    delete,
    event,
    insert,
    inspect,
    select,
    text,
    update,
)

from ._errors import StoreTooNew
from ._view_codec import dumps

STORE_VERSION = 12

metadata = MetaData()


def _partial_index(name: str, *columns: str, where: str) -> Index:
    """An index over the rows ``where`` admits, partial on both databases.

    SQLite's clause is declared; PostgreSQL's is attached as the index is created
    (``_where_on_postgresql``), since naming ``postgresql_where`` here would load SQLAlchemy's
    PostgreSQL dialect into every process that opens a SQLite store (~60 ms of each `salvor`
    command).
    """
    index = Index(name, *columns, sqlite_where=text(where), info={"where": where})
    event.listen(index, "before_create", _where_on_postgresql)
    return index


def _where_on_postgresql(index: Index, connection: Connection, **_: object) -> None:
    if connection.dialect.name == "postgresql":
        index.dialect_options["postgresql"]["where"] = text(index.info["where"])


events = Table(
    "events",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", Text, nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("recorded_at", Text, nullable=False),
    # The exact payload JSON protocol.encode_payload wrote.
    Column("payload", Text, nullable=False),
    # One B-tree keyed by (run_id, seq) instead of a rowid table plus its
    # primary-key index: an append dirties one page, not two.
    sqlite_with_rowid=False,
)

# One row per run: its fold, materialised in the transaction of every append.
runs = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("wake_at", Text),
    Column("driven_by", Text),
    Column("agent_def_hash", Text),
    # A graph run's graph (it has no agent_def_hash), and for a fork the run it was cut from
    # (the derived index of a run's forks is read from it).
    Column("graph_hash", Text),
    Column("forked_from", Text),
    Column("labels", Text),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("step_count", BigInteger, nullable=False),
    Column("event_count", BigInteger, nullable=False),
    Column("first_recorded_at", Text, nullable=False),
    Column("last_recorded_at", Text, nullable=False),
    Column("pending", Text),
    # Everything needed to rebuild the RunView without reading the log.
    Column("view", Text, nullable=False),
    # Who drives the run (``_run_owners``): the owning node, the epoch every claim of it raises
    # (a driver's appends carry it, and a stale one is refused), and whether that node drives it
    # now. An ordinary append never writes these; a claim, a release and a fenced creating
    # append do.
    Column("owner_node", Text),
    Column("owner_epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("owner_driving", Integer, nullable=False, server_default=text("0")),
    # Runs a restart must re-drive. The indexed column is run_id, not state,
    # so moving between these three states (every commit of a live run)
    # leaves the index alone; only entering or leaving the set touches it.
    _partial_index(
        "ix_runs_active", "run_id", where="state IN ('running', 'awaiting_model', 'awaiting_tool')"
    ),
    # The wake sweeper's read, in its order (run_id breaks ties): every node sweeps, so it stays
    # one index read with no sort.
    _partial_index("ix_runs_sleeping_wake_at", "wake_at", "run_id", where="state = 'sleeping'"),
    # Listing order: newest first, run_id breaking ties. (No index on
    # last_recorded_at: nothing orders by it, and it changes on every append,
    # so it would cost a page in every commit.)
    Index("ix_runs_listing", "first_recorded_at", "run_id"),
    # The forks of a run (``GET /v1/runs/{id}/forks``); only forks have the column set.
    _partial_index("ix_runs_forked_from", "forked_from", where="forked_from IS NOT NULL"),
    # A node's runs in run id order (``RunOwners.owned_by``). Written only when a run changes
    # hands, never by an ordinary append.
    _partial_index("ix_runs_owner_node", "owner_node", "run_id", where="owner_node IS NOT NULL"),
    # The reconciliation queue, oldest first. A run in this state has its
    # open write as its last event (the guard admits only the completion or
    # an abandonment after it), so last_recorded_at is when the intent was
    # recorded and does not move while the run waits: an entry is written
    # when a write's intent is and dropped when its completion is.
    _partial_index(
        "ix_runs_unreconciled", "last_recorded_at", "run_id", where="state = 'needs_reconciliation'"
    ),
)

agents = Table(
    "agents",
    metadata,
    Column("agent_def_hash", Text, primary_key=True),
    Column("format", Text, nullable=False),
    Column("definition", Text, nullable=False),
    Column("name", Text),
    Column("created_at", Text, nullable=False),
    # The file an agent was read from on the daemon's side (a flow's agent file, an agent file a
    # local command ran); null for one registered over the API or written by a run.
    Column("source_path", Text),
)

# Cross-run idempotency identities: exactly one run executes each.
claims = Table(
    "claims",
    metadata,
    Column("identity", Text, primary_key=True),
    Column("run_id", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("output", Text),
    Column("updated_at", Text, nullable=False),
)

# The last answer of each open write's probe (upserted per probe run): what the
# reconciliation queue shows a person when the probe could not tell.
probe_answers = Table(
    "probe_answers",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("tool", Text, nullable=False),
    Column("input", Text, nullable=False),
    # JSON, or NULL when the probe gave no answer (``error`` says why).
    Column("answer", Text),
    Column("error", Text),
    Column("verdict", Text, nullable=False),
    Column("observed_at", Text, nullable=False),
)

# Graph documents, content-addressed: the document as submitted (parsed, re-serialised) under
# its hash, and the shape summary a listing answers with, so a listing reads no document.
graphs = Table(
    "graphs",
    metadata,
    Column("graph_hash", Text, primary_key=True),
    Column("document", Text, nullable=False),
    Column("node_count", Integer, nullable=False),
    Column("edge_count", Integer, nullable=False),
    # JSON arrays of node ids, in document order.
    Column("entry_nodes", Text, nullable=False),
    Column("terminal_nodes", Text, nullable=False),
    Column("created_at", Text, nullable=False),
)

# The operator's outbox: one row per moment a run starts waiting on a person (or fails), written
# in the transaction of the append that caused it when the store was opened with notifications on,
# and delivered at least once by the daemon's notify room. ``body`` is the JSON sent as it is.
notifications = Table(
    "notifications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", Text, nullable=False),
    Column("delivered_at", Text),
    # Which node is delivering the row now, and until when (the store's clock): a row is taken
    # by one node at a time, and one whose claimer died is free again once its claim runs out.
    Column("claimed_by", Text),
    Column("claimed_until", Text),
    UniqueConstraint("run_id", "seq", "kind", name="uq_notifications_cause"),
    # What the deliverer reads: the undelivered rows, soonest due first. Delivered rows leave it.
    _partial_index("ix_notifications_due", "next_attempt_at", "id", where="delivered_at IS NULL"),
)

# The daemons serving this store, one row per ``salvor serve`` process ever started (a node id is
# never reused). ``lease_expires_at`` is written from the database's clock, never a node's; a
# node that is not renewed by then is dead to its peers, and ``stopped_at`` says when it stopped
# or was found dead (after which it can never renew).
nodes = Table(
    "nodes",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("host", Text, nullable=False),
    # The kernel's boot id and the process's start time (``/proc/<pid>/stat`` field 22): with
    # the host and pid, they tell a peer on the same machine whether this very process still
    # lives. "" when unknown.
    Column("boot_id", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pid_start", Text, nullable=False),
    Column("listen", Text),
    Column("started_at", Text, nullable=False),
    Column("lease_expires_at", Text, nullable=False),
    Column("stopped_at", Text),
)

# Drive-token leases on client-driven runs, so a client may drive through any node over this
# store. The token itself is a secret and is never kept: only its SHA-256 digest.
client_leases = Table(
    "client_leases",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("token_digest", Text, nullable=False),
    # Whether the daemon's model steps keep their request bodies (said at the open): 0 or 1.
    Column("record_prompts", Integer, nullable=False),
    Column("opened_at", Text, nullable=False),
    # The store's clock; a driving call moves it on.
    Column("expires_at", Text, nullable=False),
    # Lapsed leases nobody re-opens are swept by it.
    Index("ix_client_leases_expires_at", "expires_at"),
)

# The page's login sessions, so a person logged in through one node is logged in on every node.
# The session id (the cookie's value) is a secret and is never kept: only its SHA-256 digest.
login_sessions = Table(
    "sessions",
    metadata,
    Column("id_digest", Text, primary_key=True),
    Column("created_at", Text, nullable=False),
    Column("expires_at", Text, nullable=False),
    # A login past the capacity ends the oldest.
    Index("ix_sessions_created_at", "created_at"),
)

# The files of flow runs, content-addressed: each member's bytes and each bundle's manifest (the
# canonical JSON a graph run's head names), so recovery, waking and forks never need the client.
flow_files = Table(
    "flow_files",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("content", LargeBinary, nullable=False),
    Column("created_at", Text, nullable=False),
)

# Flow members a client sent ahead of the call that names them (``POST /v1/uploads``): the archive
# as sent, kept until one call names it (which deletes it) or an hour has passed. In the store, so
# whichever node the call reaches holds it.
uploads = Table(
    "uploads",
    metadata,
    Column("upload_id", Text, primary_key=True),
    Column("content_hash", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("content", LargeBinary, nullable=False),
    # The store's clock: every node judges an upload's age alike.
    Column("created_at", Text, nullable=False),
    Index("ix_uploads_created_at", "created_at"),
)

# Flows kept by name: one row per version of ``namespace/name``, numbered from 1 and never removed
# (a run started on an older version, and a fork of it, keeps walking that version's graph by its
# hash); the current version is the highest. Who wrote it: the run whose ``flow_write`` did, or
# null for a caller of the API.
flow_versions = Table(
    "flow_versions",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("graph_hash", Text, nullable=False),
    Column("run_id", Text),
    Column("created_at", Text, nullable=False),
)

store_meta = Table(
    "store_meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Integer, nullable=False),
)

VERSION_KEY = "schema_version"


def _create_missing(connection: Connection) -> None:
    metadata.create_all(connection, checkfirst=True)


_UPGRADE_PAGE = 1000


def _views_learn(connection: Connection, defaults: dict) -> None:
    """Every stored view gains the fields of ``defaults`` it lacks, with those values.

    A view that does not parse is left as it is: its row already reads as
    degraded, and re-folding its log repairs it.
    """
    after = ""
    while True:
        page = connection.execute(
            select(runs.c.run_id, runs.c.view)
            .where(runs.c.run_id > after)
            .order_by(runs.c.run_id)
            .limit(_UPGRADE_PAGE)
        ).all()
        if not page:
            return
        for run_id, stored in page:
            try:
                view = json.loads(stored)
            except ValueError:
                continue
            if isinstance(view, dict) and not defaults.keys() <= view.keys():
                view = {**defaults, **view}
                connection.execute(
                    update(runs).where(runs.c.run_id == run_id).values(view=dumps(view))
                )
        after = page[-1][0]


def _views_learn_replay_of(connection: Connection) -> None:
    """Version 2: a RunView has ``replay_of``; every stored view gains it as null.

    No run of a version-1 store can be a re-run, so null is exact and no log
    needs folding again.
    """
    _views_learn(connection, {"replay_of": None})


def _index_unreconciled_runs(connection: Connection) -> None:
    """Version 3: the partial index the reconciliation queue is read from."""
    for index in runs.indexes:
        if index.name == "ix_runs_unreconciled":
            index.create(connection, checkfirst=True)


def _add_probe_answers(connection: Connection) -> None:
    """Version 4: writes may be probed; their answers get a table of their own."""
    probe_answers.create(connection, checkfirst=True)


def _learn_graph_runs(connection: Connection) -> None:
    """Version 5: runs may be graph runs; ``runs`` gains ``graph_hash`` and ``forked_from`` (and
    the index forks are found by), every stored view the graph fields, all null (no run of an
    older store walked a graph, so null is exact)."""
    # A store made new at version 0 has the columns already (``_create_missing``).
    present = {column["name"] for column in inspect(connection).get_columns("runs")}
    for name in ("graph_hash", "forked_from"):
        if name not in present:
            connection.execute(text(f"ALTER TABLE runs ADD COLUMN {name} TEXT"))
    for index in runs.indexes:
        if index.name == "ix_runs_forked_from":
            index.create(connection, checkfirst=True)
    _views_learn(connection, {"graph_hash": None, "forked_from": None, "open_node": None})
    # Version 5 also stores graph documents, in a table of their own.
    graphs.create(connection, checkfirst=True)


def _add_notifications(connection: Connection) -> None:
    """Version 6: the notification outbox, a table of its own (empty: no older daemon wrote one)."""
    notifications.create(connection, checkfirst=True)


def _learn_run_owners(connection: Connection) -> None:
    """Version 7: runs have owners (``runs`` gains ``owner_node``, ``owner_epoch``,
    ``owner_driving`` and the index a node's runs are found by) and nodes have leases (a
    ``nodes`` table). Every run of an older store starts with no owner, epoch 0, not driven:
    exact, since no older daemon claimed one; its active runs are what a takeover sweep finds."""
    # A store made new at version 0 has the columns already (``_create_missing``).
    present = {column["name"] for column in inspect(connection).get_columns("runs")}
    added = (
        ("owner_node", "TEXT"),
        ("owner_epoch", "BIGINT NOT NULL DEFAULT 0"),
        ("owner_driving", "INTEGER NOT NULL DEFAULT 0"),
    )
    for name, declaration in added:
        if name not in present:
            connection.execute(text(f"ALTER TABLE runs ADD COLUMN {name} {declaration}"))
    for index in runs.indexes:
        if index.name == "ix_runs_owner_node":
            index.create(connection, checkfirst=True)
    nodes.create(connection, checkfirst=True)


def _share_node_state(connection: Connection) -> None:
    """Version 8: what one daemon process kept in memory is shared through the store, for many
    nodes over it: client-run drive leases and login sessions get tables (empty: an older
    daemon's were in its memory and ended with it), outbox rows a claim (none claimed), and the
    wake sweeper's index its tie-break."""
    client_leases.create(connection, checkfirst=True)
    login_sessions.create(connection, checkfirst=True)
    # A store made new at version 0 has the columns already (``_create_missing``).
    present = {column["name"] for column in inspect(connection).get_columns("notifications")}
    for name in ("claimed_by", "claimed_until"):
        if name not in present:
            connection.execute(text(f"ALTER TABLE notifications ADD COLUMN {name} TEXT"))
    # The wake sweeper's index gains run_id, its tie-break, so every node's sweep sorts nothing.
    for index in runs.indexes:
        if index.name == "ix_runs_sleeping_wake_at":
            connection.execute(text("DROP INDEX IF EXISTS ix_runs_sleeping_wake_at"))
            index.create(connection)


def _add_flow_files(connection: Connection) -> None:
    """Version 9: the files of flow runs get a content-addressed table (empty: no older daemon ran
    a flow from its files)."""
    flow_files.create(connection, checkfirst=True)


def _add_uploads(connection: Connection) -> None:
    """Version 10: members sent ahead of their call get a table (empty: no older daemon took
    an upload)."""
    uploads.create(connection, checkfirst=True)


def _agents_learn_source(connection: Connection) -> None:
    """Version 11: an agent remembers the file it was read from (``agents`` gains
    ``source_path``). Every agent of an older store has none: a catalog lists it as registered
    in the store, which is how an older daemon listed every agent."""
    # A store made new at version 0 has the column already (``_create_missing``).
    present = {column["name"] for column in inspect(connection).get_columns("agents")}
    if "source_path" not in present:
        connection.execute(text("ALTER TABLE agents ADD COLUMN source_path TEXT"))


def _add_flow_versions(connection: Connection) -> None:
    """Version 12: flows are kept by name, their versions in a table of their own (empty: an older
    daemon remembered a flow's name only in the writing run's log)."""
    flow_versions.create(connection, checkfirst=True)


# UPGRADES[n] takes a store at version n to version n + 1, inside the opening
# transaction. Version 0 is a store with tables but no version row (or one an
# interrupted first open left half made): creating what is missing is its upgrade.
UPGRADES: dict[int, Callable[[Connection], None]] = {
    0: _create_missing,
    1: _views_learn_replay_of,
    2: _index_unreconciled_runs,
    3: _add_probe_answers,
    4: _learn_graph_runs,
    5: _add_notifications,
    6: _learn_run_owners,
    7: _share_node_state,
    8: _add_flow_files,
    9: _add_uploads,
    10: _agents_learn_source,
    11: _add_flow_versions,
}


def ensure_schema(connection: Connection, *, describe: str) -> int:
    """Create the schema of a new store, or upgrade an older one in place.

    Runs inside the caller's transaction, so a failed upgrade leaves the store
    as it was. ``describe`` names the store in messages.

    Returns:
        The version the store was at before this call (0 when it was new or
        had no version row, ``STORE_VERSION`` when nothing had to change).

    Raises:
        StoreTooNew: the store's version is newer than this build's.
    """
    inspector = inspect(connection)
    found: int | None = None
    if inspector.has_table(store_meta.name):
        found = connection.execute(
            select(store_meta.c.value).where(store_meta.c.key == VERSION_KEY)
        ).scalar_one_or_none()
    if found is None:
        found = 0
    if found > STORE_VERSION:
        raise StoreTooNew(
            f"the store at {describe} has schema version {found}, newer than the "
            f"version {STORE_VERSION} this build of salvor knows; upgrade salvor to open it"
        )
    if found == STORE_VERSION:
        return found
    for version in range(found, STORE_VERSION):
        UPGRADES[version](connection)
    if found == 0:
        connection.execute(delete(store_meta).where(store_meta.c.key == VERSION_KEY))
        connection.execute(insert(store_meta).values(key=VERSION_KEY, value=STORE_VERSION))
    else:
        connection.execute(
            update(store_meta).where(store_meta.c.key == VERSION_KEY).values(value=STORE_VERSION)
        )
    return found
