"""A standing fuzz suite: schemathesis over the served OpenAPI document, against a real daemon.

The daemon is ``salvor serve`` in its own process on a loopback port (a real
SQLite file, the demo tools, a bearer token), and the document is the one it
serves at ``GET /v1/openapi.json``. Every operation gets a bounded number of
generated requests, valid and invalid, with a fixed seed, and every
schemathesis check runs on each answer (no server error, a documented status,
a documented content type, a body its schema admits, a valid request accepted,
an invalid one refused, auth enforced, undeclared methods refused with
``Allow``, ...), plus ``event_stream_frames``: each frame of an event stream is
parsed, its ``data`` validated against ``Envelope`` or ``EndFrame``, its ``id``
against the envelope's seq, nothing after the ``end`` frame. A finished run's
stream ends by itself; a live one is cut by schemathesis's bounds (200 events,
1 s), so that its stream ends is asserted on seeded resting runs.

Half the generated run ids and agent hashes name real ones (seeded before the
fuzz), so the verbs get past the 404. Where a valid request's fate depends on
what is outside the document (an MCP server's reachability, a run's recorded
gate), the suite says so next to the one adjustment it makes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import schemathesis
import schemathesis.engine
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from salvor.daemon.api._app import API_OPERATIONS
from salvor.daemon.api._openapi import openapi_document
from schemathesis import GenerationMode
from schemathesis.engine import Status, StopReason, events

from tests.support.graph_documents import every_kind
from tests.support.spawn import ONE_PROCESS, salvor_process

REPO = Path(__file__).resolve().parents[3]
TOKEN_ENV = "SALVOR_FUZZ_TOKEN"
TOKEN = "fuzz-token-not-a-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Per operation and phase: about 25 operations on two shared cores stay well inside CI's budget.
MAX_EXAMPLES = 12
SEED = 20261201
GATED = (
    'name = "gated"\nmodel = "demo-planner"\nsystem_prompt = "Ask first."\n'
    '[llm]\nprovider = "demo"\n[[tools]]\nname = "request_approval"\n'
)
_BASE = "urn:salvor:openapi"
_SERVING = re.compile(r"salvor serving on (http://127\.0\.0\.1:\d+)")


# -- the custom check: the event stream's frames ---------------------------------------------------


# A schema-valid body the server may still refuse with a documented 400, for a reason decided by
# what the store holds (the run a resume or a re-run names), which no static document can state.
_ACCEPTED_OR_REFUSED_BY_STATE = {
    "positive_data_acceptance": {
        "expected-statuses": ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]
    }
}


def _validator(name: str) -> Draft202012Validator:
    document = openapi_document(API_OPERATIONS)
    registry = Registry().with_resource(
        _BASE, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return Draft202012Validator(
        {"$ref": f"{_BASE}#/components/schemas/{name}"},
        registry=registry,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


_FRAME_DATA = {"message": _validator("Envelope"), "end": _validator("EndFrame")}


def stream_frames(text: str) -> list[dict[str, str]]:
    """The frames of an event stream as field -> value, keep-alive comments dropped.

    Stricter than an SSE client: a field that is not ``id``, ``event`` or
    ``data``, a line without ``: ``, or a field given twice is an error.
    """
    frames = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        frame: dict[str, str] = {}
        for line in lines:
            field, sep, value = line.partition(": ")
            assert sep and field in ("id", "event", "data"), f"not a frame line: {line[:200]!r}"
            assert field not in frame, f"{field} given twice in one frame: {block[:200]!r}"
            frame[field] = value
        assert "data" in frame, f"a frame without data: {block[:200]!r}"
        frames.append(frame)
    return frames


@schemathesis.check
def event_stream_frames(ctx, response, case) -> bool | None:
    """Every frame of a ``text/event-stream`` answer carries a valid envelope, in seq order, and the
    ``end`` frame, if it came, is the last."""
    if not response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        return None
    frames = stream_frames(response.text)
    expected_seq = None
    for index, frame in enumerate(frames):
        name = frame.get("event", "message")
        assert name in _FRAME_DATA, f"frame {index} has an undocumented event name {name!r}"
        data = json.loads(frame["data"])
        errors = [e.message for e in _FRAME_DATA[name].iter_errors(data)]
        assert not errors, f"frame {index} ({name}) does not match the document: {errors[:3]}"
        if name == "message":
            assert frame.get("id") == str(data["seq"]), (
                f"frame {index}: `id` is not the envelope's seq"
            )
            assert expected_seq is None or data["seq"] == expected_seq, (
                f"frame {index}: seq out of order"
            )
            expected_seq = data["seq"] + 1
        else:
            assert "id" not in frame, "the end frame carries no id"
            assert index == len(frames) - 1, "frames after the end frame"
    return True


# -- custom formats: values the daemon accepts that JSON Schema alone cannot state -----------------


def _cursor(instant: str, run_id: str) -> str:
    # store/_records.py's encoding: opaque to clients, which only ever echo one back.
    raw = json.dumps([instant, run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _within_bytes(limit: int, *, min_size: int = 0) -> st.SearchStrategy[str]:
    # No U+0000, as `allow-x00` says for every other string: a format's own strategy is not held to
    # that setting, and the strict reader refuses a NUL anywhere in a body.
    characters = st.characters(codec="utf-8", exclude_characters="\x00")
    return st.text(characters, min_size=min_size, max_size=limit).filter(
        lambda text: len(text.encode()) <= limit
    )


schemathesis.openapi.format(
    "salvor-cursor",
    st.builds(_cursor, st.just("2026-01-01T00:00:00.000000Z"), st.uuids().map(str)),
)
schemathesis.openapi.format("salvor-label-key", _within_bytes(64, min_size=1))
schemathesis.openapi.format("salvor-label-value", _within_bytes(256))


# The strict reader refuses an integer beyond it anywhere in a body (RFC 8785 has no exact form for
# one), and the document says so once, in `info.description`, as it does of U+0000.
_EXACT = 2**53 - 1


def _exact(value):
    """``value`` with every integer beyond ±(2**53 - 1) brought to that bound."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return max(-_EXACT, min(_EXACT, value))
    if isinstance(value, dict):
        return {key: _exact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_exact(item) for item in value]
    return value


@schemathesis.hook
def before_call(ctx, case, kwargs) -> None:
    """Valid requests, kept to what this daemon can accept without leaving the machine.

    * No integer beyond ±(2**53 - 1) anywhere in a body (``_EXACT``): JSON Schema cannot say it
      of every value short of a recursive schema on each one, so the fuzz is told here.

    * An agent definition goes without MCP servers: registration contacts every server it
      names (issue 12 item 1 keeps that to hosts the operator allowed), and a fuzz must not
      send the daemon to hosts nobody owns.
    * A run naming an agent goes without `replay_of`: a re-run needs a process agent, which
      this daemon does not accept over HTTP.
    """
    meta = case.meta
    if (
        meta is None
        or meta.generation.mode is not GenerationMode.POSITIVE
        or not isinstance(case.body, dict)
    ):
        return
    case.body = _exact(case.body)
    if case.operation.path == "/v1/agents":
        case.body.pop("mcp_servers", None)
    elif case.operation.path == "/v1/runs" and "agent" in case.body:
        case.body.pop("replay_of", None)


# -- the daemon ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _salvor_serve(home: Path, *flags: str) -> Iterator[str]:
    """``salvor serve`` in its own process over a fresh SQLite file in ``home``; its URL.

    Stopped with SIGTERM; it must exit 0 with no traceback in its log.
    """
    log_path = home / "serve.log"
    with log_path.open("w") as log:
        process = salvor_process(
            [
                "serve",
                *ONE_PROCESS,
                "--store",
                str(home / "store.db"),
                "--listen",
                "127.0.0.1:0",
                "--demo-tools",
                "--wake-interval",
                "0",
                "--auth-token",
                TOKEN_ENV,
                # schemathesis probes every operation with a wrong token from this one address, and
                # takes only 401 and 403 for a refusal: the 429 past the limit would read as auth
                # not enforced (that limit is tests/daemon/api/test_token_tries.py's).
                "--token-tries",
                "0",
                *flags,
            ],
            # Nothing of the test's own environment: no provider key a generated agent could send
            # anywhere. Any outbound contact a generated definition provokes
            # goes to a closed loopback port.
            env={
                "PATH": os.environ["PATH"],
                "HOME": str(home),
                "LANG": "C.UTF-8",
                TOKEN_ENV: TOKEN,
                **{
                    name: "http://127.0.0.1:9"
                    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
                },
                "NO_PROXY": "127.0.0.1,localhost",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=home,
        )
    try:
        deadline = time.monotonic() + 60
        while (match := _SERVING.search(log_path.read_text())) is None:
            assert process.poll() is None, f"salvor serve exited: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "salvor serve did not start within 60 s"
            time.sleep(0.05)
        yield match.group(1)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log_text = log_path.read_text()
    assert "Traceback" not in log_text, f"the daemon logged a traceback:\n{log_text[-4000:]}"
    assert process.returncode == 0, f"salvor serve exited {process.returncode}:\n{log_text[-2000:]}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[str]:
    with _salvor_serve(tmp_path_factory.mktemp("fuzz")) as url:
        yield url


def _config(**extra) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            # Keep-alive connections as any client's: an early refusal
            # must leave its connection usable.
            "headers": AUTH,
            "request-timeout": 20,
            "max-stream-events": 200,
            # The strict parser refuses a NUL and a lone surrogate in any string of a caller's JSON
            # (the store cannot keep either), and the document says so once, in `info.description`:
            # JSON Schema has no way to say it of every string short of a `pattern` on each one. So
            # the fuzz is told the same thing here: no U+0000, and the utf-8 codec (schemathesis's
            # default, named so it stays), which leaves out the surrogate category. A NUL is still
            # sent where the document refuses it anyway.
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "allow-x00": False,
                "codec": "utf-8",
            },
            "checks": {"enabled": True},
            **extra,
        }
    )


@pytest.fixture(scope="module")
def seeded(daemon: str) -> dict[str, str]:
    """Runs for the fuzz to find: one completed, one parked on its gate; the agent hashes; a
    stored graph's hash."""
    with httpx.Client(base_url=daemon, headers=AUTH, timeout=30) as client:
        toml = {"Content-Type": "application/toml"}
        refund_desk = (REPO / "contrib" / "agents" / "refund-desk.toml").read_text()
        agents = {
            name: client.post("/v1/agents", content=text, headers=toml).json()["agent"]
            for name, text in (("refund", refund_desk), ("gated", GATED))
        }
        runs = {
            "completed": client.post(
                "/v1/runs",
                json={
                    "agent": agents["refund"],
                    "input": {"invoice_id": "INV-1"},
                    "labels": {"env": "fuzz"},
                },
            ).json()["run"],
            "suspended": client.post("/v1/runs", json={"agent": agents["gated"]}).json()["run"],
        }
        deadline = time.monotonic() + 60
        for state, run_id in runs.items():
            while (body := client.get(f"/v1/runs/{run_id}").json())["status"]["state"] != state:
                assert time.monotonic() < deadline, f"run {run_id} never reached {state}: {body}"
                time.sleep(0.05)
        graph = client.post("/v1/graphs", json=every_kind()).json()["graph"]
        return {
            **runs,
            **{f"agent_{name}": agent for name, agent in agents.items()},
            "graph": graph,
        }


@pytest.fixture(scope="module")
def served_schema(daemon: str, seeded: dict[str, str]):
    config = _config(
        # Half the ids name something real, so the verbs reach past the 404: a finished run (which
        # no verb can change), the registered agents and the stored graph.
        dictionaries={
            "runs": {"values": [seeded["completed"]]},
            "agents": {"values": [seeded["agent_refund"], seeded["agent_gated"]]},
            "graphs": {"values": [seeded["graph"]]},
        },
        parameters={
            "path.run_id": {"dictionary": "runs", "probability": 0.5},
            "path.agent_hash": {"dictionary": "agents", "probability": 0.5},
            "path.graph_hash": {"dictionary": "graphs", "probability": 0.5},
            "body.agent": {"dictionary": "agents", "probability": 0.5},
        },
        operations=[
            {
                # A live stream is read until this bound passes (schemathesis cuts it there, as it
                # does at 200 events): what the log holds comes at once and a driven run's events
                # within milliseconds, so the first second holds every frame a longer read would,
                # bar keep-alive comments (every 15 s, tests/daemon/api/test_stream.py). A client
                # run the fuzz opens stays live, and every read of its stream waits out the whole
                # bound (at 20 s its streams took 45 of the fuzz's 90 s). A read cut early checks
                # fewer frames; it cannot fail for it.
                "include-operation-id": "streamRunEvents",
                "request-timeout": 1,
            },
            {
                # Whether a resume input is valid is decided by the gate the run recorded (its
                # input_schema), which no static document can state: a well-formed input a parked
                # run's schema rejects is a 400 with `details.violations`, as documented.
                "include-operation-id": "resumeRun",
                "checks": _ACCEPTED_OR_REFUSED_BY_STATE,
            },
            {
                # Whether a graph document is valid is decided across its nodes (an edge to an id
                # no node has, a cycle, a reference to a node that is not upstream), which a
                # schema cannot state: a document of the documented shape may still be a 400
                # `invalid_graph` with every such error in `details.errors`, as documented.
                "include-operation-id": "submitGraph",
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "400", "401", "404", "409", "429", "5xx"]
                    }
                },
            },
            {
                # Whether a run can be re-run is decided by the run `replay_of` names, which no
                # static document can state: a completed run of a built-in agent, or one a client
                # drove, is a 400 saying so, as documented (only an agent process's run re-runs).
                "include-operation-id": "startRun",
                "checks": _ACCEPTED_OR_REFUSED_BY_STATE,
            },
            {
                # A flow sent with its files (issue 31) is checked as a graph document is, and
                # its members besides: whether a member's bytes decode and match its size, and
                # whether each file a node names was sent, no schema can state. A body of the
                # documented shape may be a 400 `invalid_graph` (per node) or a 422
                # `invalid_flow_files`, as documented.
                "include-operation-id": "startGraphRun",
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": [
                            "2xx",
                            "400",
                            "401",
                            "404",
                            "409",
                            "422",
                            "429",
                            "5xx",
                        ]
                    }
                },
            },
        ],
    )
    # The WebSocket's upgrade is no HTTP exchange schemathesis can make (a plain GET of it is the
    # documented 400); its protocol is tests/daemon/api/test_ws.py's. An upload's body is a
    # gzipped tar, which schemathesis has no serialiser for and no schema describes past "bytes":
    # tests/daemon/api/test_flow_uploads.py sends it every archive it refuses.
    return (
        _without_markdown_bodies(
            schemathesis.openapi.from_url(
                f"{daemon}/v1/openapi.json", config=config, headers=AUTH, timeout=20
            )
        )
        .exclude(operation_id="liveWebSocket")
        .exclude(operation_id="uploadFlowMember")
    )


def _without_markdown_bodies(served):
    """The served document less the markdown body of ``POST /v1/agents``.

    Its schema is a string, which any text satisfies, so every text schemathesis sends there is
    "schema-valid" and a markdown agent file that does not parse is refused 400, as it must be.
    Whether a text is an agent file is the parser's to decide (tests/daemon/agents/test_markdown.py,
    tests/daemon/api/test_markdown_agents.py); the TOML body, also a string, is left out by
    schemathesis itself, which has no serialiser for application/toml.
    """
    served.raw_schema["paths"]["/v1/agents"]["post"]["requestBody"]["content"].pop("text/markdown")
    return served


def _fuzz_findings(served_schema) -> list[str]:
    """Run every phase of schemathesis (examples, coverage, fuzzing, stateful) over the document."""
    findings: list[str] = []
    for event in schemathesis.engine.from_schema(served_schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status is Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        findings.append(
                            f"[{event.phase.value}] {failure.operation}: {failure.title}\n"
                            f"{failure.message}\n{check.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError):
            findings.append(
                f"[{event.phase.value if event.phase else '-'}] "
                f"{event.label}: {event.info.format()}"
            )
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            assert event.stop_reason is StopReason.COMPLETED, event.stop_reason
    return findings


# A definition naming one input, output or tool twice (once as a name, once as a table: JSON
# Schema's uniqueItems compares whole items, so no document can state it) is a documented 400.
_NAMED_TWICE = re.compile(r"(`(inputs|outputs)` names '[^']*' twice|tool '[^']*' is listed twice)")
_CURL_BODY = re.compile(r"-d '(.*)' (http://\S+)$", re.DOTALL)


def _not_named_twice(findings: list[str]) -> list[str]:
    """``findings`` but the registrations refused only for naming something twice: each is sent
    again, and dropped when the daemon's 400 says exactly that."""
    kept = []
    for finding in findings:
        sample = finding.rsplit("\n", 1)[-1]
        sent = _CURL_BODY.search(sample) if "POST /v1/agents" in finding else None
        if sent is not None:
            body = sent.group(1).replace("'\"'\"'", "'").replace("'\\''", "'")
            headers = {**AUTH, "Content-Type": "application/json"}
            answer = httpx.post(sent.group(2), content=body.encode(), headers=headers, timeout=20)
            message = answer.json().get("error", {}).get("message", "")
            if answer.status_code == 400 and _NAMED_TWICE.search(message):
                continue
        kept.append(finding)
    return kept


def test_fuzz_finds_nothing(served_schema, seeded) -> None:
    findings = _not_named_twice(_fuzz_findings(served_schema))
    unique = list(dict.fromkeys(findings))
    assert not unique, f"{len(unique)} findings:\n\n" + "\n\n".join(unique[:20])


def test_fuzz_agent_registration_with_process_agents(tmp_path) -> None:
    """On a daemon that accepts process and service agents, their definitions are fuzzed too.

    Registration only: a registered process agent runs its command only when a run starts, and no
    run is started here.
    """
    with _salvor_serve(tmp_path, "--allow-process-agents") as url:
        served = _without_markdown_bodies(
            schemathesis.openapi.from_url(
                f"{url}/v1/openapi.json", config=_config(), headers=AUTH, timeout=20
            )
        )
        assert served.raw_schema["components"]["schemas"]["AgentDefinition"]["oneOf"]
        found = _fuzz_findings(served.include(operation_id="registerAgent"))
        findings = list(dict.fromkeys(_not_named_twice(found)))
    assert not findings, f"{len(findings)} findings:\n\n" + "\n\n".join(findings[:20])


@pytest.mark.parametrize(
    "path", ["/v1/runs/{run_id}", "/v1/runs/{run_id}/replay", "/v1/runs/{run_id}/events"]
)
@pytest.mark.parametrize("run", ["completed", "suspended"])
def test_seeded_runs_match_the_document(served_schema, seeded, path, run) -> None:
    case = served_schema[path]["GET"].Case(path_parameters={"run_id": seeded[run]})
    response = case.call_and_validate(headers=AUTH, timeout=20)
    assert response.status_code == 200
    if path.endswith("/events"):
        frames = stream_frames(response.text)
        assert frames[-1]["event"] == "end"
        assert json.loads(frames[-1]["data"])["status"]["state"] == run


def test_event_stream_check_catches_a_bad_frame() -> None:
    """The frame check is not vacuous: a frame whose data breaks the envelope fails it."""

    class Fake:
        status_code = 200
        headers: ClassVar = {"content-type": ["text/event-stream"]}
        text = 'id: 0\ndata: {"seq": 0}\n\n'

    with pytest.raises(AssertionError, match="does not match the document"):
        event_stream_frames(None, Fake(), None)
    Fake.text = (
        'event: end\ndata: {"status": {"state": "completed", "output": null}}\n\nid: 0\ndata: '
        "{}\n\n"
    )
    with pytest.raises(AssertionError, match="frames after the end frame"):
        event_stream_frames(None, Fake(), None)


def test_what_the_fuzz_found_stays_fixed(daemon: str, seeded) -> None:
    """Each finding of the first runs, as one plain request."""
    with httpx.Client(base_url=daemon, headers=AUTH, timeout=30) as client:
        refused = client.request("TRACE", "/v1/agents")
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD, POST"
        assert refused.json()["error"]["code"] == "method_not_allowed"
        no_route = client.get("/v1/nowhere")
        assert no_route.status_code == 404 and no_route.json()["error"]["code"] == "not_found"
        not_a_hash = client.post("/v1/client-runs", json={"agent": seeded["agent_refund"] + "*"})
        assert not_a_hash.status_code == 400, not_a_hash.text
        assert not_a_hash.json()["error"]["code"] == "bad_request"
        stream = client.get(
            f"/v1/runs/{seeded['completed']}/events",
            params={"from_seq": "-1"},
            headers={"Last-Event-ID": "0"},
        )
        assert stream.status_code == 400, stream.text
        whole = client.post(
            "/v1/agents",
            json={
                "model": "demo-planner",
                "llm": {"provider": "demo", "max_retries": 1.0},
                "max_response_tokens": 64.0,
            },
        )
        assert whole.status_code == 201, whole.text
        served = client.get("/v1/openapi.json").json()["components"]["schemas"]
        tools = served["ToolName"]["enum"]
        assert tools == sorted(tools) and "lookup_invoice" in tools
        assert served["AgentDefinition"]["allOf"] == [{"$ref": "#/components/schemas/BuiltinAgent"}]
