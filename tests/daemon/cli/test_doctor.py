"""`salvor doctor AGENT`: a real process agent, started once against a canned proxy.

Everything is real: the CLI as a subprocess (a refusal before any agent starts is read from
``main(argv)`` in the test's process), the agents as scripts on the
real openai and anthropic SDKs (the same AGENT the process-run tests use).
No model and no store are involved; the assertions are on the exit status
and the report's text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon.agents.test_process_agent import AGENT, MODES
from tests.support.cli import salvor_in_process
from tests.support.processes import wait_gone
from tests.support.spawn import run_salvor

REPO = Path(__file__).resolve().parents[3]


def doctor(
    tmp_path: Path, *args: str, extra_env: dict[str, str] | None = None, refused: bool = False
) -> subprocess.CompletedProcess:
    """``salvor doctor ARGS`` as a subprocess; one expected to be ``refused`` before it starts an
    agent runs in this process instead (tests/support/cli), its answer being all there is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    env.update(extra_env or {})
    # Were doctor to open a store, this is where it would appear.
    env["SALVOR_STORE"] = str(tmp_path / "must-not-exist.db")
    if refused:
        result = salvor_in_process("doctor", *args, env=env, cwd=REPO)
    else:
        result = run_salvor(
            ["doctor", *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
        )
    # Never a traceback of doctor's own (an agent's shows, indented, in its stderr tail).
    assert "Traceback" not in result.stderr, result.stderr
    assert not any(line.startswith("Traceback") for line in result.stdout.splitlines()), (
        result.stdout
    )
    assert not (tmp_path / "must-not-exist.db").exists()
    return result


def definition(
    tmp_path: Path, script: str, *args: str, env: dict | None = None, extra: str = ""
) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(script)
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(path), *args])}\n'
        f"cwd = {json.dumps(str(tmp_path))}\n{extra}\n[env]\n{env_table}"
    )
    return toml


def sdk_agent(tmp_path: Path, mode: str, **env: str) -> Path:
    return definition(tmp_path, AGENT, mode, env={"PIDFILE": str(tmp_path / "agent.pid"), **env})


def expected_wire(mode: str) -> str:
    """How the report names the wire and path an AGENT mode calls."""
    if mode.startswith("openai-responses"):
        return "OpenAI responses (POST /v1/responses"
    if mode.startswith("openai"):
        return "OpenAI chat completions (POST /v1/chat/completions"
    return "Anthropic messages (POST /v1/messages"


@pytest.mark.parametrize("mode", MODES)
def test_a_real_sdk_agent_passes_with_its_wire_path_and_model_named(tmp_path, mode):
    result = doctor(tmp_path, str(sdk_agent(tmp_path, mode)))
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert lines[1] == "proxy: 1 model call reached it"
    how = "streamed" if mode.endswith("stream") else "not streamed"
    assert lines[2] == f"  1 x {expected_wire(mode)}, {how}), model 'scripted-model'"
    assert lines[3] == "process: exited with code 0"
    assert lines[-1].startswith("ok: ")
    assert result.stderr == ""


def test_json_says_the_same_as_fields(tmp_path):
    agent = str(sdk_agent(tmp_path, MODES[0]))
    text = doctor(tmp_path, agent)
    result = doctor(tmp_path, agent, "--json")
    assert result.returncode == 0 and result.stderr == "", result
    (line,) = result.stdout.splitlines()
    answer = json.loads(line)
    assert answer["reached"] is True
    assert answer["process"] == {"exit_code": 0, "timed_out": False, "start_error": None}
    (request,) = answer["requests"]
    assert request["model"] == "scripted-model" and request["status"] == 200, request
    assert request["request"].startswith("POST /v1/"), request
    assert answer["report"] == text.stdout.splitlines()


def test_the_agent_gets_the_injection_a_run_gets(tmp_path):
    seen = tmp_path / "env.json"
    script = (
        "import json, os, sys\n"
        "keys = ['OPENAI_BASE_URL', 'ANTHROPIC_BASE_URL', 'OPENAI_API_KEY', 'SALVOR_PROMPT', "
        "'SALVOR_INPUT', 'SALVOR_RUN_ID']\n"
        f"open({str(seen)!r}, 'w').write(json.dumps({{k: os.environ.get(k) for k in keys}}))\n"
    )
    result = doctor(tmp_path, str(definition(tmp_path, script)), "--input", "check the wiring")
    assert result.returncode == 1
    env = json.loads(seen.read_text())
    assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and env[
        "OPENAI_BASE_URL"
    ].endswith("/v1")
    assert env["ANTHROPIC_BASE_URL"] + "/v1" == env["OPENAI_BASE_URL"]
    assert env["OPENAI_API_KEY"] == "salvor-placeholder"
    assert (env["SALVOR_PROMPT"], env["SALVOR_INPUT"]) == ("check the wiring", '"check the wiring"')
    assert env["SALVOR_RUN_ID"]


def test_the_agent_gets_none_of_doctor_s_own_environment_beyond_the_allow_list(tmp_path):
    seen = tmp_path / "env.json"
    script = f"import json, os\nopen({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
    secret = "sk-vendor-SECRET-d0c7"
    doctor(
        tmp_path,
        str(definition(tmp_path, script)),
        extra_env={"VENDOR_BILLING_KEY": secret, "LC_TIME": "C"},
    )
    env = json.loads(seen.read_text())
    assert "VENDOR_BILLING_KEY" not in env and secret not in json.dumps(env)
    assert (
        env["LC_TIME"] == "C"
        and env["PATH"] == os.environ["PATH"]
        and env["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    )


def test_an_agent_that_exits_0_without_a_call_is_told_its_client_ignored_the_base_url(tmp_path):
    result = doctor(tmp_path, str(definition(tmp_path, "print('done, no model needed')\n")))
    assert result.returncode == 1, result
    assert "proxy: no model call reached it" in result.stdout
    assert "process: exited with code 0" in result.stdout
    assert (
        "its client never honoured OPENAI_BASE_URL (OpenAI clients) or ANTHROPIC_BASE_URL"
        in result.stdout
    )


def test_an_env_that_points_the_client_elsewhere_is_named(tmp_path):
    agent = sdk_agent(tmp_path, "openai", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    result = doctor(tmp_path, str(agent))
    assert result.returncode == 1, result
    assert "proxy: no model call reached it" in result.stdout
    assert (
        "diagnosis: the definition's `env` replaces the base URL salvor injects "
        "(OPENAI_BASE_URL='http://127.0.0.1:9/v1')"
    ) in result.stdout
    assert "exited with code 1 before reaching the proxy" in result.stdout
    assert "APIConnectionError" in result.stdout  # the tail of its own traceback


def test_an_agent_exiting_3_fails_with_its_code_and_stderr_tail(tmp_path):
    script = (
        "import sys\nprint('starting', file=sys.stderr)\nprint('fatal: no config file', "
        "file=sys.stderr)\nsys.exit(3)\n"
    )
    result = doctor(tmp_path, str(definition(tmp_path, script)))
    assert result.returncode == 1, result
    assert "process: exited with code 3" in result.stdout
    assert (
        "diagnosis: the agent exited with code 3 before reaching the proxy; its stderr ended "
        "with:\n    starting\n    fatal: no config file"
    ) in result.stdout


def test_a_request_to_a_path_the_proxy_does_not_serve_is_named(tmp_path):
    script = (
        "import os, httpx\n"
        "r = httpx.post(os.environ['OPENAI_BASE_URL'] + '/embeddings', json={'model': 'm', "
        "'input': 'x'})\nraise SystemExit(0 if r.status_code == 404 else 9)\n"
    )
    result = doctor(tmp_path, str(definition(tmp_path, script)))
    assert result.returncode == 1, result
    assert (
        "diagnosis: the agent asked the proxy for POST /v1/embeddings, which it does not serve"
        in result.stdout
    )
    assert "POST /v1/chat/completions (OpenAI chat completions)" in result.stdout
    assert "process: exited with code 0" in result.stdout


@pytest.mark.parametrize(
    ("headers", "status"),
    [("{'content-type': 'application/json'}", 400), ("{}", 415)],
    ids=["not-an-object", "not-said-to-be-json"],
)
def test_a_body_the_proxy_cannot_read_is_named_with_its_status(tmp_path, headers, status):
    script = (
        "import os, httpx\n"
        "httpx.post(os.environ['OPENAI_BASE_URL'] + '/chat/completions', content=b'[1, 2]', "
        f"headers={headers})\n"
    )
    result = doctor(tmp_path, str(definition(tmp_path, script)))
    assert result.returncode == 1, result
    assert (
        "diagnosis: the proxy turned down POST /v1/chat/completions "
        f"({status}) before it became a model call" in result.stdout
    )
    assert ("Content-Type: application/json" in result.stdout) is (status == 415)
    assert "never honoured" not in result.stdout


def test_a_hung_agent_is_killed_at_the_timeout_with_its_whole_group(tmp_path):
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(120)\n"
    )
    # The definition allows five minutes; --timeout is what bounds the check.
    result = doctor(
        tmp_path, str(definition(tmp_path, script, extra="timeout = 300")), "--timeout", "1.5"
    )
    assert result.returncode == 1, result
    assert "process: killed with its process group after the 1.5s timeout" in result.stdout
    assert (
        "diagnosis: the agent ran past the 1.5s timeout without a model call reaching the proxy"
        in result.stdout
    )
    agent, child = map(int, pids.read_text().split())
    assert wait_gone(agent) and wait_gone(child)


@pytest.mark.parametrize(
    ("text", "args", "fragment"),
    [
        ('kind = "process"\n', (), "a process agent needs `command`"),
        ('kind = "process"\ncommand = ["true"]\nspeed = 3\n', (), "unknown field `speed`"),
        ('model = "m"\n', (), 'doctor checks process agents (kind = "process")'),
        (
            'kind = "service"\nurl = "http://127.0.0.1:8088/task"\nproxy_port = 4646\n',
            (),
            "is a service agent, which salvor does not start",
        ),
        (
            'kind = "process"\ncommand = ["true"]\n',
            ("--timeout", "0"),
            "--timeout 0 must be a positive number",
        ),
        (
            'kind = "process"\ncommand = ["true"]\n',
            ("--timeout", "nan"),
            "must be a positive number",
        ),
    ],
)
def test_a_bad_definition_or_option_is_one_sentence_and_exit_2(tmp_path, text, args, fragment):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    result = doctor(tmp_path, str(path), *args, refused=True)
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("salvor: ") and fragment in lines[0], (
        result.stderr
    )


def test_a_missing_file_and_a_stored_hash_are_refused_with_exit_2(tmp_path):
    missing = doctor(tmp_path, str(tmp_path / "nope.toml"), refused=True)
    assert missing.returncode == 2 and "cannot read agent file" in missing.stderr
    stored = doctor(tmp_path, "sha256:" + "0" * 64, refused=True)
    assert stored.returncode == 2 and "opens no store" in stored.stderr
    assert len(stored.stderr.strip().splitlines()) == 1


def test_ctrl_c_kills_the_agent_group_and_says_so_in_one_line(tmp_path):
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    # A background process may inherit SIGINT ignored, where a terminal's
    # Ctrl-C is not: the wrapper restores it before it becomes salvor (an exec'd one, then: what
    # it tests is the disposition a process starts with).
    argv = [sys.executable, "-m", "salvor.daemon.cli", "doctor", str(definition(tmp_path, script))]
    wrapper = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        f"os.execv(sys.executable, {argv!r})"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", wrapper],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and pids.read_text()):
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert (
        err.strip()
        == "salvor: doctor interrupted before the agent finished; its process group was killed"
    )
    agent, child = map(int, pids.read_text().split())
    assert wait_gone(agent) and wait_gone(child)
