"""The `salvor` command line: drive and inspect runs in a store, no server needed.

Exit status: 0 when the command did what it was asked (a run that rests
suspended, sleeping, over budget or awaiting reconciliation is a success: it
is parked on purpose), 3 when a driven run ended failed, 1 for a refusal or an
error (one sentence on stderr, nothing recorded), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import trio
from salvor import __version__
from salvor.protocol import (
    CodedError,
    ForkPlan,
    Graph,
    InvalidGraph,
    RecordedWrite,
    RunState,
    RunView,
    encode_envelope,
    names_files,
    parse_graph_json,
    parse_graph_yaml,
)
from salvor.store import (
    Holder,
    StoreLocks,
    default_store_url,
    normalize_store_url,
    sqlite_path,
)

from ..agents import AgentDefinition, DefinitionError, load_definition
from ..client_runs import ClientTool, load_declarations
from ..flows import caller_labels
from ..graphs import FlowFiles, captured_baselines
from ..processes import make_undumpable, sweep_orphans
from ..recording import claim_wait_seconds, open_store_access
from ..runs import (
    MISSING,
    ResumeOutcome,
    Runtime,
    driving_run,
    own_store,
)
from ..tools import demo_registry
from ._arguments import (
    Parser,
    add_label_option,
    json_value,
    key_value,
    run_limit,
    run_state,
    run_uuid,
)
from ._baselines import write_baselines
from ._doctor import add_parser as add_doctor_parser
from ._doctor import doctor_main
from ._errors import CliError, UsageError
from ._graph import add_parser as add_graph_parser
from ._graph import collect_flow_files, read_graph, unreadable
from ._graph import validate_main as graph_validate_main
from ._hints import (
    UNKNOWN_ADDRESS,
    daemon_address,
    resume_hint,
    serving_daemon,
    wake_hint,
)
from ._pipes import readers_may_leave
from ._remote_flow import remote_main
from ._render import describe, describe_reconciliation
from ._serve_command import add_serve_parser, serve_main
from ._wording import CLI_WORDING

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_RUN_FAILED = 0, 1, 2, 3

# Which store lock each command takes (_store_owner): the commands that drive
# runs a daemon may be driving share it (so they refuse beside `salvor
# serve`), the ones that start a new run take only that run's lock (they work
# beside a daemon), the rest take none (reads, and single appends the store's
# seq guard keeps safe). Only `run`, `graph run` and `serve` may create a store.
SHARES_STORE = {
    "resume": True,
    "wake": True,
    "run": None,
    "rerun": None,
    "graph": None,
    "fork": None,
}
CREATES_STORE = ("run", "serve", "graph")
# The resting states a sentence names the next step for.
_PARKED = (RunState.SUSPENDED, RunState.SLEEPING, RunState.BUDGET_EXCEEDED)


def _labels(pairs: list[tuple[str, str]]) -> dict[str, str] | None:
    """The ``--label`` pairs as a run's labels; each was checked alone as it was parsed, the
    set (how many, how large together) is checked here, in the API's words.

    Raises:
        UsageError: the set breaks the label rules; nothing was recorded.
    """
    if not pairs:
        return None
    try:
        return caller_labels(dict(pairs))
    except CodedError as exc:
        raise UsageError(exc.message) from None


def _out(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False), flush=True)


class Cli:
    def __init__(self, args: argparse.Namespace, url: str, locks: StoreLocks | None = None) -> None:
        self.args = args
        self.url = url
        self.locks = locks
        self.json = getattr(args, "json", False)
        self.progress = sys.stderr.isatty() and not self.json

    async def _daemon(self) -> str | None:
        """The daemon serving the store now (``serving_daemon``), for the next step a sentence
        names; asked when a sentence needs it, since a daemon may start while a run drives."""
        return await serving_daemon(self.url, self.locks)

    def _on_record(self, envelopes) -> None:
        if self.progress:
            for envelope in envelopes:
                print(describe(envelope), file=sys.stderr, flush=True)

    async def _report(self, run_id: str, view: RunView) -> int:
        status = view.status_at(datetime.now(UTC))
        if self.json:
            _out({"run": run_id, **view.replay_json(), "status": status})
        else:
            print(await self._sentence(run_id, view), flush=True)
        return EXIT_RUN_FAILED if view.state is RunState.FAILED else EXIT_OK

    async def _sentence(self, run_id: str, view: RunView) -> str:
        """Where the run rests, and for a parked run the step that continues it from here."""
        d, s = view.detail, view.state
        if s in _PARKED:
            daemon = await self._daemon()
        if s is RunState.COMPLETED:
            return f"run {run_id} completed: {json.dumps(d['output'], ensure_ascii=False)}"
        if s is RunState.FAILED:
            return f"run {run_id} failed: {d['error']}"
        if s is RunState.ABANDONED:
            return f"run {run_id} abandoned" + (f": {d['reason']}" if d.get("reason") else "")
        if s is RunState.SUSPENDED:
            who = "an external signal" if d.get("kind") == "signal" else "a person"
            return (
                f"run {run_id} suspended, waiting on {who}: {d['reason']}; resume it with "
                f"{resume_hint(run_id, daemon, 'JSON')}, the JSON matching "
                f"{json.dumps(d['input_schema'])}"
            )
        if s is RunState.SLEEPING:
            return f"run {run_id} sleeping until {d['wake_at']}; {wake_hint(run_id, daemon)}"
        if s is RunState.BUDGET_EXCEEDED:
            b = d["budget"]
            extend = resume_hint(run_id, daemon, '{"extend_by": N}')
            return (
                f"run {run_id} stopped at its {b['kind']} budget ({d['observed']} of "
                f"{b['limit']}); extend it with {extend}"
            )
        if s is RunState.NEEDS_RECONCILIATION:
            p = view.pending
            return (
                f"run {run_id} needs reconciliation: the write {p.tool} (seq {p.seq}) may or may "
                f"not have happened; check, then `salvor resolve {run_id} --output JSON`"
            )
        return f"run {run_id} is {s.value}"

    async def _drive_and_report(
        self, runtime: Runtime, run_id: str, agent: AgentDefinition | None = None
    ) -> int:
        view = await runtime.drive(run_id, agent=agent, on_record=self._on_record)
        return await self._report(run_id, view)

    # -- commands -------------------------------------------------------------

    async def cmd_run(self, runtime: Runtime) -> int:
        labels = _labels(self.args.label)
        agent = await self._agent_from(runtime, self.args.agent)
        # The run lock is taken before the run exists: a daemon starting
        # meanwhile never sees it unlocked and interrupted.
        run_id = self.args.run_id or str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id = await runtime.starts.start_run(
                agent, self.args.input, labels=labels, run_id=run_id
            )
            if self.json:
                _out({"run": run_id})
            else:
                print(run_id, flush=True)
            return await self._drive_and_report(runtime, run_id, agent)

    async def cmd_graph(self, runtime: Runtime) -> int:
        """``salvor graph run``: the document and its agents stored, the run started and driven."""
        # Checked before anything is stored: a refused label leaves the store as it was.
        labels = _labels(self.args.label)
        try:
            graph = await read_graph(self.args.file)
        except OSError as exc:
            raise CliError(unreadable(self.args.file, exc)) from None
        except InvalidGraph as exc:
            raise CliError(
                f"{self.args.file} is not a valid graph document ({len(exc.errors)} error(s)); "
                f"`salvor graph validate {self.args.file}` lists them"
            ) from None
        for source in self.args.agent:
            await runtime.definitions.register_agent(await self._agent_from(runtime, source))
        files = None
        update = self.args.update_baselines
        if names_files(graph.nodes):
            files = await collect_flow_files(self.args.file, update_baselines=update)
        elif update:
            raise UsageError(f"--update-baselines: {self.args.file} has no snapshot node")
        else:
            await runtime.definitions.register_graph(graph)
        run_id = self.args.run_id or str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            if files is not None:
                run_id = await self._start_flow(runtime, files, labels, run_id)
            else:
                run_id = await runtime.starts.start_graph_run(
                    graph, self.args.input, labels=labels, run_id=run_id
                )
            if self.json:
                _out({"run": run_id})
            else:
                print(run_id, flush=True)
            code = await self._drive_and_report(runtime, run_id)
        if files is not None and update:
            writes = await captured_baselines(runtime.reads, runtime.definitions.load_graph, run_id)
            refused = await trio.to_thread.run_sync(write_baselines, files, writes)
            if refused:
                raise CliError("; ".join(refused))
        return code

    async def _start_flow(
        self, runtime: Runtime, files: FlowFiles, labels: dict | None, run_id: str
    ) -> str:
        """Start a run of the flow file: the same pre-check and stored files a daemon gives a
        flow sent over a link (its members found by key, never re-read from disk)."""
        try:
            return await runtime.starts.start_flow_run(
                files, self.args.input, labels=labels, run_id=run_id
            )
        except InvalidGraph as exc:
            raise CliError(
                f"{self.args.file} does not pass the flow check ({len(exc.errors)} error(s), "
                f"the first: {exc.errors[0].message}); `salvor graph validate "
                f"{self.args.file}` lists them"
            ) from None

    async def _agent_from(self, runtime: Runtime, source: str) -> AgentDefinition:
        if source.startswith("sha256:"):
            return await runtime.definitions.load_agent(source)
        try:
            agent = load_definition(source, known_tools=runtime.kit.registry.names())
        except DefinitionError as exc:
            raise CliError(f"{source}: {exc}") from None
        await runtime.definitions.build_agent(agent)
        return agent

    async def cmd_rerun(self, runtime: Runtime) -> int:
        labels = _labels(self.args.label)
        origin = self.args.run
        if self.args.agent is not None:
            agent = await self._agent_from(runtime, self.args.agent)
        else:
            agent = await runtime.definitions.load_agent(
                (await runtime.reads.view(origin)).agent_def_hash
            )
        run_id = str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id = await runtime.starts.start_run(
                agent, None, labels=labels, replay_of=origin, run_id=run_id
            )
            if self.json:
                _out({"run": run_id, "replay_of": origin})
            else:
                print(run_id, flush=True)
            return await self._drive_and_report(runtime, run_id, agent)

    async def cmd_resume(self, runtime: Runtime) -> int:
        run_id = self.args.run
        async with driving_run(self.locks, run_id):
            decision = await runtime.control.resume(run_id, self.args.input)
            if decision.outcome is ResumeOutcome.FINISHED:
                return await self._report(run_id, decision.view)
            # A process agent this run's earlier driver left running (that driver
            # was killed) must not run on beside the copy this drive starts.
            await sweep_orphans(runtime.access.store.url, run_id)
            return await self._drive_and_report(runtime, run_id)

    async def cmd_resolve(self, runtime: Runtime) -> int:
        run_id = self.args.run
        view = await runtime.control.resolve(
            run_id, self.args.output, _declarations(self.args.client_tool)
        )
        return await self._resolved(run_id, view, "write resolved")

    async def _resolved(self, run_id: str, view: RunView, what: str) -> int:
        if self.json:
            _out({"run": run_id, "resolved": True, "status": view.status()})
        else:
            daemon = await self._daemon()
            # With no daemon on the store now, the next one to start drives it on by itself.
            later = (
                ""
                if daemon is not None
                else " (as a daemon serving this store does when it next starts)"
            )
            print(
                f"run {run_id}: {what}; {resume_hint(run_id, daemon)} continues it{later}",
                flush=True,
            )
        return EXIT_OK

    async def cmd_reconcile(self, runtime: Runtime) -> int:
        output, not_landed = self.args.output, self.args.not_landed
        declarations = _declarations(self.args.client_tool)
        if self.args.run is None:
            if output is not MISSING or not_landed:
                raise UsageError(
                    "--output and --not-landed settle one run; name it: "
                    "`salvor reconcile RUN --output JSON` or `salvor reconcile RUN --not-landed`"
                )
            page, _ = await runtime.reads.reconciliations(declarations)
            for item in page:
                if self.json:
                    _out(item.to_json())
                else:
                    print(describe_reconciliation(item.to_json()), end="\n\n", flush=True)
            if not page and not self.json:
                print("no run is parked on a write of unknown outcome", flush=True)
            return EXIT_OK
        run_id = self.args.run
        if (output is MISSING) == (not not_landed):
            raise UsageError(
                f"give exactly one of --output JSON (what the write returned) and --not-landed "
                f"(it did not happen) to settle run {run_id}"
            )
        if not_landed:
            view = await runtime.control.resolve(run_id, MISSING, declarations, not_landed=True)
            return await self._resolved(
                run_id, view, "the write is recorded as not landed, a failed call the model is told"
            )
        view = await runtime.control.resolve(run_id, output, declarations)
        return await self._resolved(run_id, view, "write resolved")

    async def cmd_abandon(self, runtime: Runtime) -> int:
        run_id = self.args.run
        seq, view = await runtime.control.abandon(run_id, self.args.reason)
        if self.json:
            _out({"run": run_id, "abandoned": True, "appended_seq": seq, "status": view.status()})
        else:
            print(await self._sentence(run_id, view), flush=True)
        return EXIT_OK

    async def cmd_wake(self, runtime: Runtime) -> int:
        due = await runtime.reads.due_runs()
        worst = EXIT_OK
        for run_id in due:
            try:
                async with driving_run(self.locks, run_id):
                    decision = await runtime.control.resume(run_id)
                    code = (
                        await self._drive_and_report(runtime, run_id)
                        if decision.outcome is ResumeOutcome.DRIVING
                        else await self._report(run_id, decision.view)
                    )
            except CodedError as exc:
                # One bad run does not stop the sweep.
                print(
                    f"salvor: run {run_id} not woken: {exc.sentence(CLI_WORDING)}",
                    file=sys.stderr,
                    flush=True,
                )
                code = EXIT_ERROR
            worst = max(worst, code)
        if not due and not self.json:
            print("no sleeping run is due", flush=True)
        return worst

    async def cmd_runs(self, runtime: Runtime) -> int:
        page, _ = await runtime.reads.list_runs(
            state=self.args.state, label=self.args.label, limit=self.args.limit
        )
        if self.json:
            _out({"runs": [summary.to_json() for summary in page]})
            return EXIT_OK
        for summary in page:
            state = summary.state or "unreadable"
            print(
                f"{summary.run_id}  {state:<21} {summary.event_count:>6} events  "
                f"last {summary.last_recorded_at}"
            )
        return EXIT_OK

    async def cmd_history(self, runtime: Runtime) -> int:
        for envelope in await runtime.reads.log(self.args.run):
            print(encode_envelope(envelope) if self.json else describe(envelope))
        return EXIT_OK

    async def cmd_log(self, runtime: Runtime) -> int:
        """``salvor log RUN``: a line per event, then where the run rests; with ``--json``, an
        object per event (seq, recorded_at, kind, its line), then the run's status."""
        run_id = self.args.run
        log = await runtime.reads.log(run_id)
        for envelope in log:
            line = describe(envelope)
            if self.json:
                _out(
                    {
                        "seq": envelope.seq,
                        "recorded_at": envelope.recorded_at,
                        "kind": envelope.event.KIND.value,
                        "line": line,
                    }
                )
            else:
                print(line)
        view = await runtime.reads.view(run_id)
        if self.json:
            _out({"run": run_id, "status": view.status_at(datetime.now(UTC))})
        else:
            print(await self._sentence(run_id, view))
        return EXIT_OK

    async def cmd_fork(self, runtime: Runtime) -> int:
        origin = self.args.run
        graph = await _graph_file(self.args.graph) if self.args.graph is not None else None
        acknowledged = self.args.acknowledge_writes
        plan = await runtime.forks.plan_fork(
            origin, self.args.from_node, acknowledged or (), document=graph
        )
        if acknowledged is None:
            plan = dataclasses.replace(plan, acknowledged=tuple(w.seq for w in plan.writes))
        if self.args.dry_run:
            return self._fork_plan(plan)
        if not plan.would_proceed and not self.json:
            for write in plan.unacknowledged:
                print(_write_line(write), file=sys.stderr)
        plan.check_proceeds()
        run_id = str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id, _ = await runtime.forks.fork(plan, run_id=run_id, document=graph)
            if self.json:
                _out({"run": run_id, "forked_from": plan.forked_from})
            else:
                print(run_id, flush=True)
            return await self._drive_and_report(runtime, run_id)

    def _fork_plan(self, plan: ForkPlan) -> int:
        if self.json:
            _out(plan.dry_run_json())
            return EXIT_OK
        print(
            f"forking run {plan.origin} from node {plan.from_node!r} copies seq "
            f"0..{plan.through_seq} ({len(plan.prefix)} events) and re-walks the rest",
            flush=True,
        )
        pending = {write.seq for write in plan.unacknowledged}
        for write in plan.writes:
            said = "NOT acknowledged" if write.seq in pending else "acknowledged"
            print(f"  {_write_line(write)} ({said})", flush=True)
        print("it would proceed" if plan.would_proceed else "it would be refused", flush=True)
        return EXIT_OK

    async def cmd_edit_mode(self, runtime: Runtime) -> int:
        """``salvor edit-mode [on|off]``: set edit mode when told to, then say what it is."""
        if self.args.state is not None:
            await runtime.definitions.set_edit_mode(self.args.state == "on")
        enabled = await runtime.definitions.edit_mode()
        if self.json:
            _out({"enabled": enabled})
        else:
            print(f"edit mode is {'on' if enabled else 'off'}", flush=True)
        return EXIT_OK

    async def cmd_replay(self, runtime: Runtime) -> int:
        if not self.args.dry_run:
            raise UsageError("replay only runs as --dry-run (derive the state, execute nothing)")
        from salvor.protocol import fold

        view = fold(await runtime.reads.log(self.args.run))
        _out(view.replay_json())
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "--store",
        metavar="URL",
        help="store URL or SQLite path (default: $SALVOR_STORE, else the state directory)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser = Parser(prog="salvor", description="Durable execution for AI agent runs.")
    parser.add_argument("--version", action="version", version=f"salvor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_verbs(sub, common)
    _add_read_verbs(sub, common)
    add_serve_parser(sub, common)

    # doctor opens no store, so it takes none of the common options.
    add_doctor_parser(sub)
    # `graph validate` checks a document on this machine and takes none either; `graph run` does.
    add_graph_parser(sub, common)
    _add_fork_parser(sub, common)

    p = sub.add_parser(
        "edit-mode",
        parents=[common],
        help="say whether agents are offered the flow authoring tools, or turn that on or off "
        "(for every run of the store, from its next model call)",
    )
    p.add_argument("state", nargs="?", choices=("on", "off"), help="turn it on or off")

    p = sub.add_parser(
        "replay", parents=[common], help="derive a run's state from its log, executing nothing"
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--dry-run", action="store_true", help="required: print the derived state as JSON"
    )
    return parser


def _add_run_verbs(sub, common: argparse.ArgumentParser) -> None:
    """The verbs that start, continue, settle or retire runs."""
    p = sub.add_parser("run", parents=[common], help="start a run of an agent and drive it")
    p.add_argument(
        "agent",
        metavar="AGENT",
        help="agent file (TOML, JSON or markdown) or a stored sha256: hash",
    )
    p.add_argument(
        "--input", metavar="JSON", type=json_value("--input"), help="the run's input (default null)"
    )
    add_label_option(p)
    p.add_argument("--run-id", metavar="UUID", type=run_uuid, help="choose the run id")

    p = sub.add_parser(
        "rerun",
        parents=[common],
        help=(
            "re-run a completed agent-process run against its recorded "
            "model calls (no upstream call)"
        ),
    )
    p.add_argument("run", metavar="RUN", type=run_uuid, help="the completed run to reproduce")
    p.add_argument(
        "--agent",
        metavar="AGENT",
        help="agent file or sha256: hash to run instead of the origin's own",
    )
    add_label_option(p)

    p = sub.add_parser("resume", parents=[common], help="continue a parked or interrupted run")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--input",
        metavar="JSON",
        type=json_value("--input"),
        default=MISSING,
        help="the input a suspended run waits for, or a budget extension",
    )

    p = sub.add_parser("resolve", parents=[common], help="record by hand what a dangling write did")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--output",
        metavar="JSON",
        type=json_value("--output"),
        required=True,
        help="what the write returned",
    )
    p.add_argument(
        "--client-tool",
        action="append",
        default=[],
        metavar="FILE",
        help="the declaration of the client tool whose write this is, to check the output "
        "against (as `salvor serve --client-tool` takes it; repeatable)",
    )

    p = sub.add_parser(
        "reconcile",
        parents=[common],
        help="list the runs parked on a write of unknown outcome, or settle one",
    )
    p.add_argument("run", metavar="RUN", nargs="?", type=run_uuid, help="the parked run to settle")
    p.add_argument(
        "--output",
        metavar="JSON",
        type=json_value("--output"),
        default=MISSING,
        help="the write happened and returned this",
    )
    p.add_argument(
        "--not-landed",
        action="store_true",
        help="the write did not happen: record a failed call and free its idempotency key, so "
        "calling it again performs it",
    )
    p.add_argument(
        "--client-tool",
        action="append",
        default=[],
        metavar="FILE",
        help="the declaration of a client tool whose writes are parked, to say (and check) what "
        "its output must be (repeatable)",
    )

    p = sub.add_parser("abandon", parents=[common], help="retire a run by hand")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument("--reason", metavar="TEXT")

    sub.add_parser(
        "wake", parents=[common], help="drive every sleeping run whose instant has passed"
    )


def _add_read_verbs(sub, common: argparse.ArgumentParser) -> None:
    """The verbs that read runs without changing them."""
    p = sub.add_parser("runs", parents=[common], help="list runs, newest first")
    p.add_argument("--state", metavar="STATE", type=run_state, help="only runs in this state")
    p.add_argument("--label", metavar="K=V", type=key_value, help="only runs with this label")
    p.add_argument(
        "--limit", default=50, type=run_limit, metavar="N", help="at most N runs (default 50)"
    )

    p = sub.add_parser(
        "history", parents=[common], help="a run's recorded events (--json: pinned envelopes)"
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)

    p = sub.add_parser(
        "log",
        parents=[common],
        help="a run's events, readable, then where it rests (--json: an object per event, then "
        "the run's status)",
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)


def _add_fork_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "fork",
        parents=[common],
        help="start a new run re-walking a graph run from a node, refusing to re-fire a recorded "
        "write until it is acknowledged",
    )
    p.add_argument("run", metavar="RUN", type=run_uuid, help="the graph run to fork")
    p.add_argument("--from-node", required=True, metavar="ID", help="the node to re-walk from")
    p.add_argument(
        "--graph",
        metavar="FILE",
        help="the run's graph document (JSON, or YAML by a .yaml/.yml name), checked against the "
        "hash the run recorded (default: the document this store holds)",
    )
    p.add_argument(
        "--acknowledge-writes",
        type=_acknowledged,
        default=(),
        metavar="SEQ,...|all",
        help="the origin seqs of the re-walked writes that may fire again, or all of them",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (and what it would re-fire) only"
    )


def _write_line(write: RecordedWrite) -> str:
    where = f"seq {write.seq}"
    if write.run is not None:
        where += f" (a map item: run {write.run}, seq {write.run_seq})"
    return f"{where}: {write.tool} {json.dumps(write.input, ensure_ascii=False)}"


def _acknowledged(text: str) -> tuple[int, ...] | None:
    """``--acknowledge-writes``: seqs, or None for ``all``."""
    if text.strip() == "all":
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() and len(part) <= 18 for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} must be log positions such as 4,9 (or all)"
        )
    return tuple(int(part) for part in parts)


async def _graph_file(path: str) -> Graph:
    try:
        text = await trio.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--graph {path}: cannot read it ({exc})") from None
    parse = parse_graph_yaml if path.endswith((".yaml", ".yml")) else parse_graph_json
    try:
        return parse(text)
    except InvalidGraph as exc:
        errors = "; ".join(error["message"] for error in exc.details["errors"])
        raise CliError(f"--graph {path}: {exc.message}: {errors}") from None


def _declarations(paths: list[str]) -> dict[str, ClientTool]:
    try:
        return load_declarations(paths)
    except ValueError as exc:
        raise CliError(str(exc)) from None


async def _main(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        return await doctor_main(args)
    if args.command == "graph" and args.graph_command == "validate":
        return await graph_validate_main(args)
    if args.command == "graph" and args.remote is not None:
        return await remote_main(args)  # no store here: the daemon at the URL keeps the run
    try:
        claim_wait_seconds()  # read again by every drive: a bad value is refused here, once
    except ValueError as exc:
        raise CliError(str(exc)) from None
    url = _store_url(args)
    if args.command == "serve":
        return await serve_main(args, url)
    if args.command not in SHARES_STORE:
        async with open_store_access(url) as access:
            return await getattr(Cli(args, url), _verb(args.command))(
                Runtime(access, demo_registry(store_url=url))
            )
    async with (
        own_store(
            url, args.command, share=SHARES_STORE[args.command], run_hint=_beside(args)
        ) as locks,
        open_store_access(url) as access,
    ):
        return await getattr(Cli(args, url, locks), _verb(args.command))(
            Runtime(access, demo_registry(store_url=url))
        )


def _beside(args: argparse.Namespace) -> Callable[[Holder | None], str]:
    """What a command refused beside a daemon serving its store does instead (``resume`` asks
    that daemon, with the input it was given; ``wake`` need not)."""
    if args.command != "resume":
        return lambda daemon: "it wakes sleeping runs itself"
    run_input = None if args.input is MISSING else json.dumps(args.input, ensure_ascii=False)

    def hint(daemon: Holder | None) -> str:
        address = daemon_address(daemon.listen or "") if daemon is not None else UNKNOWN_ADDRESS
        return "resume the run through it: " + resume_hint(args.run, address, run_input)

    return hint


def _store_url(args: argparse.Namespace) -> str:
    """The store the command works on, refused when no store can be there.

    A command that only reads or continues runs never creates a store. One that may create
    one (``run``, ``graph run``, ``serve``) creates the directories above it only for the
    default store in the state directory: a store named by ``--store`` or ``SALVOR_STORE`` in
    a directory that does not exist is a typo far more often than a wish.

    Raises:
        CliError: no store at the path, or no directory for it; nothing was created.
    """
    named = args.store or os.environ.get("SALVOR_STORE")
    url = normalize_store_url(args.store) if args.store else default_store_url()
    path = sqlite_path(url)
    if path is None or path.exists():
        return url
    missing_directory = named and not path.parent.is_dir()
    if args.command not in CREATES_STORE:
        creates = "`salvor run` or `salvor serve` creates a new one"
        if missing_directory:
            creates = f"`mkdir -p {path.parent}`, then {creates}"
        raise CliError(
            f"no store at {path}; name the store that holds your runs with --store or SALVOR_STORE "
            f"({creates})"
        )
    if missing_directory:
        raise CliError(
            f"no directory {path.parent} for the store {path}; create it first "
            f"(`mkdir -p {path.parent}`) or correct the --store path"
        )
    return url


def _verb(command: str) -> str:
    """The ``Cli`` method a command runs (``edit-mode`` is ``cmd_edit_mode``)."""
    return "cmd_" + command.replace("-", "_")


def _sole(group: BaseExceptionGroup) -> BaseException:
    """The one exception a chain of single-member groups wraps, else the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: list[str] | None = None) -> int:
    """The ``salvor`` command: its exit status (the module's docstring lists them)."""
    with readers_may_leave():
        return _command(argv)


def _command(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    # The words as given: `salvor serve --workers N` starts its workers with them.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    make_undumpable()  # before any secret is read: the same user's processes cannot read ours
    try:
        try:
            return trio.run(_main, args)
        except BaseExceptionGroup as group:
            # A refusal raised inside the daemon's nurseries arrives wrapped;
            # it is still one sentence.
            raise _sole(group) from None
    except CodedError as exc:
        message = exc.sentence(CLI_WORDING)
        if getattr(args, "json", False):
            _out(exc.to_json(CLI_WORDING))
    except UsageError as exc:
        print(f"salvor: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (CliError, DefinitionError) as exc:
        message = str(exc)
    except KeyboardInterrupt:
        message = (
            "interrupted; the run keeps its log and `salvor resume RUN` continues it (beside a "
            "daemon serving this store, POST /v1/runs/RUN/resume to that daemon)"
        )
    print(f"salvor: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR
