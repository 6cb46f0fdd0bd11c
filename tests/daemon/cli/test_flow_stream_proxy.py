"""The graph-run stream through a real nginx (the shipped ``contrib/nginx`` site) whose read timeout
for ``POST /v1/graph-runs`` is shorter than a node of the flow: ``salvor graph run --remote``
through the proxy gets every line and the result while the daemon's keepalive
(``--stream-keepalive``) is shorter than that timeout, and loses the stream when it is longer.

The timeout is lowered to 2 s in the test's copy of the site (60 s as shipped, with the daemon's
15 s keepalive); the node is an agent whose model answer the scripted provider holds for 4 s.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.daemon.api.test_flow_uploads import _wait_listening
from tests.daemon.cli.test_flow_remote import _agent, _echo
from tests.daemon.serve.test_deploy import SITE, nginx_command, nginx_config
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.ports import free_port
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

READ_TIMEOUT = "2s"
# Longer than the proxy's read timeout: nothing but keepalives crosses the proxy meanwhile.
NODE_SECONDS = 4.0

FLOW = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
edges: []
"""


def _slow(call: ProviderCall) -> None:
    time.sleep(NODE_SECONDS)


def _stream_location(site: str) -> str:
    found = re.search(r"location = /v1/graph-runs \{[^}]*\}", site)
    assert found, "the site has no location for the graph-run stream"
    return found.group(0)


def test_the_shipped_site_streams_graph_runs_unbuffered_within_a_minute_of_silence() -> None:
    location = _stream_location(SITE.read_text())
    assert "proxy_buffering off;" in location
    # The daemon's default keepalive (15 s) is well under it.
    assert "proxy_read_timeout 60s;" in location


@pytest.fixture
def proxied(tmp_path: Path, store_url: str):
    """A daemon in an empty directory of its own, nginx in front with the short read timeout,
    the project's flow file; yields (daemon, the proxy's URL, the flow file)."""
    with ScriptedProvider(_echo, on_call=_slow) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        flows = tmp_path / "proj" / ".salvor" / "flows"
        flows.mkdir(parents=True)
        (tmp_path / "proj" / "agents" / "prompts").mkdir(parents=True)
        (tmp_path / "proj" / "agents" / "echo.toml").write_text(_agent(provider.base_url))
        (tmp_path / "proj" / "agents" / "prompts" / "echo.txt").write_text("You echo.")
        (flows / "main.yaml").write_text(FLOW)
        proxy_port = free_port()
        conf = nginx_config(tmp_path, listen_port=proxy_port, daemon_port=daemon.port)
        site_file = tmp_path / "site.conf"
        site = site_file.read_text()
        location = _stream_location(site)
        short = location.replace("proxy_read_timeout 60s;", f"proxy_read_timeout {READ_TIMEOUT};")
        assert short != location
        site_file.write_text(site.replace(location, short))
        proxy = subprocess.Popen(
            nginx_command(conf, "-g", "daemon off;"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(proxy_port, proxy)
            yield daemon, f"http://127.0.0.1:{proxy_port}", flows / "main.yaml"
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
            daemon.kill()


def _run(url: str, flow: Path) -> subprocess.CompletedProcess[str]:
    return salvor_in_process(
        "graph", "run", str(flow), "--remote", url, "--input", '"slow"', env={"PATH": "/usr/bin"}
    )


def test_a_node_slower_than_the_proxy_read_timeout_streams_through_on_keepalives(
    proxied,
) -> None:
    daemon, url, flow = proxied
    daemon.args += ["--stream-keepalive", "0.5"]
    daemon.start()
    ran = _run(url, flow)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout.splitlines()
    assert out[1:] == [
        "node answer entered",
        "node answer finished",
        f'run {out[0]} completed: {{"answer": "<slow>"}}',
    ]


def test_a_keepalive_longer_than_the_proxy_read_timeout_loses_the_stream(proxied) -> None:
    daemon, url, flow = proxied
    daemon.args += ["--stream-keepalive", "30"]
    daemon.start()
    ran = _run(url, flow)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    run_id = ran.stdout.splitlines()[0]
    assert ran.stdout.splitlines()[1:] == ["node answer entered"]
    assert "closed before the flow finished" in ran.stderr and "it may have run" in ran.stderr
    assert f"/v1/runs/{run_id}/events" in ran.stderr
    # The run did not need the caller: it completes on the daemon all the same.
    with daemon.client(timeout=30) as client:
        deadline = time.monotonic() + 60
        while client.get(f"/v1/runs/{run_id}").json()["status"]["state"] != "completed":
            assert time.monotonic() < deadline, "the run never completed"
            time.sleep(0.1)
