"""Store faults heal: which failures count as one, the backoff, and
the driving set re-driving a run.

The faults are real: on SQLite the store's file, its WAL and their directory
are made immutable (``chattr +i``, root on a filesystem that supports it;
skipped elsewhere, naming why); on PostgreSQL another connection holds the
rows an append or a write check must lock while the store's statements time
out. The schedule itself runs in virtual time against a store stand-in that
refuses a given number of write checks.
"""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import child_run_id
from salvor.daemon.graphs import map_child_id
from salvor.daemon.recording._store_access import open_store_access
from salvor.daemon.runs._drivers import DriverSet
from salvor.daemon.runs._healing import Backoff, StoreHealing
from salvor.daemon.runs._runtime import Runtime
from salvor.protocol import (
    EMPTY_VIEW,
    TOOL_ERROR_KEY,
    EventKind,
    ModelCallRequested,
    RunStarted,
    RunState,
    check_batch,
    graph_from_value,
)
from salvor.store import EventStore, StoreUnavailable, store_fault
from salvor.store._errors import passes_by_itself

from tests.daemon.proxies.test_salvor_server import (
    OUTPUTS,
    children,
    delegating_script,
    helper_agent,
    salvor_agent,
    subagent_seq,
)
from tests.support.flows import tool_results, tool_use
from tests.support.runtime import agent_toml, ledger
from tests.support.scripted_provider import text_reply

# -- the backoff -----------------------------------------------------------------------------------

BACKOFF_TABLE = [
    (1, 1.0),
    (2, 2.0),
    (3, 4.0),
    (4, 8.0),
    (5, 16.0),
    (6, 32.0),
    (7, 60.0),
    (8, 60.0),
    (10**6, 60.0),
]


@pytest.mark.parametrize(("attempt", "nominal"), BACKOFF_TABLE)
def test_backoff_doubles_from_one_second_to_a_minute_with_jitter_in_the_upper_half(
    attempt, nominal
) -> None:
    backoff = Backoff()
    assert backoff.nominal(attempt) == nominal
    assert backoff.delay(attempt, 0.0) == nominal
    assert nominal / 2 < backoff.delay(attempt, 0.999) < nominal


def test_a_backoff_that_cannot_wait_is_refused() -> None:
    for bad in ({"first": 0}, {"first": 2, "ceiling": 1}, {"jitter": 1}):
        with pytest.raises(ValueError):
            Backoff(**bad)
    with pytest.raises(ValueError):
        Backoff().nominal(0)


# -- which failures are store faults ---------------------------------------------------------------


def test_a_missing_table_or_a_constraint_is_no_store_fault() -> None:
    connection = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as missing:
        connection.execute("SELECT * FROM nowhere")
    connection.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    connection.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        connection.execute("INSERT INTO t VALUES (1)")
    # SQLite names a missing table "operational": its result code tells
    # it from a busy or full database.
    assert not passes_by_itself(missing.value)
    assert not passes_by_itself(duplicate.value)
    assert not store_fault(StoreUnavailable("the store URL is empty"))


class Refusal:
    """Makes the store at ``url`` refuse writes for real, and take them again."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self._locker = None
        if self.sqlite:
            if shutil.which("chattr") is None:
                pytest.skip("chattr is not installed (install e2fsprogs)")
            path = Path(url.removeprefix("sqlite:///"))
            self.paths = [path, path.with_name(path.name + "-wal"), path.parent]
        else:
            # The store gives up waiting on a held lock within 300 ms, as on a busy server: a lock
            # timeout, not a statement timeout, so a statement slowed by a loaded machine (not
            # blocked by the lock) still runs to its end.
            self.url = url.replace("options=", "options=-clock_timeout%3D300%20", 1)

    def begin(self, *run_ids: str) -> None:
        if self.sqlite:
            done = subprocess.run(
                ["chattr", "+i", *map(str, self.paths)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                pytest.skip(
                    f"chattr +i is refused here (it needs root and a filesystem that supports it): "
                    f"{done.stderr.strip()}"
                )
            return
        import psycopg

        self._locker = psycopg.connect(
            self.url.replace("postgresql+psycopg://", "postgresql://", 1).replace(
                "-clock_timeout%3D300%20", "", 1
            )
        )
        self._locker.execute("SELECT * FROM store_meta FOR UPDATE")
        for run_id in run_ids:
            self._locker.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))

    def end(self) -> None:
        if self.sqlite:
            subprocess.run(
                ["chattr", "-i", *map(str, self.paths)], capture_output=True, check=False
            )
        elif self._locker is not None:
            self._locker.close()
            self._locker = None


@pytest.fixture
def refusal(store_url: str, tmp_path: Path):
    made = Refusal(store_url, tmp_path)
    try:
        yield made
    finally:
        made.end()


def test_a_store_that_refuses_writes_raises_a_store_fault_and_takes_writes_again(
    refusal: Refusal,
) -> None:
    with EventStore.open(refusal.url) as store:
        store.check_writable()
        refusal.begin()
        with pytest.raises(StoreUnavailable) as refused:
            store.check_writable()
        assert store_fault(refused.value), refused.value.message
        assert "does not accept writes" in refused.value.message
        refusal.end()
        store.check_writable()


# -- the schedule, in virtual time -----------------------------------------------------------------


class StandIn:
    """A store whose write check refuses ``refusals`` times, and a
    start that notes each re-drive."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.checks: list[float] = []
        self.started: list[tuple[float, str]] = []

    async def check_writable(self) -> None:
        self.checks.append(trio.current_time())
        if len(self.checks) <= self.refusals:
            raise StoreUnavailable(
                "the store at test does not accept writes: database or disk is full", transient=True
            )

    def start(self, run_id: str) -> bool:
        self.started.append((trio.current_time(), run_id))
        return True


FAULT = StoreUnavailable(
    "the store at test failed to commit an append: database or disk is full", transient=True
)


async def test_runs_are_re_driven_together_once_the_store_takes_a_write(
    autojump_clock, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor.healing")
    healing = StoreHealing(draw=lambda: 0.0)  # no jitter: the waits are the nominal ones
    store = StandIn(refusals=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(healing.heal_forever, store.check_writable, store.start)
        healing.stopped("run-a", FAULT)
        healing.stopped("run-b", FAULT)
        assert len(healing) == 2
        with trio.fail_after(60):
            while len(store.started) < 2:
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    # Checks at 1 s, then 2, 4 and 8 s after each refusal; the fourth is taken.
    assert store.checks == [1.0, 3.0, 7.0, 15.0]
    assert sorted(run for _, run in store.started) == ["run-a", "run-b"]
    assert {at for at, _ in store.started} == {15.0}
    assert "re-driving run run-a after a store error (attempt 4)" in caplog.text
    assert caplog.text.count("the store still refuses writes") == 3
    healing.settled("run-a", "rested completed")
    assert (
        "run run-a: re-driven after a store error, it got past the store on attempt 4"
        in caplog.text
    )
    # A run whose re-drive stops on the store again waits its next, longer, turn.
    healing.stopped("run-b", FAULT)
    assert healing.waiting("run-b") and len(healing) == 1


async def test_a_run_the_store_keeps_refusing_is_given_up_after_the_bound(
    autojump_clock, caplog
) -> None:
    healing = StoreHealing(give_up_after=300, draw=lambda: 0.0)
    store = StandIn(refusals=10**6)
    async with trio.open_nursery() as nursery:
        await nursery.start(healing.heal_forever, store.check_writable, store.start)
        healing.stopped("run-a", FAULT)
        with trio.fail_after(3600):
            while len(healing):
                await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert store.started == []
    assert trio.current_time() < 300 + 61
    assert "gave up re-driving run run-a after a store error" in caplog.text
    assert "`salvor resume run-a` or a restart drives it again" in caplog.text


async def test_a_run_something_else_drives_is_no_longer_waited_for(autojump_clock) -> None:
    healing = StoreHealing(draw=lambda: 0.0)
    store = StandIn(refusals=0)
    healing.stopped("run-a", FAULT)
    healing.forget("run-a")  # a resume started it
    await trio.sleep(5)
    assert await healing.heal_due(store.check_writable, store.start) == 0
    assert store.checks == [] and len(healing) == 0


# -- the driving set, over a real store ------------------------------------------------------------


async def test_a_drive_stopped_by_a_store_fault_is_driven_again_and_completes(
    store_url, refusal: Refusal, registry, clock, providers, make_agent, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor")
    provider = providers([text_reply("settled"), text_reply("settled")])
    agent = make_agent(provider)
    async with open_store_access(refusal.url) as access:
        runtime = Runtime(access, registry, clock=clock)
        run_id = await runtime.starts.start_run(agent, {"task": "one"})
        healing = StoreHealing(backoff=Backoff(first=0.05, ceiling=0.2))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                drivers = DriverSet(runtime, nursery, healing=healing)
                drivers.spawn(
                    lambda: healing.heal_forever(access.check_writable, drivers.start),
                    name="healing",
                )
                before = await runtime.reads.view(run_id)
                refusal.begin(run_id)
                drivers.start(run_id, agent)
                while not healing.waiting(run_id):
                    await trio.sleep(0.02)
                assert not drivers.driving(run_id)
                assert (
                    await runtime.reads.view(run_id)
                ).next_seq == before.next_seq  # nothing of the drive landed
                refusal.end()
                while (await runtime.reads.view(run_id)).state is not RunState.COMPLETED:
                    await trio.sleep(0.02)
                while len(healing):
                    await trio.sleep(0.02)
                drivers.cancel_all("the test is over")
    # The write check kept the re-drives from paying for a model call
    # whose answer could not be kept.
    assert provider.call_count == 1
    assert f"re-driving run {run_id} after a store error (attempt" in caplog.text
    assert f"run {run_id}: re-driven after a store error, it got past the store" in caplog.text


async def test_a_drive_stopped_for_another_reason_is_not_retried(runtime) -> None:
    """A run whose agent this store does not hold: its drive fails for good, and is left alone."""
    orphan = "00000000-0000-4000-8000-000000000002"
    await runtime.access.append(
        orphan,
        [
            RunStarted(agent_def_hash="sha256:" + "f" * 64, input=None),
            ModelCallRequested(request_hash="sha256:" + "0" * 64),
        ],
        EMPTY_VIEW,
    )
    healing = StoreHealing()
    async with trio.open_nursery() as nursery:
        drivers = DriverSet(runtime, nursery, healing=healing)
        drivers.start(orphan)
    assert not drivers.driving(orphan) and len(healing) == 0


# -- composed runs: the tree heals from its root ---------------------------------------------------

BOUND = 30.0  # seconds any one wait of a composed test may take before it fails


async def until(what: str, check) -> None:
    with trio.move_on_after(BOUND):
        while not await check():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"{what} did not happen within {BOUND:g}s")


def refunder_script(held: list[int], release: threading.Event, hold: str):
    """A refunder's model: refund the invoice its task names, then say so. Its answer after the
    refund of invoice ``hold`` waits for ``release`` (the store is made to refuse writes meanwhile),
    so the refunder's drive stops on the store fault recording it."""

    def task(call) -> str:
        return call.request["messages"][0]["content"][0]["text"]

    def script(call):
        invoice = re.search(r"INV-\d+", task(call)).group(0)
        if not tool_results(call):
            return tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": 500})
        return text_reply(f"refunded {invoice}")

    def on_call(call) -> None:
        if tool_results(call) and hold in task(call):
            held.append(call.index)
            release.wait(BOUND)

    return script, on_call


async def fault_under_a_child(
    refusal: Refusal,
    runtime: Runtime,
    root: str,
    find_child: Callable[[], Awaitable[str]],
    held: list[int],
    release: threading.Event,
    agent=None,
) -> str:
    """Drive ``root`` until ``child``'s answer is held at the provider, make the store refuse
    writes, let the answer through, and check the tree waits to heal as its root (the child's
    drive is its root's, so only the root is counted); then let the store take writes again and
    wait for the healer to bring the root to completion, with nobody resuming anything.

    Returns the child's run id (``find_child``'s, asked once the child's answer is held)."""
    access = runtime.access
    healing = StoreHealing(backoff=Backoff(first=0.05, ceiling=0.2))
    async with trio.open_nursery() as nursery:
        drivers = DriverSet(runtime, nursery, healing=healing)
        drivers.spawn(
            lambda: healing.heal_forever(access.check_writable, drivers.start), name="healing"
        )
        drivers.start(root, agent)

        async def answer_held() -> bool:
            return bool(held)

        async def root_waits_to_heal() -> bool:
            return healing.waiting(root)

        await until("the child's answer reaching the provider", answer_held)
        child = await find_child()
        refusal.begin(root, child)
        release.set()
        await until(
            "the root's drive stopping on the store fault, to be healed", root_waits_to_heal
        )
        assert len(healing) == 1 and not healing.waiting(child)
        assert not drivers.driving(root) and not drivers.driving(child)
        refusal.end()

        async def healed() -> bool:
            view = await runtime.reads.view(root)
            return view.state is RunState.COMPLETED and not len(healing)

        await until("the root completing once the store takes writes", healed)
        drivers.cancel_all("the test is over")
    return child


def refunds(effects_path: Path) -> list[str]:
    return sorted(
        r["input"]["invoice_id"] for r in ledger(effects_path) if r["tool"] == "issue_refund"
    )


async def test_a_store_fault_under_a_map_item_heals_its_graph_run_from_the_root(
    refusal: Refusal, registry, clock, providers, make_agent, effects_path, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor")
    held: list[int] = []
    release = threading.Event()
    script, on_call = refunder_script(held, release, hold="INV-2")
    provider = providers(script, on_call=on_call)
    agent = make_agent(provider, tools=["issue_refund"])
    graph = graph_from_value(
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "concurrency": 1,
                    "body": {"kind": "agent", "agent": agent.agent_def_hash, "input": "$item"},
                },
                {"id": "tally", "kind": "fold", "over": "$nodes.each", "reducer": "count"},
            ],
            "edges": [{"from": "each", "to": "tally"}],
        }
    )
    try:
        async with open_store_access(refusal.url) as access:
            runtime = Runtime(access, registry, clock=clock)
            await runtime.definitions.register_agent(agent)
            await runtime.definitions.register_graph(graph)
            items = [{"invoice_id": "INV-1"}, {"invoice_id": "INV-2"}]
            run_id = await runtime.starts.start_graph_run(graph, items)

            async def item_1() -> str:
                return map_child_id(run_id, "each", 1)

            await fault_under_a_child(refusal, runtime, run_id, item_1, held, release)
            view = await runtime.reads.view(run_id)
            assert view.detail["output"] == {"tally": 2}
            for index in (0, 1):
                item = await runtime.reads.view(map_child_id(run_id, "each", index))
                assert item.state is RunState.COMPLETED
            log = await runtime.reads.log(run_id)
            check_batch(EMPTY_VIEW, log)
            recorded = [e.event.index for e in log if e.event.KIND is EventKind.MAP_ITEM_COMPLETED]
            assert sorted(recorded) == [0, 1]
    finally:
        release.set()
    # Each invoice refunded once; only the answer the store refused was asked for again.
    assert refunds(effects_path) == ["INV-1", "INV-2"]
    assert provider.call_count == 5
    assert "drive crashed" not in caplog.text
    assert f"re-driving run {run_id} after a store error (attempt" in caplog.text


async def test_a_store_fault_under_a_subagent_s_child_heals_the_parent_and_records_no_error(
    refusal: Refusal, registry, clock, providers, make_agent, effects_path, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor")
    held: list[int] = []
    release = threading.Event()
    script, on_call = refunder_script(held, release, hold="INV-3")
    child_provider = providers(script, on_call=on_call)
    refunder = parse_definition(
        'name = "refunder"\n' + agent_toml(child_provider.base_url, tools=["issue_refund"]),
        "toml",
        known_tools=registry.names(),
    )
    provider = providers(
        [tool_use("subagent", {"agent": "refunder", "task": "refund INV-3"}), text_reply("done")]
    )
    parent = make_agent(provider, extra='flow_tools = ["subagent"]')
    try:
        async with open_store_access(refusal.url) as access:
            runtime = Runtime(access, registry, clock=clock)
            await runtime.definitions.register_agent(refunder)
            run_id = await runtime.starts.start_run(parent, "refund what is owed")

            async def the_child() -> str:
                return child_run_id(run_id, 3)

            child = await fault_under_a_child(
                refusal, runtime, run_id, the_child, held, release, parent
            )
            assert (await runtime.reads.view(run_id)).status() == {
                "state": "completed",
                "output": "done",
            }
            assert (await runtime.reads.view(child)).state is RunState.COMPLETED
            log = await runtime.reads.log(run_id)
            check_batch(EMPTY_VIEW, log)
            # The subagent call completed once, with the child's answer: the store fault under
            # the child was never recorded as the call's error.
            completions = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
            assert [c.seq for c in completions] == [3]
            assert TOOL_ERROR_KEY not in completions[0].output
            assert completions[0].output["summary"] == "refunded INV-3"
    finally:
        release.set()
    assert refunds(effects_path) == ["INV-3"]
    assert provider.call_count == 2 and child_provider.call_count == 3
    assert "drive crashed" not in caplog.text
    assert f"re-driving run {run_id} after a store error (attempt" in caplog.text


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_store_fault_under_a_process_parent_s_child_heals_the_process_parent(
    refusal: Refusal, registry, clock, providers, upstream_env, tmp_path, caplog
) -> None:
    """The subagent call crosses salvor's MCP server (a process agent's lane): the fault under
    the child stops the process and its drive as a store fault, and the healer starts both again."""
    caplog.set_level(logging.INFO, "salvor")
    held: list[int] = []
    release = threading.Event()
    child_finish = {"status": "complete", "summary": "found it", "colour": "blue", "count": 3}

    def hold(call) -> None:
        held.append(call.index)
        release.wait(BOUND)

    child_provider = providers(lambda call: tool_use("finish", child_finish), on_call=hold)
    provider = providers(delegating_script())
    upstream_env(provider)
    parent = salvor_agent(tmp_path, extra=OUTPUTS)
    try:
        async with open_store_access(refusal.url) as access:
            runtime = Runtime(access, registry, clock=clock)
            await runtime.definitions.register_agent(
                helper_agent(runtime, child_provider, extra=OUTPUTS)
            )
            run_id = await runtime.starts.start_run(parent, "delegate it")

            async def the_child() -> str:
                (found,) = await children(runtime, run_id)
                return found

            child = await fault_under_a_child(
                refusal, runtime, run_id, the_child, held, release, parent
            )
            view = await runtime.reads.view(run_id)
            assert view.detail["output"]["summary"] == "helper said: found it"
            assert (await runtime.reads.view(child)).state is RunState.COMPLETED
            log = await runtime.reads.log(run_id)
            check_batch(EMPTY_VIEW, log)
            assert child == child_run_id(run_id, subagent_seq(log))
            completions = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
            called = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
            # Each call of the lane completed once, none of them with an error.
            assert len(completions) == len(called)
            assert not any(TOOL_ERROR_KEY in c.output for c in completions)
    finally:
        release.set()
    assert child_provider.call_count == 2
    assert "drive crashed" not in caplog.text
    assert f"re-driving run {run_id} after a store error (attempt" in caplog.text
