"""The commands that work on a store: one ``Cli`` method each (``cmd_run`` for ``salvor run``),
given the runtime over the store the command opened, returning the command's exit status."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import trio
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
    StoreLocks,
)

from ..agents import AgentDefinition, DefinitionError, load_definition
from ..client_runs import ClientTool, load_declarations
from ..flows import caller_labels
from ..graphs import FlowFiles, captured_baselines
from ..processes import sweep_orphans
from ..runs import (
    MISSING,
    ResumeOutcome,
    Runtime,
    driving_run,
)
from ._attachable import attachable_servers
from ._baselines import write_baselines
from ._errors import EXIT_ERROR, EXIT_OK, EXIT_RUN_FAILED, CliError, UsageError
from ._graph import collect_flow_files, read_graph, unreadable
from ._hints import (
    resume_hint,
    serving_daemon,
)
from ._named_flow_run import by_flow_name
from ._render import PARKED, describe, describe_reconciliation, resting_sentence
from ._wording import CLI_WORDING


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


def print_json(obj: Any) -> None:
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
            print_json({"run": run_id, **view.replay_json(), "status": status})
        else:
            print(await self._sentence(run_id, view), flush=True)
        return EXIT_RUN_FAILED if view.state is RunState.FAILED else EXIT_OK

    async def _sentence(self, run_id: str, view: RunView) -> str:
        daemon = await self._daemon() if view.state in PARKED else None
        return resting_sentence(run_id, view, daemon)

    def _announce(self, run_id: str, **origin: Any) -> None:
        """Say a new run's id before it is driven: alone on a line, or as JSON with where it
        came from (``origin``)."""
        if self.json:
            print_json({"run": run_id, **origin})
        else:
            print(run_id, flush=True)

    async def _drive_and_report(
        self, runtime: Runtime, run_id: str, agent: AgentDefinition | None = None
    ) -> int:
        view = await runtime.drive(run_id, agent=agent, on_record=self._on_record)
        return await self._report(run_id, view)

    # -- commands -------------------------------------------------------------

    async def cmd_run(self, runtime: Runtime) -> int:
        labels = _labels(self.args.label)
        agent = await self._agent_from(runtime, self.args.agent)
        await self._register_file_agent(runtime, agent, self.args.agent)
        # The run lock is taken before the run exists: a daemon starting
        # meanwhile never sees it unlocked and interrupted.
        run_id = self.args.run_id or str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id = await runtime.starts.start_run(
                agent, self.args.input, labels=labels, run_id=run_id
            )
            self._announce(run_id)
            return await self._drive_and_report(runtime, run_id, agent)

    async def cmd_graph(self, runtime: Runtime) -> int:
        """``salvor graph run``: the document and its agents stored, the run started and driven."""
        # Checked before anything is stored: a refused label leaves the store as it was.
        labels = _labels(self.args.label)
        named = await by_flow_name(runtime, self.args, labels)
        if named is not None:
            graph, labels = named
            for source in self.args.agent:
                await runtime.definitions.register_agent(await self._agent_from(runtime, source))
            return await self._run_graph(runtime, graph, labels)
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
            agent = await self._agent_from(runtime, source)
            await self._register_file_agent(runtime, agent, source)
        files = None
        update = self.args.update_baselines
        file_inputs = runtime.kit.registry.file_inputs()
        if names_files(graph.nodes, file_inputs):
            files = await collect_flow_files(
                self.args.file,
                update_baselines=update,
                file_inputs=file_inputs,
                as_json=self.json,
            )
        elif update:
            raise UsageError(f"--update-baselines: {self.args.file} has no snapshot node")
        else:
            await runtime.definitions.register_graph(graph)
        if files is None:
            return await self._run_graph(runtime, graph, labels)
        run_id = self.args.run_id or str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id = await self._start_flow(runtime, files, labels, run_id)
            self._announce(run_id)
            code = await self._drive_and_report(runtime, run_id)
        # A nested flow may update its baselines while the run compares its own.
        writes = await captured_baselines(
            runtime.reads,
            runtime.definitions.load_graph,
            run_id,
            runtime.definitions.load_flow_bundle,
        )
        refused = await trio.to_thread.run_sync(
            lambda: write_baselines(files, writes, as_json=self.json)
        )
        if refused:
            raise CliError("; ".join(refused))
        return code

    async def _run_graph(self, runtime: Runtime, graph: Graph, labels: dict | None) -> int:
        """Start a run of the stored ``graph`` and drive it to where it rests."""
        run_id = self.args.run_id or str(uuid.uuid4())
        async with driving_run(self.locks, run_id):
            run_id = await runtime.starts.start_graph_run(
                graph, self.args.input, labels=labels, run_id=run_id
            )
            self._announce(run_id)
            return await self._drive_and_report(runtime, run_id)

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

    async def _register_file_agent(
        self, runtime: Runtime, agent: AgentDefinition, source: str
    ) -> None:
        """Register ``agent``, read from the file ``source`` (or named by its hash): a file's
        agent is listed local in the catalog, with the file's absolute path."""
        path = None if source.startswith("sha256:") else os.path.abspath(source)
        await runtime.definitions.register_agent(agent, source_path=path)

    async def _agent_from(self, runtime: Runtime, source: str) -> AgentDefinition:
        if source.startswith("sha256:"):
            return await runtime.definitions.load_agent(source)
        try:
            registry = runtime.kit.registry
            agent = load_definition(source, known_tools=registry.names(), skills=registry.skills)
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
            self._announce(run_id, replay_of=origin)
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
            print_json({"run": run_id, "resolved": True, "status": view.status()})
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
                    print_json(item.to_json())
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
            print_json(
                {"run": run_id, "abandoned": True, "appended_seq": seq, "status": view.status()}
            )
        else:
            print(await self._sentence(run_id, view), flush=True)
        return EXIT_OK

    async def cmd_tools(self, runtime: Runtime) -> int:
        """``salvor tools attach RUN [TOOL...] [--mcp NAME...]``: ``RunTools.attach`` over the
        store, a server's name checked against the ``--attachable-mcp`` file given."""
        run_id = self.args.run
        runtime.tools.attachable_mcp = attachable_servers(self.args)
        attached = await runtime.tools.attach(run_id, self.args.tool, self.args.mcp)
        if self.json:
            print_json({"run": run_id, **{k: v for k, v in attached.items() if k != "run_id"}})
            return EXIT_OK
        print(
            f"run {run_id}: attached {', '.join(attached['tools'])} (recorded in "
            f"{len(attached['runs'])} run{'s' if len(attached['runs']) != 1 else ''} of its tree)",
            flush=True,
        )
        for child in attached["busy"]:
            print(
                f"salvor: child run {child} was being driven and did not record it; "
                f"attach to it again once it rests",
                file=sys.stderr,
                flush=True,
            )
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
            print_json({"runs": [summary.to_json() for summary in page]})
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
                print_json(
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
            print_json({"run": run_id, "status": view.status_at(datetime.now(UTC))})
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
            self._announce(run_id, forked_from=plan.forked_from)
            return await self._drive_and_report(runtime, run_id)

    def _fork_plan(self, plan: ForkPlan) -> int:
        if self.json:
            print_json(plan.dry_run_json())
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
            print_json({"enabled": enabled})
        else:
            print(f"edit mode is {'on' if enabled else 'off'}", flush=True)
        return EXIT_OK

    async def cmd_replay(self, runtime: Runtime) -> int:
        if not self.args.dry_run:
            raise UsageError("replay only runs as --dry-run (derive the state, execute nothing)")
        from salvor.protocol import fold

        view = fold(await runtime.reads.log(self.args.run))
        print_json(view.replay_json())
        return EXIT_OK


def _write_line(write: RecordedWrite) -> str:
    where = f"seq {write.seq}"
    if write.run is not None:
        where += f" (a map item: run {write.run}, seq {write.run_seq})"
    return f"{where}: {write.tool} {json.dumps(write.input, ensure_ascii=False)}"


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
