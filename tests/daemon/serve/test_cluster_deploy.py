"""The README's three-node deployment ("Many machines"), started as written: three real `salvor
serve` over one PostgreSQL, each the system unit's ExecStart with its host's env file from
contrib/cluster (the addresses moved to the test's loopback ports, the store to the test's
schema, the token to the test's, and the scripted model declared with --model-endpoint), behind
the contrib cluster site's nginx upstream (the nginx half is skipped where nginx is not
installed, naming the package; then the test talks to the nodes directly).

Through the front: runs start, one run's stream is watched on every node while one node drives
it, the node driving it is SIGKILLed mid-call, and the run finishes through the front (a peer
took it over); a stream cut with the dead node resumes through the front from its last id; a
run started after the kill finishes too. Each node's /metrics says which node it is and what the
cluster did (renewals, the takeover, the change feed's notices). The three nodes share this
machine, so the kernel proves the killed one dead at once and its run is taken over without
waiting out the lease (on three hosts the same takeover comes once the lease has lapsed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from salvor.protocol import RunState
from salvor.store import EventStore

from tests.chaos.test_cluster_takeover import Held, script
from tests.chaos.test_kill_serve import agent_toml, assert_log_valid
from tests.daemon.serve.test_deploy import expand_command, service_settings
from tests.support.ports import free_port
from tests.support.readme import sh_blocks
from tests.support.scripted_provider import ScriptedProvider
from tests.support.spawn import ONE_PROCESS, salvor_process

pytestmark = pytest.mark.kill
# The deployment is three hosts over one PostgreSQL: there is no SQLite form of it.
STORE_BACKENDS = ("postgres",)

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "contrib" / "cluster"
UNIT = REPO / "systemd" / "salvor.service"
SITE = CLUSTER / "salvor-cluster.conf"
TOKEN = "cluster-deploy-test-token"
BALANCER = "10.0.0.10"  # the env files' --trusted-proxy: nginx's address
WAIT = 45.0
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def env_file(path: Path) -> dict[str, str]:
    """An EnvironmentFile's assignments (systemd's plain ``KEY=VALUE`` lines)."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def test_the_readme_deploys_the_files_this_test_starts() -> None:
    steps = "\n".join(sh_blocks("### Many machines"))
    assert "sudo cp systemd/salvor.service /etc/systemd/system/" in steps
    # The unit reads /etc/salvor/env (tests/daemon/serve/test_deploy.py holds it to that).
    assert "contrib/cluster/node1.env /etc/salvor/env" in steps
    assert "node2.env, node3.env on the others" in steps
    assert "contrib/cluster/salvor-cluster.conf /etc/nginx/sites-available/salvor" in steps
    assert service_settings(UNIT)["EnvironmentFile"] == ["-/etc/salvor/env"]


def until(check, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:g}s: {what}")


class Node:
    """One host of the deployment: the unit's ExecStart with that host's env file."""

    def __init__(self, index: int, tmp_path: Path, store_url: str, model_url: str) -> None:
        self.index = index
        self.tmp_path = tmp_path / f"node{index}"
        self.tmp_path.mkdir()
        settings = env_file(CLUSTER / f"node{index}.env")
        # The file is a host's: its own address, one shared store and token, its name.
        assert settings["SALVOR_LISTEN"] == f"10.0.0.{index}:8420"
        assert settings["SALVOR_STORE"].startswith("postgresql://")
        flags = settings["SALVOR_SERVE_FLAGS"].split()
        assert flags[flags.index("--node-name") + 1] == f"node{index}"
        assert flags[flags.index("--auth-token") + 1] == "SALVOR_TOKEN"
        assert flags[flags.index("--trusted-proxy") + 1] == BALANCER
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        service = service_settings(UNIT)
        unit_env = dict(a.partition("=")[::2] for a in service.get("Environment", []))
        # The unit's Environment=, then its EnvironmentFile= (which wins), moved to this test.
        moved = {
            **unit_env,
            **settings,
            "SALVOR_STORE": store_url,
            "SALVOR_LISTEN": f"127.0.0.1:{self.port}",
            "SALVOR_TOKEN": TOKEN,
            "SALVOR_SERVE_FLAGS": settings["SALVOR_SERVE_FLAGS"].replace(BALANCER, "127.0.0.1")
            + f" --model-endpoint {model_url}"
            # Three hosts on one machine of two cores: each node serves as one process (on a
            # host of its own each of its cores would be a node, --workers auto), so a node's
            # scrape, stream count and SIGKILL are one process's.
            + " "
            + " ".join(ONE_PROCESS),
        }
        argv = expand_command(service["ExecStart"][-1], moved)
        assert argv[1:4] == ["serve", "--listen", f"127.0.0.1:{self.port}"], argv
        self.args = argv[1:]
        self.notify_path = self.tmp_path / "notify.sock"
        self.env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("SALVOR_", "NOTIFY_", "WATCHDOG_"))
            },
            **moved,
            "NOTIFY_SOCKET": str(self.notify_path),
            "PYTHONUNBUFFERED": "1",
        }
        self.notify: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.node_id: str | None = None

    def spawn(self) -> None:
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        with open(self.tmp_path / "serve.log", "wb") as log:
            self.proc = salvor_process(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                if b"READY=1" in self.notify.recv(4096).split(b"\n"):
                    return
            except TimeoutError:
                pass
            assert self.proc.poll() is None, f"node{self.index} exited\n{self.log()}"
            assert time.monotonic() < deadline, f"node{self.index} not READY\n{self.log()}"

    def log(self) -> str:
        return (self.tmp_path / "serve.log").read_text(errors="replace")[-6000:]

    def metrics(self) -> dict[tuple, float]:
        """This node's /metrics, scraped at its own address (as an operator scrapes each node)."""
        response = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        assert response.status_code == 200, response.text
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }

    def info(self) -> dict[str, str]:
        (labels,) = [dict(labels) for name, labels in self.metrics() if name == "salvor_node_info"]
        return labels

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.notify is not None:
            self.notify.close()


def nginx_front(tmp_path: Path, nodes: list[Node]) -> tuple[subprocess.Popen, str]:
    """nginx running the contrib cluster site, its listen and upstream moved to the test's."""
    port = free_port()
    site = SITE.read_text()
    site = re.sub(r"^\s*listen \[::\]:80;\n", "", site, flags=re.MULTILINE)
    site = site.replace("listen 80;", f"listen 127.0.0.1:{port};")
    for node in nodes:
        server = f"server 10.0.0.{node.index}:8420 "
        assert server in site, server
        site = site.replace(server, f"server 127.0.0.1:{node.port} ")
    (tmp_path / "site.conf").write_text(site)
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    temp_paths = "".join(
        f"  {kind}_temp_path {temp / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # Run as root, nginx's workers would switch to `nobody`, who cannot enter pytest's tmp_path.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"{user}pid {tmp_path / 'nginx.pid'};\nerror_log {tmp_path / 'nginx-error.log'};\n"
        f"events {{}}\nhttp {{\n  access_log off;\n{temp_paths}  include "
        f"{tmp_path / 'site.conf'};\n}}\n"
    )
    command = [NGINX, "-c", str(conf), "-p", str(tmp_path), "-e", str(tmp_path / "nginx-error.log")]
    checked = subprocess.run(
        [*command, "-t"], check=False, capture_output=True, text=True, timeout=WAIT
    )
    assert checked.returncode == 0, checked.stderr
    proxy = subprocess.Popen(
        [*command, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def listening() -> bool:
        assert proxy.poll() is None, (tmp_path / "nginx-error.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    until(listening, "nginx listening")
    return proxy, f"http://127.0.0.1:{port}"


class Stream:
    """One SSE reader of a run in a thread of its own: every frame it got, and how it ended."""

    def __init__(self, url: str, run_id: str, last_id: str | None = None) -> None:
        self.seqs: list[int] = []
        self.end: dict | None = None
        self.broken: str | None = None
        self.open = threading.Event()
        self.done = threading.Event()
        headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        self._thread = threading.Thread(target=self._read, args=(url, run_id, headers), daemon=True)
        self._thread.start()

    def _read(self, url: str, run_id: str, headers: dict) -> None:
        try:
            timeout = httpx.Timeout(10, read=WAIT)
            with httpx.stream(
                "GET", f"{url}/v1/runs/{run_id}/events", headers=headers, timeout=timeout
            ) as response:
                assert response.status_code == 200, response.read()
                self.open.set()
                event, data = "message", None
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line.partition(":")[2].strip()
                    elif line.startswith("data:"):
                        data = json.loads(line.partition(":")[2])
                    elif line == "" and data is not None:
                        if event == "end":
                            self.end = data
                            return
                        self.seqs.append(data["seq"])
                        event, data = "message", None
            self.broken = "the stream closed without its end frame"
        except (httpx.HTTPError, AssertionError) as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
        finally:
            self.open.set()
            self.done.set()


@pytest.fixture(
    params=[
        "direct",
        pytest.param(
            "nginx",
            marks=pytest.mark.skipif(
                NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light)"
            ),
        ),
    ]
)
def deployment(request, tmp_path: Path, store_url: str):
    hook = Held()
    provider = ScriptedProvider(script, on_call=hook)
    nodes = [Node(index, tmp_path, store_url, provider.base_url) for index in (1, 2, 3)]
    proxy = None
    try:
        for node in nodes:
            node.spawn()
        for node in nodes:
            node.wait_ready()
        front = None
        if request.param == "nginx":
            proxy, front = nginx_front(tmp_path, nodes)
        yield nodes, front, hook, provider
    finally:
        hook.released.set()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=WAIT)
        for node in nodes:
            node.stop()
        provider.stop()


def test_the_three_node_deployment_finishes_a_killed_nodes_run_through_the_front(
    deployment, store_url: str
) -> None:
    nodes, front, hook, provider = deployment
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # Through nginx; or ("direct") each request to the nodes in turn, as a balancer would send
    # them.
    targets = [front] if front is not None else [node.url for node in nodes]
    clients = [httpx.Client(base_url=url, headers=headers, timeout=10) for url in targets]
    turn = iter(range(10**6))

    def client() -> httpx.Client:
        return clients[next(turn) % len(clients)]

    def live_client() -> httpx.Client:
        # Without nginx nothing skips a dead node: only live ones are asked.
        for _ in range(len(clients)):
            chosen = client()
            if front is not None or any(
                n.url == str(chosen.base_url).rstrip("/") and n.proc.poll() is None for n in nodes
            ):
                return chosen
        raise AssertionError("no live node")

    try:
        by_id = {}
        for node in nodes:
            info = node.info()
            assert info["node"] == f"node{node.index}"
            by_id[info["node_id"]] = node
        agent = client().post(
            "/v1/agents",
            content=agent_toml(provider.base_url, tools=()),
            headers={"Content-Type": "application/toml"},
        )
        assert agent.status_code == 201, agent.text
        agent = agent.json()["agent"]

        def start() -> str:
            run_id = str(uuid.uuid4())
            body = {"agent": agent, "run_id": run_id, "input": {"plan": [], "hold_at": 0}}
            response = live_client().post("/v1/runs", json=body)
            assert response.status_code == 201, response.text
            return run_id

        runs = [start() for _ in range(3)]
        hook.wait_held(len(runs))  # each run's one model call is in flight on its node
        watched = runs[0]
        status = live_client().get(f"/v1/runs/{watched}").json()
        assert status["driver"] == "attached", status
        driver = by_id[status["driver_node"]]

        # The watched run's stream on every node: through nginx, three streams in a row (the
        # upstream's least_conn hands each to the node with none yet); directly, one per node.
        streams = []
        for node in nodes:
            streams.append(Stream(front or node.url, watched))
            assert streams[-1].open.wait(WAIT) and streams[-1].broken is None, streams[-1].broken
        until(
            lambda: all(
                n.metrics()[("salvor_stream_subscribers", (("transport", "sse"),))] == 1
                for n in nodes
            ),
            "one stream of the run on each node",
        )

        # The node driving it dies mid-call; the held calls go (the dead node's to nobody).
        driver.proc.send_signal(signal.SIGKILL)
        driver.proc.wait()
        hook.picking = False
        hook.released.set()

        def completed(run_id: str) -> dict | None:
            body = live_client().get(f"/v1/runs/{run_id}").json()
            return body if body["status"]["state"] == RunState.COMPLETED.value else None

        for run_id in runs:
            until(lambda run_id=run_id: completed(run_id), f"run {run_id} completed")
        after = start()
        until(lambda: completed(after), "a run started after the kill completed")

        # The streams on the live nodes carried the run to its end though neither drove it;
        # the one the dead node served broke, and resumes through the front from its last id.
        survivors = [n for n in nodes if n is not driver]
        for stream in streams:
            assert stream.done.wait(WAIT)
        ended = [s for s in streams if s.end is not None]
        assert len(ended) >= 2, [s.broken for s in streams]
        for stream in streams:
            if stream.end is None:
                last = str(stream.seqs[-1]) if stream.seqs else None
                resumed = Stream(targets[0] if front else survivors[0].url, watched, last)
                assert resumed.done.wait(WAIT) and resumed.end is not None, resumed.broken
                stream.seqs += resumed.seqs
                stream.end = resumed.end
        with EventStore.open(store_url) as store:
            log = store.read_log(watched)
            assert_log_valid(log)
            for run_id in [*runs, after]:
                assert store.read_view(run_id).state is RunState.COMPLETED
            owner = store.owners.owner(watched).node_id
        for stream in streams:
            assert stream.seqs == [e.seq for e in log], stream.seqs
            assert stream.end["status"]["state"] == "completed", stream.end
        assert by_id[owner] in survivors

        # What each live node's /metrics says of the cluster.
        scraped = [node.metrics() for node in survivors]
        assert sum(s[("salvor_takeovers_total", ())] for s in scraped) >= 1
        for node, samples in zip(survivors, scraped, strict=True):
            assert samples[("salvor_lease_renewals_total", ())] > 0, node.index
            assert samples[("salvor_lease_open", ())] == 1, node.index
            assert samples[("salvor_appends_fenced_total", ())] == 0, node.index
        # A node that streamed the run while a peer drove it heard the peer's commits.
        assert any(s[("salvor_change_feed_notices_total", ())] > 0 for s in scraped)
    finally:
        for each in clients:
            each.close()
