"""One daemon's Prometheus registry: the counters and histograms rooms count into while the daemon
works, and the values only a scrape reads (``Readings``).

Rules of this module:

* One ``CollectorRegistry`` per ``DaemonMetrics``, never the library's process-wide ``REGISTRY``:
  two daemons in one interpreter (the tests) keep their counts apart.
* Label values are this daemon's own bounded vocabulary (run states, wire formats, MCP
  transports), never a string a caller or a server sent: no run id, no server name.
* Counting is a call on a pre-built child (``observe_*``): no label lookup by caller text, no
  allocation a commit would pay for. The store's writer thread counts too; prometheus_client's
  values are safe to touch from any thread.
* A worker of ``salvor serve --workers N`` labels every series ``worker="i"`` (added as a scrape
  renders, never counted per label): the workers answer on one address, so the label is how
  their series stay apart.
* What the daemon can only read at scrape time (runs per state, claims, drivers, subscribers) is
  handed to ``exposition`` by the scraper, which read it off the trio thread where it blocks:
  the collector itself reads nothing.
* Which node a scrape came from (issue 30, item 5) is one series, ``salvor_node_info{node,
  node_id} 1``, never a label on every series: Prometheus labels each scraped series with the
  target's ``instance`` already, a node's id changes with each start (a label on every series
  would start every series afresh at each restart), and a query that wants the name joins it on
  (``... * on(instance) group_left(node) salvor_node_info``). The cluster's counters (leases,
  takeovers, fenced appends, the change feed) are counted where those events happen.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from salvor.protocol import RunState

# prometheus_client is imported where a daemon builds or renders its instruments, not where a
# room imports this one: every `salvor` command imports the rooms (a tenth of a second of CPU
# for the library) and only `salvor serve` counts.
if TYPE_CHECKING:
    from prometheus_client import Histogram
    from prometheus_client.core import Metric

# Events per group commit: one append is a few events, a group at most 256 appends.
GROUP_EVENT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# One transaction from BEGIN to COMMIT, fsync included: sub-millisecond on a warm SQLite in
# memory, tens of milliseconds on a slow disk or a remote PostgreSQL.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A model call through the proxy is answered from the log in a millisecond or takes the
# provider's minutes; an MCP call spans the same range.
CALL_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# How the daemon reaches an MCP server: a child process's stdio, or streamable HTTP.
MCP_TRANSPORTS = ("stdio", "http")
# The fan-out's two kinds of subscriber.
STREAM_TRANSPORTS = ("sse", "ws")


@dataclass(frozen=True, slots=True, kw_only=True)
class Readings:
    """What one scrape read of the daemon's state just before rendering."""

    # Runs per state as the store's ``runs`` table has them; a state left out has none.
    runs_by_state: Mapping[str, int] = field(default_factory=dict)
    # Idempotency identities an intent holds open.
    claims_held: int = 0
    drivers_live: int = 0
    # Live subscriptions of the fan-out, by transport ("sse", "ws").
    stream_subscribers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReading:
    """This node as a scrape sees it, read from memory on the trio thread (issue 30, item 5)."""

    # ``--node-name`` (the host name by default), and the id it holds its lease under now (a new
    # one after each start, and after the store said its lease had lapsed).
    name: str
    node_id: str
    # Runs this node's drives hold in the store now (claimed, not yet let go).
    runs_owned: int = 0
    # Whether its lease lets it start effects now (False: it lapsed, or is about to).
    lease_open: bool = True


class _ScrapeTime:
    """The families whose values a scrape hands in (``Readings``); empty between scrapes."""

    def __init__(self) -> None:
        self.readings: Readings | None = None
        # What tells this node's own state at a scrape; None: a daemon with no node (tests).
        self.node: Callable[[], NodeReading] | None = None

    def describe(self) -> list[Metric]:
        # The names alone, so registering reads nothing.
        return list(self._families(Readings(), NodeReading(name="", node_id="")))

    def collect(self) -> Iterator[Metric]:
        if self.readings is not None:
            yield from self._families(self.readings, None if self.node is None else self.node())

    @staticmethod
    def _families(readings: Readings, node: NodeReading | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        if node is not None:
            yield InfoMetricFamily(
                "salvor_node",
                "The node that answered this scrape: its --node-name and its id now.",
                value={"node": node.name, "node_id": node.node_id},
            )
            yield GaugeMetricFamily(
                "salvor_runs_owned",
                "Runs this node's drives hold in the store now (claimed and not let go).",
                value=node.runs_owned,
            )
            yield GaugeMetricFamily(
                "salvor_lease_open",
                "1 while this node's lease lets it start effects; 0 once it lapsed or is lapsing.",
                value=1 if node.lease_open else 0,
            )

        runs = GaugeMetricFamily(
            "salvor_runs", "Runs in the store by state (its runs table).", labels=["state"]
        )
        for state in RunState:
            # Every state, so a series drops to 0 instead of vanishing; a stored string that is no
            # state (none is) is not a label value this daemon chose, and is left out.
            runs.add_metric([state.value], readings.runs_by_state.get(state.value, 0))
        yield runs
        yield GaugeMetricFamily(
            "salvor_reconciliations_open",
            "Runs parked on a write whose outcome nobody knows (needs_reconciliation).",
            value=readings.runs_by_state.get(RunState.NEEDS_RECONCILIATION.value, 0),
        )
        yield GaugeMetricFamily(
            "salvor_claims_held",
            "Idempotency identities an open intent holds (claimed, not settled).",
            value=readings.claims_held,
        )
        yield GaugeMetricFamily(
            "salvor_drivers_live", "Runs a driver in this daemon drives now.", readings.drivers_live
        )
        subscribers = GaugeMetricFamily(
            "salvor_stream_subscribers",
            "Live event subscriptions of this daemon's fan-out, by transport.",
            labels=["transport"],
        )
        for transport in STREAM_TRANSPORTS:
            subscribers.add_metric([transport], readings.stream_subscribers.get(transport, 0))
        yield subscribers


class DaemonMetrics:
    """One daemon's instruments and the registry ``GET /metrics`` renders.

    ``worker``: the index of a worker of ``salvor serve --workers N``, labelled on every series;
    None for a daemon of one process (no label).
    """

    def __init__(self, *, worker: int | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self._worker = None if worker is None else str(worker)
        # Registered in the order a scrape renders them.
        self._count_commits()
        self._count_calls()
        self._count_leases()
        self._count_ownership()
        self._scrape = _ScrapeTime()
        self.registry.register(self._scrape)

    def _count_commits(self) -> None:
        """The store's writer: events, appends and transactions committed, and how long each
        transaction took."""
        from prometheus_client import Counter, Histogram

        registry = self.registry
        self.appends = Counter("salvor_appends", "Events committed to run logs.", registry=registry)
        self.commits = Counter(
            "salvor_commits", "Store transactions that committed appends.", registry=registry
        )
        # Against ``salvor_commits``: how many appends share a transaction (group commit).
        self.append_batches = Counter(
            "salvor_append_batches",
            "Appends committed (one run's batch of events each, made durable before what it "
            "records starts).",
            registry=registry,
        )
        self.group_commit_events = Histogram(
            "salvor_group_commit_events",
            "Events per committed append transaction (group commit).",
            buckets=GROUP_EVENT_BUCKETS,
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "salvor_commit_seconds",
            "Seconds per committed append transaction, BEGIN to COMMIT.",
            buckets=COMMIT_BUCKETS,
            registry=registry,
        )

    def _count_calls(self) -> None:
        """The calls the daemon makes for its agents: model calls through the loopback proxy, by
        wire, and MCP tool calls, by transport."""
        from prometheus_client import Histogram

        self.proxy_call_seconds = Histogram(
            "salvor_proxy_call_seconds",
            "Seconds per model call a process agent made through the loopback proxy, by wire.",
            labelnames=["wire"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.mcp_call_seconds = Histogram(
            "salvor_mcp_call_seconds",
            "Seconds per MCP tools/call the daemon sent a server, by transport.",
            labelnames=["transport"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        # Children made now, so each transport shows (at 0) before its first call.
        self._mcp_by_transport = {
            transport: self.mcp_call_seconds.labels(transport=transport)
            for transport in MCP_TRANSPORTS
        }
        self._proxy_by_wire: dict[str, Histogram] = {}

    # -- many nodes over one store (issue 30, item 5): what an operator of a cluster watches --

    def _count_leases(self) -> None:
        """This node's lease: its renewals, their failures, and the times it ran out."""
        from prometheus_client import Counter

        registry = self.registry
        self.lease_renewals = Counter(
            "salvor_lease_renewals",
            "Renewals of this node's lease the store took.",
            registry=registry,
        )
        self.lease_renewal_failures = Counter(
            "salvor_lease_renewal_failures",
            "Renewals of this node's lease that failed (the store could not be reached or erred).",
            registry=registry,
        )
        self.lease_deadline_passes = Counter(
            "salvor_lease_deadline_passes",
            "Times this node's lease ran out on its own clock unrenewed: it stopped starting "
            "effects and cut every drive it held.",
            registry=registry,
        )
        self.lease_lapses = Counter(
            "salvor_lease_lapses",
            "Times the store refused this node's renewal because its lease had lapsed there (a "
            "peer may have taken its runs; the node registered again under a new id).",
            registry=registry,
        )

    def _count_ownership(self) -> None:
        """Runs changing hands between nodes, and what this node hears of the others' commits."""
        from prometheus_client import Counter

        registry = self.registry
        self.takeovers = Counter(
            "salvor_takeovers",
            "Runs this node claimed while another node was still marked driving them (that node "
            "died, or lost its lease, mid-drive).",
            registry=registry,
        )
        self.appends_fenced = Counter(
            "salvor_appends_fenced",
            "Appends the store refused because another node had claimed the run since this "
            "node's drive took it (nothing of them was written).",
            registry=registry,
        )
        self.feed_notices = Counter(
            "salvor_change_feed_notices",
            "Changes to the store this node's change feed heard: PostgreSQL notices of other "
            "processes' commits; on SQLite, changes of the file's data_version (any commit).",
            registry=registry,
        )
        self.feed_reconnects = Counter(
            "salvor_change_feed_reconnects",
            "Times the change feed listened (or watched) again after it lost its connection.",
            registry=registry,
        )

    def read_node(self, reading: Callable[[], NodeReading]) -> None:
        """Name what tells this node's state at each scrape (called on the trio thread, from
        memory only): ``salvor_node_info``, ``salvor_runs_owned``, ``salvor_lease_open``."""
        self._scrape.node = reading

    def observe_commit(self, events: int, seconds: float, appends: int = 1) -> None:
        """One append transaction committed (the store's ``commit_observer``; any thread)."""
        self.appends.inc(events)
        self.commits.inc()
        self.append_batches.inc(appends)
        self.group_commit_events.observe(events)
        self.commit_seconds.observe(seconds)

    def proxy_wires(self, wires: Iterable[str]) -> None:
        """Name the wire formats the proxy speaks: the only ``wire`` label values it counts."""
        for wire in wires:
            self._proxy_by_wire[wire] = self.proxy_call_seconds.labels(wire=wire)

    def observe_proxy_call(self, wire: str, seconds: float) -> None:
        """One model call through the proxy, answered (from the log or upstream) or refused."""
        child = self._proxy_by_wire.get(wire)
        if child is not None:  # a wire nobody named is not a label value
            child.observe(seconds)

    def observe_mcp_call(self, transport: str, seconds: float) -> None:
        """One ``tools/call`` to an MCP server, answered or not."""
        child = self._mcp_by_transport.get(transport)
        if child is not None:
            child.observe(seconds)

    def exposition(self, readings: Readings) -> bytes:
        """The registry in the Prometheus text format, with ``readings`` as the scrape-time values.

        Synchronous and reads nothing itself; call it on the trio thread (the ``Readings`` must
        come from the same thread, so two scrapes never mix theirs).
        """
        from prometheus_client import generate_latest

        self._scrape.readings = readings
        try:
            if self._worker is None:
                return generate_latest(self.registry)
            return generate_latest(_Labelled(self.registry, "worker", self._worker))
        finally:
            self._scrape.readings = None


class _Labelled:
    """A registry's families as a scrape renders them, each sample with one more label."""

    def __init__(self, registry, name: str, value: str) -> None:
        self._registry = registry
        self._name = name
        self._value = value

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [
                sample._replace(labels={**sample.labels, self._name: self._value})
                for sample in family.samples
            ]
            yield family


_COUNTING_INTO: contextvars.ContextVar[DaemonMetrics | None] = contextvars.ContextVar(
    "salvor_metrics", default=None
)


def counting_into(metrics: DaemonMetrics | None) -> contextvars.Token:
    """Make ``metrics`` the instruments of the current task and every task it starts from now on
    (trio copies the context at spawn). Returns the token ``stop_counting`` takes back.

    For code too deep in a drive to be handed the instruments (an MCP session a built-in agent's
    tool opens): the daemon sets it once, at the root of its tasks, so two daemons in one
    interpreter each count into their own.
    """
    return _COUNTING_INTO.set(metrics)


def stop_counting(token: contextvars.Token) -> None:
    _COUNTING_INTO.reset(token)


def current_metrics() -> DaemonMetrics | None:
    """The instruments of the daemon this task belongs to; None outside one (a CLI run)."""
    return _COUNTING_INTO.get()
