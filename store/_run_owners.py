"""Which node drives which run: node leases and run ownership, with fencing.

A node (one ``salvor serve`` process) has a lease in ``nodes``; a run's owner is three columns
of its ``runs`` row (``owner_node``, ``owner_epoch``, ``owner_driving``). A node that wants to
drive a run claims it: a compare-and-set that wins when the run has no owner, its owner is not
driving it, or its owner's lease has lapsed (or the caller proved the owner dead). Every win
raises the run's epoch; the winner's appends carry ``Fence(node, epoch)`` and the store refuses
one whose epoch is no longer the run's, in the append's own transaction, so a driver that was
taken over (paused, partitioned, presumed dead but not) can never write after its successor.

Why leases are per node, not per run: one heartbeat (``renew``) keeps every run the node owns,
however many, in one short write; a run's owner is only the node's id and an epoch, written when
the run changes hands and never by an ordinary append. A run a node creates is that node's from
the transaction that writes its first event (``Fence.creating``: epoch 0, not yet driving), so a
peer's sweep (``orphans``) never finds a new run without an owner before its first claim. A node
is dead to its peers once its lease has lapsed, and then for good: ``renew`` succeeds only while
the lease has not lapsed, and a claim that judges a node dead marks it stopped in the same
transaction (on PostgreSQL the renewal and the claim serialise on that node's row), so a node
that wakes from a pause past its lease learns it lost its runs instead of extending a lease a peer
has already acted on.

Why the database's clock: nodes on several hosts disagree about the time, and a lease is only
safe if everyone measures it against one clock. Every expiry is written and compared with the
database's own ``now`` (PostgreSQL's ``clock_timestamp()``, SQLite's ``strftime``), in the
store's instant form; no node's clock ever enters a comparison. A node times its own
self-fencing margin from its local monotonic clock, measured from before it sent the renewal.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Text, bindparam, text

from ._errors import Fenced
from ._repository import Repository


@dataclass(frozen=True, slots=True)
class Fence:
    """What a driver's appends carry: the run is written only while this node owns it at this
    epoch.

    ``driving`` False: a creating append's only (``Fence.creating``): the new run is this node's
    from its first event, not yet driven; its first drive's claim takes it (epoch 1).
    """

    node_id: str
    epoch: int
    driving: bool = True

    @classmethod
    def creating(cls, node_id: str) -> Fence:
        """What a node's creating append of a run no drive of its holds carries: the run is
        owned by ``node_id`` from the transaction that writes its first event, so no peer's
        takeover sweep finds it without an owner between its creation and its first claim."""
        return cls(node_id, 0, driving=False)


@dataclass(frozen=True, slots=True)
class OwnerRelease:
    """``RunOwners.release`` as an item of ``EventStore.append_batch``: the drive holding
    ``run_id`` under ``fence`` lets it go, in the same transaction as the appends beside it."""

    run_id: str
    fence: Fence


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One row of ``nodes``: a daemon process and its lease (instants in the store's form)."""

    node_id: str
    name: str
    host: str
    boot_id: str
    pid: int
    pid_start: str
    listen: str | None
    started_at: str
    lease_expires_at: str
    stopped_at: str | None


@dataclass(frozen=True, slots=True)
class RunOwner:
    """A run's owner as the store holds it. ``node_live``: the owner's lease holds now (by the
    database's clock) and it has not stopped; False when there is no owner."""

    run_id: str
    node_id: str | None
    epoch: int
    driving: bool
    node_live: bool


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim's outcome: ``fence`` when it won, else ``owner`` says who holds the run (None:
    the run does not exist yet, which a claim always wins). ``taken_from``: on a win, the node
    that was still marked driving the run (found dead, or its lease lapsed): a takeover."""

    fence: Fence | None
    owner: RunOwner | None
    taken_from: str | None = None


# The database's now, and now plus a lease, as the store's instant text
# (``YYYY-MM-DDTHH:MM:SS.ffffffZ``), so they compare as text with every other instant.
# SQLite's %f has milliseconds: three zeros make the six digits (and sort right against them).
_NOW = {
    "sqlite": "(strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z')",
    "postgresql": (
        "to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
    ),
}
_LATER = {
    "sqlite": "(strftime('%Y-%m-%dT%H:%M:%f', 'now', :lease_modifier) || '000Z')",
    "postgresql": (
        "to_char((clock_timestamp() + make_interval(secs => :lease_seconds)) AT TIME ZONE 'UTC',"
        ' \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\')'
    ),
}
# The states a driver was interrupted in, literally as ix_runs_active declares them, so both
# planners read that partial index.
_ACTIVE = "r.state IN ('running', 'awaiting_model', 'awaiting_tool')"
_TERMINAL = ("completed", "failed", "abandoned")
# Run ids per query: keeps a long list within both databases' parameter limits.
_PAGE = 400
_NODE_COLUMNS = (
    "node_id, name, host, boot_id, pid, pid_start, listen, started_at, lease_expires_at, stopped_at"
)


class RunOwners(Repository):
    """Node leases and run ownership in one store. Blocking, safe to share between threads;
    every method is one short transaction of its own.

    Error handling: every method raises ``StoreUnavailable`` when the database fails; a failed
    write left nothing behind.
    """

    def __init__(self, engine: Engine, url: str) -> None:
        """Built by ``EventStore.open`` (``store.owners``)."""
        super().__init__(engine, url)
        postgres = self.dialect == "postgresql"
        now, later = _NOW[self.dialect], _LATER[self.dialect]
        live = f"(n.node_id IS NOT NULL AND n.stopped_at IS NULL AND n.lease_expires_at >= {now})"
        owner_columns = (
            f"r.run_id, r.owner_node, r.owner_epoch, r.owner_driving, CASE WHEN {live} "
            "THEN 1 ELSE 0 END"
        )
        self._node_statements(now, later)
        # The claimer's own lease, read without a lock: a claim holding its own node's row
        # while waiting on a run row a peer holds (that peer waiting to judge this node dead)
        # would deadlock. A node judged dead a moment after it won a claim loses the run at its
        # next renewal, and the run's fence keeps its appends out meanwhile.
        self._claimer_live = text(
            f"SELECT CASE WHEN stopped_at IS NULL AND lease_expires_at >= {now} THEN 1 ELSE 0 END "
            "FROM nodes WHERE node_id = :node_id"
        )
        self._run_owner = text(
            "SELECT owner_node, owner_epoch, owner_driving FROM runs WHERE run_id = :run_id"
            + (" FOR UPDATE" if postgres else "")
        )
        # The judgement that a node is dead is itself a write to its row: on PostgreSQL a
        # renewal waiting on that row then re-reads it, finds it stopped and fails, and a
        # renewal that committed first leaves a lease this no longer matches.
        self._bury = text(
            f"UPDATE nodes SET stopped_at = COALESCE(stopped_at, {now}) WHERE node_id = :node_id "
            f"AND (stopped_at IS NOT NULL OR lease_expires_at < {now} OR :proven = 1)"
        )
        self._node_exists = text("SELECT 1 FROM nodes WHERE node_id = :node_id")
        self._take = text(
            "UPDATE runs SET owner_node = :node_id, owner_epoch = :epoch, owner_driving = 1 "
            "WHERE run_id = :run_id AND owner_epoch = :was"
        )
        self._release = text(
            "UPDATE runs SET owner_driving = 0 WHERE run_id = :run_id AND owner_node = :node_id "
            "AND owner_epoch = :epoch"
        )
        self._owners = text(
            f"SELECT {owner_columns} FROM runs r LEFT JOIN nodes n ON n.node_id = r.owner_node "
            "WHERE r.run_id IN :run_ids"
        ).bindparams(bindparam("run_ids", expanding=True, type_=Text))
        self._orphans = text(
            f"SELECT {owner_columns} FROM runs r LEFT JOIN nodes n ON n.node_id = r.owner_node "
            f"WHERE {_ACTIVE} AND (r.owner_node IS NULL OR (r.owner_node <> :node_id AND "
            f"(NOT {live} OR r.owner_node IN :dead))) ORDER BY r.run_id LIMIT :limit"
        ).bindparams(bindparam("dead", expanding=True, type_=Text))
        self._owned_by = text("SELECT run_id FROM runs WHERE owner_node = :node_id ORDER BY run_id")
        self._held = text(
            "SELECT run_id, owner_node, owner_epoch, state FROM runs WHERE run_id IN :run_ids"
        ).bindparams(bindparam("run_ids", expanding=True, type_=Text))

    def _node_statements(self, now: str, later: str) -> None:
        """The statements of the ``nodes`` table (``now``, ``later``: this dialect's
        expressions of the database's now and now plus a lease)."""
        self._register = text(
            f"INSERT INTO nodes ({_NODE_COLUMNS}) VALUES (:node_id, :name, :host, :boot_id, "
            f":pid, :pid_start, :listen, {now}, {later}, NULL)"
        )
        self._lease_of = text("SELECT lease_expires_at FROM nodes WHERE node_id = :node_id")
        self._renew = text(
            f"UPDATE nodes SET lease_expires_at = {later} WHERE node_id = :node_id "
            f"AND stopped_at IS NULL AND lease_expires_at >= {now}"
        )
        self._retire = text(
            f"UPDATE nodes SET stopped_at = COALESCE(stopped_at, {now}), "
            f"lease_expires_at = {now} WHERE node_id = :node_id"
        )
        self._set_listen = text("UPDATE nodes SET listen = :listen WHERE node_id = :node_id")
        # SQLite's modifier and PostgreSQL's interval both take the seconds negated: "now minus".
        self._forget = text(f"DELETE FROM nodes WHERE lease_expires_at < {later}")
        self._nodes = text(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY started_at, node_id")
        self._live_nodes = text(
            f"SELECT node_id FROM nodes WHERE stopped_at IS NULL AND lease_expires_at >= {now} "
            "ORDER BY node_id"
        )

    def _lease_params(self, lease_seconds: float) -> dict:
        if not lease_seconds > 0:
            raise ValueError(f"a lease lasts a positive number of seconds, not {lease_seconds!r}")
        if self.dialect == "sqlite":
            return {"lease_modifier": f"+{lease_seconds:.3f} seconds"}
        return {"lease_seconds": float(lease_seconds)}

    # -- nodes ------------------------------------------------------------------

    def register(
        self,
        node_id: str,
        *,
        name: str,
        host: str,
        boot_id: str = "",
        pid: int,
        pid_start: str = "",
        listen: str | None = None,
        lease_seconds: float,
    ) -> str:
        """Record a new node whose lease runs ``lease_seconds`` from now (the database's now).

        Returns:
            When the lease expires, in the store's instant form.

        Raises:
            ValueError: ``lease_seconds`` is not positive.
            StoreUnavailable: the database failed, or ``node_id`` is taken (ids are never
                reused); nothing was written.
        """
        params = {
            "node_id": node_id,
            "name": name,
            "host": host,
            "boot_id": boot_id,
            "pid": pid,
            "pid_start": pid_start,
            "listen": listen,
            **self._lease_params(lease_seconds),
        }
        with self._writing("register a node") as connection:
            connection.execute(self._register, params)
            return connection.execute(self._lease_of, {"node_id": node_id}).scalar_one()

    def renew(self, node_id: str, lease_seconds: float) -> bool:
        """Extend ``node_id``'s lease to ``lease_seconds`` from now (the database's now).

        Returns:
            True when renewed. False when the lease had already lapsed, or the node was
            retired or found dead: nothing changed, and the node owns none of its runs any
            more (a peer may have claimed them): it must stop driving every one.

        Raises:
            StoreUnavailable: the database failed; the lease is as it was (the node must
                count it as running out from its last successful renewal).
        """
        params = {"node_id": node_id, **self._lease_params(lease_seconds)}
        with self._writing("renew a node's lease") as connection:
            return connection.execute(self._renew, params).rowcount == 1

    def retire(self, node_id: str) -> None:
        """A graceful stop: the node's lease ends now, so its peers may take its runs at once.

        Raises:
            StoreUnavailable: the database failed; the lease is as it was (its runs are taken
                over once it lapses).
        """
        with self._writing("retire a node") as connection:
            connection.execute(self._retire, {"node_id": node_id})

    def set_listen(self, node_id: str, listen: str | None) -> None:
        """Record where ``node_id`` listens (known only once it has bound its socket).

        Raises:
            StoreUnavailable: the database failed; the row is as it was.
        """
        with self._writing("record a node's address") as connection:
            connection.execute(self._set_listen, {"node_id": node_id, "listen": listen})

    def forget_nodes(self, lapsed_for: float) -> int:
        """Delete the rows of nodes whose lease lapsed more than ``lapsed_for`` seconds ago (by
        the database's clock): a daemon start adds a row that nothing else removes. A run whose
        owner is forgotten reads as owned by a dead node, as it did before.

        Returns:
            How many rows were deleted.

        Raises:
            ValueError: ``lapsed_for`` is not positive.
            StoreUnavailable: the database failed; nothing was deleted.
        """
        params = self._lease_params(lapsed_for)
        if self.dialect == "sqlite":
            params = {"lease_modifier": "-" + params["lease_modifier"][1:]}
        else:
            params = {"lease_seconds": -params["lease_seconds"]}
        with self._writing("forget stopped nodes") as connection:
            return connection.execute(self._forget, params).rowcount

    def nodes(self) -> list[NodeRecord]:
        """Every node ever registered (stopped ones too), oldest first."""
        with self._reading("list nodes") as connection:
            return [NodeRecord(*row) for row in connection.execute(self._nodes)]

    def live_nodes(self) -> list[str]:
        """The ids of the nodes whose lease holds now (by the database's clock), sorted: those
        a takeover's work is shared among."""
        with self._reading("list live nodes") as connection:
            return list(connection.execute(self._live_nodes).scalars())

    # -- runs -------------------------------------------------------------------

    def claim(self, run_id: str, node_id: str, *, dead_nodes: Collection[str] = ()) -> Claimed:
        """Make ``node_id`` the driving owner of ``run_id`` if nobody else may be driving it.

        Wins when the run has no owner, its owner is not driving it, its owner's lease has
        lapsed (or the owner stopped), or its owner is in ``dead_nodes`` (peers the caller
        proved dead); a win raises the run's epoch by one and marks a dead owner stopped (it
        can never renew again). A run with no row yet is won at epoch 1 without a write: the
        creating append carrying that fence makes ``node_id`` its owner. A run ``node_id``
        created (``Fence.creating``) and nobody drives yet is won at epoch 1. A run ``node_id``
        itself drives already is not won again (``owner`` names ``node_id``).

        Raises:
            Fenced: ``node_id``'s own lease has lapsed or it was retired (or never
                registered): it may claim nothing; nothing was written.
            StoreUnavailable: the database failed; nothing was written.
        """
        (claimed,) = self.claim_many([run_id], node_id, dead_nodes=dead_nodes)
        if isinstance(claimed, Fenced):
            raise claimed
        return claimed

    def claim_many(
        self, run_ids: Sequence[str], node_id: str, *, dead_nodes: Collection[str] = ()
    ) -> list[Claimed | Fenced]:
        """``claim`` for each of ``run_ids``, in one transaction: a daemon's drives starting
        together share one commit (and one fsync) instead of one each.

        Returns:
            One outcome per run, in order: its ``Claimed``, or ``Fenced`` when ``node_id``'s own
            lease has lapsed (then for every run; nothing was written).

        Raises:
            StoreUnavailable: the database failed; nothing was written.
        """
        with self._writing("claim a run") as connection:
            live = connection.execute(self._claimer_live, {"node_id": node_id}).scalar()
            if not live:
                return [
                    Fenced(
                        f"node {node_id} holds no live lease (it lapsed, or the node "
                        f"stopped); it may not claim run {run_id}",
                        run_id=run_id,
                        epoch=0,
                    )
                    for run_id in run_ids
                ]
            # In run id order, so two claimers' transactions never wait on each other's rows
            # in a cycle (PostgreSQL locks each row it reads).
            claimed = {
                run_id: self._claim_in(connection, run_id, node_id, dead_nodes)
                for run_id in sorted(set(run_ids))
            }
            return [claimed[run_id] for run_id in run_ids]

    def _claim_in(
        self, connection: Any, run_id: str, node_id: str, dead_nodes: Collection[str]
    ) -> Claimed:
        row = connection.execute(self._run_owner, {"run_id": run_id}).first()
        if row is None:
            return Claimed(Fence(node_id, 1), None)
        owner, epoch, driving = row
        free = owner is None or not driving
        taken_from = None
        if not free and owner != node_id:
            proven = 1 if owner in dead_nodes else 0
            buried = connection.execute(self._bury, {"node_id": owner, "proven": proven}).rowcount
            free = buried == 1 or (
                connection.execute(self._node_exists, {"node_id": owner}).first() is None
            )
            taken_from = owner if free else None
        if not free:
            return Claimed(None, RunOwner(run_id, owner, epoch, True, True))
        taken = connection.execute(
            self._take,
            {"node_id": node_id, "epoch": epoch + 1, "run_id": run_id, "was": epoch},
        ).rowcount
        if taken != 1:
            # Only on SQLite without the row lock could this be; the transaction is
            # IMMEDIATE there, so nothing moved it: still, never claim on a lost CAS.
            return Claimed(None, self._owner_in(connection, run_id))
        return Claimed(Fence(node_id, epoch + 1), None, taken_from)

    def release(self, run_id: str, fence: Fence) -> None:
        """``fence``'s node stops driving ``run_id``, and stays its owner (a run left active by
        a failed drive stays with its live node). Nothing happens when the fence is stale.

        Raises:
            StoreUnavailable: the database failed; the run is as it was (still marked driving:
                a peer may claim it only once this node's lease lapses).
        """
        params = {"run_id": run_id, "node_id": fence.node_id, "epoch": fence.epoch}
        with self._writing("release a run") as connection:
            connection.execute(self._release, params)

    def owner(self, run_id: str) -> RunOwner | None:
        """``run_id``'s owner (``node_id`` None when it has none); None when the run does not
        exist."""
        return self.owners([run_id]).get(run_id)

    def owners(self, run_ids: Iterable[str]) -> dict[str, RunOwner]:
        """The owner of each of ``run_ids`` that exists (one query per 400 runs)."""
        ids = list(dict.fromkeys(run_ids))
        found: dict[str, RunOwner] = {}
        with self._reading("read runs' owners") as connection:
            for start in range(0, len(ids), _PAGE):
                page = ids[start : start + _PAGE]
                for row in connection.execute(self._owners, {"run_ids": page}):
                    found[row[0]] = _owner(row)
        return found

    def _owner_in(self, connection: Any, run_id: str) -> RunOwner | None:
        row = connection.execute(self._owners, {"run_ids": [run_id]}).first()
        return None if row is None else _owner(row)

    def orphans(
        self, node_id: str, *, dead_nodes: Collection[str] = (), limit: int = 200
    ) -> list[RunOwner]:
        """Active runs (running, awaiting a model or a tool) nobody live drives: no owner, or
        an owner whose lease lapsed, who stopped, or who is in ``dead_nodes``; never
        ``node_id``'s own. At most ``limit``, by run id. What a takeover sweep claims."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        params = {"node_id": node_id, "dead": list(dead_nodes), "limit": limit}
        with self._reading("find orphaned runs") as connection:
            return [_owner(row) for row in connection.execute(self._orphans, params)]

    def owned_by(self, node_id: str) -> list[str]:
        """The runs whose owner is ``node_id`` (driving them or not), by run id."""
        with self._reading("list a node's runs") as connection:
            return list(connection.execute(self._owned_by, {"node_id": node_id}).scalars())

    def lapsed_runs(self, node_id: str, fences: Mapping[str, int]) -> list[str]:
        """Of the runs ``node_id`` believes it owns (run id -> epoch), those it no longer may
        drive: the store holds another owner or epoch (taken over), or the run has ended (an
        abandonment by another writer, or this node's own last append). A run with no row yet
        (claimed, its creating append not written) is not lapsed.

        Returns:
            Those run ids, sorted.
        """
        ids = list(fences)
        lapsed: list[str] = []
        with self._reading("check a node's runs") as connection:
            for start in range(0, len(ids), _PAGE):
                page = ids[start : start + _PAGE]
                for run_id, owner, epoch, state in connection.execute(
                    self._held, {"run_ids": page}
                ):
                    if owner != node_id or epoch != fences[run_id] or state in _TERMINAL:
                        lapsed.append(run_id)
        return sorted(lapsed)


def _owner(row: Any) -> RunOwner:
    run_id, node, epoch, driving, live = row
    return RunOwner(run_id, node, int(epoch), bool(driving), node is not None and bool(live))
