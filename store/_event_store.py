"""The event store: the object that opens a store's database (creating or upgrading its schema)
and composes its repositories, one per table family.

``store.runs`` (the logs' reads), ``store.writer`` (appends), ``store.definitions`` (agents and
graphs), ``store.settings``, ``store.claims`` (idempotency claims and probe answers),
``store.owners`` (nodes and run ownership), ``store.outbox``, ``store.client_leases``,
``store.sessions``, ``store.flow_files``, ``store.uploads``, ``store.named_flows`` and
``store.changes`` (what tells other processes that an append committed).
Each is in its module of the same family; this one only opens, composes and closes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Self

from salvor.protocol import Envelope, Event, GuardRefusal, RunView
from sqlalchemy import Engine, text, update
from sqlalchemy.exc import SQLAlchemyError

from ._change_signal import ChangeSignal
from ._claims import Claims
from ._client_leases import ClientLeases
from ._definitions import Definitions
from ._engine import create_store_engine, display_url
from ._errors import StoreError, StoreUnavailable, passes_by_itself
from ._flow_files import KeptFlowFiles
from ._location import normalize_store_url
from ._log_writer import AppendRequest, LogWriter
from ._named_flows import NamedFlows
from ._outbox import Outbox
from ._quota import RunQuota
from ._records import RunSummary
from ._repository import Repository, failure_reason
from ._run_owners import Fence, OwnerRelease, RunOwners
from ._run_reads import RunReads
from ._schema import VERSION_KEY, ensure_schema, store_meta
from ._sessions import LoginSessions
from ._settings import Settings
from ._uploads import Uploads

# Any constant works: it only has to be the same in every salvor process.
_PG_SCHEMA_LOCK = 0x5A1F0

__all__ = ["AppendRequest", "EventStore"]


class EventStore(Repository):
    """A store in SQLite or PostgreSQL: its engine, its schema, and its repositories. Safe to
    share between threads.

    Error handling: every method (of the store and of its repositories) raises
    ``StoreUnavailable`` when the database cannot be reached or fails underneath it; a failed
    write left nothing behind.
    """

    def __init__(
        self,
        engine: Engine,
        url: str,
        *,
        notifications: bool = False,
        commit_observer: Callable[[int, float, int], None] | None = None,
        quota: RunQuota | None = None,
    ) -> None:
        """Use ``EventStore.open``; this wraps an engine whose schema is already current."""
        super().__init__(engine, url)
        # What tells other processes over this store that an append committed (issue 30).
        self.changes = ChangeSignal(engine, url)
        self.runs = RunReads(engine, url)
        self.claims = Claims(engine, url)
        self.writer = LogWriter(
            engine,
            url,
            changes=self.changes,
            claims=self.claims,
            notifications=notifications,
            commit_observer=commit_observer,
            quota=quota,
        )
        self.definitions = Definitions(engine, url)
        self.settings = Settings(engine, url)
        # Node leases and run ownership (issue 30, run ownership).
        self.owners = RunOwners(engine, url)
        # The state several nodes share lives in the store (issue 30).
        self.outbox = Outbox(engine, url)
        self.client_leases = ClientLeases(engine, url)
        self.sessions = LoginSessions(engine, url)
        # The files of flow runs, content-addressed (issue 31).
        self.flow_files = KeptFlowFiles(engine, url)
        # Members sent ahead of the call that names them, for one call each (issue 31).
        self.uploads = Uploads(engine, url)
        # Flows kept by name, each with its versions (issue 32).
        self.named_flows = NamedFlows(engine, url)

    @property
    def notifications(self) -> bool:
        """Whether appends write the outbox rows they call for (``open``'s ``notifications``)."""
        return self.writer.notifications

    @property
    def quota(self) -> RunQuota | None:
        """What one run may make this store keep (``open``'s ``quota``); None: no limit."""
        return self.writer.quota

    # -- lifecycle ------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str,
        *,
        synchronous: str = "FULL",
        notifications: bool = False,
        commit_observer: Callable[[int, float, int], None] | None = None,
        quota: RunQuota | None = None,
    ) -> EventStore:
        """Open (creating or upgrading) the store at ``url``.

        Args:
            url: a file path, ``sqlite:///PATH`` or ``postgresql://...``.
            synchronous: SQLite's ``synchronous`` pragma, FULL (the default:
                a commit survives power loss), NORMAL or OFF.
            notifications: every append that makes a run start waiting on a
                person, or fail, writes its outbox row (``notifications``) in
                its own transaction. Only a daemon that delivers them opens a
                store so; anything else writes none.
            commit_observer: called after each append transaction commits, on
                the thread that committed it, with the number of events it
                wrote, how many seconds it took from BEGIN to COMMIT and how
                many appends (one run's batch each) it held. It must be quick
                and must not raise: an exception from it reaches the appender
                although its rows are durable.
            quota: what one run may make the store keep (``RunQuota``): an append
                past it is refused with ``QuotaExceeded`` or ``PayloadTooLarge``,
                nothing written. None: no limit.

        Raises:
            StoreUnavailable: the store cannot be created, reached or read.
            StoreTooNew: the store was written by a newer salvor.
        """
        url = normalize_store_url(url)
        engine = create_store_engine(url, synchronous=synchronous)
        try:
            with engine.begin() as connection:
                if engine.dialect.name == "postgresql":
                    # Two daemons opening a new database must not both create it.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK}
                    )
                ensure_schema(connection, describe=display_url(url))
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            raise StoreUnavailable(
                f"cannot open the store at {display_url(url)}: {failure_reason(exc)}"
            ) from None
        return cls(
            engine, url, notifications=notifications, commit_observer=commit_observer, quota=quota
        )

    def close(self) -> None:
        """Release every connection. The store must not be used afterwards."""
        self.writer.close()
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EventStore {self.url}>"

    # -- the run log's common verbs ---------------------------------------------
    # Nearly every caller (the daemon's drivers and readers, the command line, the tests) appends
    # to and reads one run's log: these five stay on the store itself, one line each over the
    # repository that does the work (``store.writer``, ``store.runs``), so those callers need
    # not know how the store is laid out. Every other verb is its repository's alone.

    def append(
        self,
        run_id: str,
        events: Sequence[Event],
        view: RunView,
        *,
        claim: str | None = None,
        settle: str | None = None,
        release: str | None = None,
        fence: Fence | None = None,
    ) -> tuple[list[Envelope], RunView]:
        """``LogWriter.append``: one run's batch, durably, in one transaction."""
        return self.writer.append(
            run_id, events, view, claim=claim, settle=settle, release=release, fence=fence
        )

    def append_batch(
        self, requests: Sequence[AppendRequest | OwnerRelease]
    ) -> list[tuple[list[Envelope], RunView] | StoreError | GuardRefusal | ValueError | None]:
        """``LogWriter.append_batch``: group commit, one outcome per request."""
        return self.writer.append_batch(requests)

    def read_log(
        self,
        run_id: str,
        from_seq: int = 0,
        *,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Envelope]:
        """``RunReads.read_log``: the run's envelopes from ``from_seq`` on."""
        return self.runs.read_log(run_id, from_seq, limit=limit, max_bytes=max_bytes)

    def read_view(self, run_id: str) -> RunView | None:
        """``RunReads.read_view``: the run's current view, or None."""
        return self.runs.read_view(run_id)

    def list_runs(
        self,
        *,
        state: str | None = None,
        label: tuple[str, str] | None = None,
        agent_def_hash: str | None = None,
        graph_hash: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[list[RunSummary], str | None]:
        """``RunReads.list_runs``: one page of run summaries, newest first."""
        return self.runs.list_runs(
            state=state,
            label=label,
            agent_def_hash=agent_def_hash,
            graph_hash=graph_hash,
            limit=limit,
            after=after,
        )

    # -- the store as a whole -----------------------------------------------------

    def check_writable(self) -> None:
        """Commit one write that changes nothing, to learn whether the store accepts writes now.

        It negates the schema-version row and negates it back in one
        transaction: a real write that reaches the database's log (a full
        disk or a read-only file refuses it), and no reader sees a
        difference. (Writing the row's own value would not do: SQLite skips
        a write whose bytes are unchanged, and commits nothing.)

        Raises:
            StoreUnavailable: the store refused the write (``transient`` when
                the failure may pass by itself); nothing changed.
        """
        statement = (
            update(store_meta)
            .where(store_meta.c.key == VERSION_KEY)
            .values(value=-store_meta.c.value)
        )
        try:
            with self._engine.begin() as connection:
                connection.execute(statement)
                connection.execute(statement)
        except SQLAlchemyError as exc:
            self._forget_connections_after(exc)
            raise StoreUnavailable(
                f"the store at {self.url} does not accept writes: {failure_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
