"""The `salvor` command line as a person and a script use it, over a real store, the scripted
provider as the only double. A command's answer is read from ``main(argv)`` in this process
(``tests/support/cli``); a killed run, a listener and a terminal are real subprocesses.

Every refusal is one sentence on stderr with a non-zero exit, and leaves the
store exactly as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from salvor.protocol import EMPTY_VIEW, check_batch, decode_envelope, format_instant
from salvor.store import EventStore

from tests.support import spawn
from tests.support.backends import BOTH, SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import tool_loop_script
from tests.support.spawn import run_salvor

# SQLite alone (tests/support/backends.py): what it tests is the command line's sentences and
# exits; the tests that drive runs on a store keep both backends.
STORE_BACKENDS = SQLITE_ONLY

REPO = Path(__file__).resolve().parents[3]


def _environment(store_url: str, env: dict | None) -> dict[str, str]:
    full_env = {**os.environ, "SALVOR_STORE": store_url, **(env or {})}
    full_env.pop("SALVOR_FAULT_KILL_AFTER_SEQ", None)
    return full_env


def salvor(store_url: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command's answer (exit status, stdout, stderr), run in this process (tests/support/cli);
    ``serve`` in a process of its own, since a start that is not refused does not return."""
    if args[0] == "serve":
        return salvor_process(store_url, *args, env=env)
    return salvor_in_process(*args, env=_environment(store_url, env), cwd=REPO)


def salvor_process(
    store_url: str, *args: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """A command in a process of its own: for a fault that kills it, for ``serve``, and for a
    process agent or MCP server whose own output must land in the captured stderr."""
    return run_salvor(
        args,
        capture_output=True,
        text=True,
        env=_environment(store_url, env),
        timeout=120,
        cwd=REPO,
    )


def one_sentence(result: subprocess.CompletedProcess, *fragments: str, exit: int = 1) -> None:
    """A refusal (exit 1) or a usage error (``exit=2``): one line on stderr naming each
    fragment, no traceback."""
    assert result.returncode == exit, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("salvor: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def run_count(store_url: str) -> int:
    with EventStore.open(store_url) as store:
        page, _ = store.list_runs(limit=1000)
        return len(page)


def event_total(store_url: str) -> int:
    with EventStore.open(store_url) as store:
        page, _ = store.list_runs(limit=1000)
        return sum(s.event_count for s in page)


@pytest.fixture
def agent_file(tmp_path: Path, providers):
    provider = providers(
        tool_loop_script(
            [
                ("lookup_invoice", {"invoice_id": "INV-9"}),
                ("issue_refund", {"invoice_id": "INV-9", "amount_cents": 300}),
            ],
            final_text="refunded",
        )
    )
    path = tmp_path / "agent.toml"
    path.write_text(agent_toml(provider.base_url, tools=["lookup_invoice", "issue_refund"]))
    return path


def test_the_readme_first_command_runs_offline(store_url):
    result = salvor(
        store_url, "run", "contrib/agents/refund-desk.toml", "--input", '{"invoice_id": "INV-1001"}'
    )
    assert result.returncode == 0, result.stderr
    run_id, summary = result.stdout.splitlines()[0], result.stdout.splitlines()[1]
    assert summary.startswith(f"run {run_id} completed: ")
    replay = json.loads(salvor(store_url, "replay", run_id, "--dry-run").stdout)
    assert replay["status"]["state"] == "completed"
    assert replay["pending"] is None


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
def test_run_prints_the_id_first_then_the_outcome_and_json_for_scripts(store_url, agent_file):
    result = salvor(
        store_url,
        "run",
        str(agent_file),
        "--input",
        '{"invoice_id": "INV-9"}',
        "--label",
        "build=42",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    first, last = (json.loads(line) for line in result.stdout.splitlines())
    run_id = first["run"]
    assert last["run"] == run_id
    assert last["status"] == {"state": "completed", "output": "refunded"}
    assert last["next_seq"] == 12 and last["pending"] is None

    listing = json.loads(salvor(store_url, "runs", "--json").stdout)["runs"]
    assert [r["run"] for r in listing] == [run_id]
    assert listing[0]["labels"] == {"build": "42"}
    assert listing[0]["step_count"] == 3

    history = salvor(store_url, "history", run_id, "--json").stdout.splitlines()
    envelopes = [decode_envelope(line) for line in history]
    assert [e.seq for e in envelopes] == list(range(12))
    check_batch(EMPTY_VIEW, envelopes)
    with EventStore.open(store_url) as store:
        from salvor.protocol import encode_envelope

        assert history == [encode_envelope(e) for e in store.read_log(run_id)]


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
def test_a_resolved_write_is_tagged_operator_in_the_log(store_url, agent_file, tmp_path):
    env = {
        "SALVOR_FAULT_KILL_IN_TOOL": "issue_refund",
        "SALVOR_DEMO_EFFECTS": str(tmp_path / "fx.jsonl"),
    }
    run_id = "7d3f8a52-0d6e-4c1b-9a56-3f2a1b7c9d10"
    killed = salvor_process(store_url, "run", str(agent_file), "--run-id", run_id, env=env)
    assert killed.returncode == -9
    # This resume has no ledger to look the refund up in (set but empty): its probe cannot
    # tell, and the run parks again for a person, saying so.
    parked = salvor(store_url, "resume", run_id, env={"SALVOR_DEMO_EFFECTS": ""})
    assert parked.returncode == 0, parked
    assert "needs reconciliation" in parked.stdout and "salvor resolve" in parked.stdout
    assert salvor(store_url, "resolve", run_id, "--output", '{"refund_id": "rf_1"}').returncode == 0
    done = salvor(store_url, "resume", run_id)
    assert done.returncode == 0 and "completed" in done.stdout
    log = salvor(store_url, "log", run_id).stdout
    tagged = [line for line in log.splitlines() if "[Operator]" in line]
    assert len(tagged) == 1 and "ToolCallCompleted" in tagged[0]


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
def test_a_sleeping_run_is_woken_by_salvor_wake(store_url, tmp_path, providers):
    wake_at = {}

    def sleeper(name: str, ahead: timedelta):
        def script(call):
            if call.index == 0:  # decided at call time, so the instant is ahead of now
                wake_at[name] = format_instant(datetime.now(UTC) + ahead)
            return tool_loop_script(
                [("wait_until", {"wake_at": wake_at[name]})], final_text="woke"
            )(call)

        path = tmp_path / f"{name}.toml"
        path.write_text(agent_toml(providers(script).base_url, tools=["wait_until"]))
        result = salvor(store_url, "run", str(path))
        assert result.returncode == 0 and "sleeping until" in result.stdout
        return result.stdout.splitlines()[0]

    # One run due in a second, one in an hour: however slow the machine, the second is still
    # asleep when the first is woken, and neither a resume nor `wake` may wake it early.
    soon, later = sleeper("soon", timedelta(seconds=1)), sleeper("later", timedelta(hours=1))
    early = salvor(store_url, "resume", later, "--json")
    assert early.returncode == 1
    assert json.loads(early.stdout)["error"]["code"] == "still_sleeping"
    deadline = datetime.fromisoformat(wake_at["soon"])
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.05)
    woken = salvor(store_url, "wake")
    assert woken.returncode == 0, woken.stderr
    assert f"run {soon} completed" in woken.stdout and later not in woken.stdout
    assert salvor(store_url, "wake").stdout.strip() == "no sleeping run is due"


# A value its flag cannot take is a usage error, refused while the arguments are parsed.
USAGE = 2


# Refused before anything is written, the same way on either backend: SQLite alone.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["run", "AGENT", "--input", "{not json"], ["--input is not valid JSON", USAGE]),
        (
            ["run", "AGENT", "--input", "[" * 1000 + "]" * 1000],
            ["--input nests", "the limit is 128", USAGE],
        ),
        (
            ["run", "AGENT", "--input", '{"a": 1, "a": 2}'],
            ["--input is not valid JSON", "appears twice", USAGE],
        ),
        (["run", "AGENT", "--input", '"\\u0000"'], ["--input holds a NUL character", USAGE]),
        (["run", "AGENT", "--label", "nokey"], ["--label", "key=value", USAGE]),
        (["run", "AGENT", "--label", "k=" + "v" * 257], ["over 256 bytes", USAGE]),
        (["run", "AGENT", "--label", "=v"], ["label key '' must be 1 to 64 bytes", USAGE]),
        (
            ["run", "AGENT", "--label", "salvor.parent=00000000-0000-4000-8000-000000000000"],
            ["the label `salvor.parent` is written by the daemon alone", USAGE],
        ),
        (
            ["run", "AGENT", "--label", "salvor.autonomous=on"],
            ['`salvor.autonomous` is "true"', USAGE],
        ),
        (
            ["rerun", "00000000-0000-4000-8000-000000000000", "--label", "salvor.map_of=g"],
            ["`salvor.map_of`", USAGE],
        ),
        (["run", "AGENT", "--run-id", "not-a-uuid"], ["not a run id", USAGE]),
        (["run", "missing-agent.toml"], ["cannot read agent file"]),
        (["run", "sha256:0000"], ["no agent sha256:0000 is stored here"]),
        (
            ["resume", "00000000-0000-4000-8000-000000000000"],
            ["no run 00000000-0000-4000-8000-000000000000"],
        ),
        (["resolve", "00000000-0000-4000-8000-000000000000", "--output", "{}"], ["no run"]),
        (["abandon", "00000000-0000-4000-8000-000000000000"], ["no run"]),
        (["history", "00000000-0000-4000-8000-000000000000"], ["no run"]),
        (["log", "00000000-0000-4000-8000-000000000000"], ["no run"]),
        (["replay", "00000000-0000-4000-8000-000000000000", "--dry-run"], ["no run"]),
        (["resume", "run-1"], ["not a run id", USAGE]),
        (["serve", "--lease-seconds", "0"], ["--lease-seconds '0'", "above 0", USAGE]),
        (
            ["serve", "--lease-seconds", "2", "--fence-margin-seconds", "2"],
            ["--fence-margin-seconds 2 must be shorter than --lease-seconds 2", USAGE],
        ),
        (["history", "run-1"], ["not a run id", USAGE]),
        (["resume", "00000000-0000-4000-8000-000000000000", "--input", "{"], ["--input", USAGE]),
    ],
)
def test_bad_input_gets_one_sentence_and_changes_nothing(store_url, agent_file, args, fragments):
    args = [str(agent_file) if a == "AGENT" else a for a in args]
    # An existing, empty store: a missing one is refused before any of these checks.
    EventStore.open(store_url).close()
    result = salvor(store_url, *args)
    exit = USAGE if USAGE in fragments else 1
    one_sentence(result, *[f for f in fragments if f != USAGE], exit=exit)
    assert run_count(store_url) == 0


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_claim_wait_is_refused_before_any_run(store_url, agent_file, value):
    EventStore.open(store_url).close()
    result = salvor(store_url, "run", str(agent_file), env={"SALVOR_CLAIM_WAIT_SECONDS": value})
    one_sentence(result, "SALVOR_CLAIM_WAIT_SECONDS must be a number of seconds", repr(value))
    assert run_count(store_url) == 0


# Refused before anything is written, the same way on either backend: SQLite alone.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("definition", "fragment"),
    [
        ('model = "m"\nbudgetz = 3\n', "unknown field `budgetz`"),
        ('name = "x"\n', "`model` is required"),
        ('model = "m"\nname = "' + "n" * 65 + '"\n', "at most 64 characters"),
        ('model = "m"\nname = "   "\n', "must not be empty"),
        ('model = "m"\n[[tools]]\nname = "rm_rf"\n', "unknown tool 'rm_rf'"),
        ('model = "m"\n[budgets]\ncost_usd = 2.0\n', "needs a [pricing] table"),
        ('model = "m"\n[llm]\nprovider = "gemini"\n', "provider must be one of"),
        ('model = = "m"\n', "not valid TOML"),
    ],
)
def test_a_definition_that_does_not_validate_is_refused(store_url, tmp_path, definition, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(definition)
    one_sentence(salvor(store_url, "run", str(path)), fragment)
    assert run_count(store_url) == 0


# contrib/agents/refund-desk.toml as a markdown agent file: the same agent, field for field.
REFUND_DESK_MD = """---
name: refund-desk
model: demo-planner
max_response_tokens: 1024
llm:
  provider: demo
budgets:
  steps: 12
tools: lookup_invoice, issue_refund, send_email
---
You settle refund requests: look the invoice up, refund it, and tell the customer.
"""


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
def test_run_takes_a_markdown_agent_file(store_url, tmp_path):
    path = tmp_path / "refund-desk.md"
    path.write_text(REFUND_DESK_MD)
    result = salvor(store_url, "run", str(path), "--input", '{"invoice_id": "INV-1001"}', "--json")
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["status"]["state"] == "completed"
    # Its TOML twin is the same agent: the store keeps the first registration, the markdown file.
    toml = salvor(
        store_url, "run", "contrib/agents/refund-desk.toml", "--input", '{"invoice_id": "INV-1001"}'
    )
    assert toml.returncode == 0, toml.stderr
    with EventStore.open(store_url) as store:
        (agent,) = store.definitions.list_agents()
        page, _ = store.list_runs(limit=10)
    assert (agent.format, agent.definition, agent.name) == ("md", REFUND_DESK_MD, "refund-desk")
    assert {run.agent_def_hash for run in page} == {agent.agent_def_hash}
    assert len(page) == 2


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_markdown_agent_file_that_does_not_validate_is_one_sentence(store_url, tmp_path):
    path = tmp_path / "bad.md"
    path.write_text(REFUND_DESK_MD.replace("tools:", "tool:"))
    one_sentence(salvor(store_url, "run", str(path)), "unknown key `tool`", "`tools`")
    assert run_count(store_url) == 0


def test_verbs_in_the_wrong_state_are_refused_and_record_nothing(store_url, agent_file):
    run_id = salvor(store_url, "run", str(agent_file)).stdout.splitlines()[0]
    before = event_total(store_url)
    one_sentence(salvor(store_url, "resolve", run_id, "--output", "{}"), "no dangling write")
    one_sentence(salvor(store_url, "abandon", run_id), "already completed")
    one_sentence(
        salvor(store_url, "resolve", run_id, "--output", "nope"),
        "--output is not valid JSON",
        exit=2,
    )
    one_sentence(salvor(store_url, "replay", run_id), "--dry-run", exit=2)
    assert event_total(store_url) == before
    finished = salvor(store_url, "resume", run_id)
    assert finished.returncode == 0 and "completed" in finished.stdout


def test_a_store_that_cannot_be_opened_is_one_sentence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = salvor(f"sqlite:///{blocker}/under-a-file/salvor.db", "runs")
    one_sentence(result)


def test_a_usage_error_exits_2(store_url):
    result = salvor(store_url, "resolve", "00000000-0000-4000-8000-000000000000")
    assert result.returncode == 2
    assert "--output" in result.stderr


def test_progress_is_shown_on_a_terminal(store_url, agent_file):
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "SALVOR_STORE": store_url}
    process = spawn.salvor_process(
        ["run", str(agent_file)],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
        cwd=REPO,
        text=True,
    )
    os.close(follower)
    stdout, _ = process.communicate(timeout=120)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    progress = b"".join(chunks).decode()
    assert process.returncode == 0
    for kind in ("ModelCallRequested", "ToolCallRequested", "ToolCallCompleted", "RunCompleted"):
        assert kind in progress
    # Scripts reading stdout get only the id and the outcome.
    assert len(stdout.splitlines()) == 2


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
def test_a_store_written_by_a_newer_salvor_is_refused_untouched(store_url):
    from salvor.store import STORE_VERSION, normalize_store_url
    from sqlalchemy import create_engine, text

    EventStore.open(store_url).close()
    engine = create_engine(normalize_store_url(store_url))
    with engine.begin() as connection:
        connection.execute(text("UPDATE store_meta SET value = :v"), {"v": STORE_VERSION + 1})
    result = salvor(store_url, "run", "contrib/agents/refund-desk.toml")
    one_sentence(result, "upgrade salvor")
    with engine.begin() as connection:
        assert (
            connection.execute(text("SELECT value FROM store_meta")).scalar_one()
            == STORE_VERSION + 1
        )
        assert connection.execute(text("SELECT count(*) FROM events")).scalar_one() == 0
    engine.dispose()


def test_a_resume_input_the_schema_rejects_is_refused(store_url, tmp_path, providers):
    provider = providers(tool_loop_script([("request_approval", {})], final_text="ok"))
    path = tmp_path / "gate.toml"
    path.write_text(agent_toml(provider.base_url, tools=["request_approval"]))
    run_id = salvor(store_url, "run", str(path)).stdout.splitlines()[0]
    before = event_total(store_url)
    one_sentence(salvor(store_url, "resume", run_id), "resume it with an input matching")
    one_sentence(
        salvor(store_url, "resume", run_id, "--input", '{"approved": "yes"}'), "$.approved"
    )
    one_sentence(salvor(store_url, "resume", run_id, "--input", "null"), "does not satisfy")
    assert event_total(store_url) == before
    done = salvor(store_url, "resume", run_id, "--input", '{"approved": true}')
    assert done.returncode == 0 and "completed" in done.stdout


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*")}


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["runs"], ["no store at", "--store"]),
        (["log", "00000000-0000-4000-8000-000000000000"], ["no store at"]),
        (["history", "00000000-0000-4000-8000-000000000000"], ["no store at"]),
        (["replay", "00000000-0000-4000-8000-000000000000", "--dry-run"], ["no store at"]),
        (["resume", "00000000-0000-4000-8000-000000000000"], ["no store at"]),
        # The commands that may create a store create none in a directory that is not there.
        (["serve"], ["no directory", "nothing-here", "mkdir -p"]),
        (["run", "contrib/agents/refund-desk.toml"], ["no directory", "nothing-here", "mkdir"]),
        (
            ["graph", "run", "contrib/graphs/publish.json"],
            ["no directory", "nothing-here", "mkdir"],
        ),
    ],
)
def test_a_command_on_a_store_path_that_does_not_exist_creates_nothing(tmp_path, args, fragments):
    missing = tmp_path / "nothing-here" / "salvor.db"
    before = files_under(tmp_path)
    one_sentence(salvor(f"sqlite:///{missing}", *args), *fragments)
    assert files_under(tmp_path) == before, "a refused command created files"


def test_serve_on_a_host_that_does_not_resolve_is_one_sentence(tmp_path):
    before = files_under(tmp_path)
    one_sentence(
        salvor(
            f"sqlite:///{tmp_path / 'salvor.db'}",
            "serve",
            "--listen",
            "salvor-no-such-host.invalid:8420",
        ),
        "--listen host",
        "does not resolve",
    )
    assert files_under(tmp_path) == before, "a refused command created files"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["runs", "--limit", "0"], ["--limit must be a positive whole number", "'0'"]),
        (["runs", "--limit", "ten"], ["--limit must be a positive whole number", "'ten'"]),
        (["runs", "--limit", "-3"], ["--limit must be a positive whole number"]),
        (
            ["runs", "--state", "bogus"],
            ["'bogus' is not a run state", "needs_reconciliation", "abandoned"],
        ),
    ],
)
def test_a_bad_listing_option_is_a_usage_error(store_url, args, fragments):
    EventStore.open(store_url).close()
    one_sentence(salvor(store_url, *args), *fragments, exit=2)


def test_serve_on_a_busy_port_is_one_sentence(tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = salvor(
            f"sqlite:///{tmp_path / 'salvor.db'}", "serve", "--listen", f"127.0.0.1:{port}"
        )
    one_sentence(result, f"cannot listen on 127.0.0.1:{port}", "--listen")


def test_a_process_agent_whose_mcp_server_command_does_not_exist_is_refused_at_registration(
    store_url, tmp_path
):
    path = tmp_path / "agent.toml"
    path.write_text(
        f'name = "p"\nkind = "process"\ncommand = {json.dumps([sys.executable, "-c", "pass"])}\n'
        '[[mcp_servers]]\nname = "notes"\ncommand = ["salvor-no-such-mcp-server", "--stdio"]\n'
    )
    one_sentence(
        salvor(store_url, "run", str(path)),
        "MCP server 'notes'",
        "'salvor-no-such-mcp-server'",
        "not found on PATH",
    )
    assert run_count(store_url) == 0
    path.write_text(
        path.read_text().replace(
            '"salvor-no-such-mcp-server"', json.dumps(str(tmp_path / "agent.toml"))
        )
    )
    one_sentence(
        salvor(store_url, "run", str(path)), "MCP server 'notes'", "is not an executable file"
    )
    assert run_count(store_url) == 0


@pytest.fixture
def immutable():
    """``chattr +i`` on a file for the test (root writes through mode bits, not through this)."""
    marked: list[Path] = []

    def mark(path: Path) -> None:
        done = subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            pytest.skip(
                f"chattr +i is not available here ({done.stderr.strip() or 'not found'}); "
                "install e2fsprogs and run on a filesystem that supports it"
            )
        marked.append(path)

    yield mark
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_serve_over_a_store_whose_shm_it_cannot_write_is_one_sentence_not_a_signal(
    tmp_path, immutable
):
    db = tmp_path / "salvor.db"
    # A salvor SIGKILLed with the store open leaves its -wal and -shm behind;
    # this test process never maps them itself (a write through its own
    # mapping would be its own SIGBUS).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom salvor.store import EventStore\n"
                f"s = EventStore.open({f'sqlite:///{db}'!r}); s.list_runs(); "
                "print('open', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
    finally:
        holder.kill()
        holder.wait()
    shm = db.with_name(db.name + "-shm")
    assert shm.exists() and shm.stat().st_size > 0
    immutable(shm)
    result = salvor(f"sqlite:///{db}", "serve", "--listen", "127.0.0.1:0")
    assert result.returncode != -7, "salvor serve died of SIGBUS"
    one_sentence(result, f"{shm} is not writable")


def test_a_first_run_creates_the_default_store_and_the_directories_above_it(tmp_path):
    # The README's first command on a fresh machine: no --store, no SALVOR_STORE, a state
    # directory nobody has made yet.
    env = {k: v for k, v in os.environ.items() if k not in ("SALVOR_STORE", "STATE_DIRECTORY")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    result = salvor_in_process(
        "run",
        "contrib/agents/refund-desk.toml",
        "--input",
        '{"invoice_id": "INV-1"}',
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "state" / "salvor" / "salvor.db").exists()
