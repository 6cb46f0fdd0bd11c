"""A page of another origin, in a real Chromium, cannot drive the daemon or read it (issue 29), with
a token or without:

* a ``no-cors`` fetch from another loopback origin, its body with no ``Content-Type`` or as
  ``text/plain``, starts no run and answers no run's gate;
* a WebSocket it opens to ``/v1/ws`` is refused at the handshake and reads nothing;
* a page whose name is rebound to 127.0.0.1 (``--host-resolver-rules``: the browser resolves
  ``rebound.test`` to the daemon, as a DNS answer with a short TTL would) is its own origin to the
  browser, so it may read what it is answered, and the daemon refuses it by its ``Host``: it
  registers no process agent, starts nothing, runs nothing, reads no run.

Each time the store is checked afterwards: nothing new in it. Without a token, today's main let
each of these through; with one, the token already stopped them and the test holds that it still
does (the listener refuses them first now). The daemon's own page keeps working: the other page
tests run against the same listener.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.daemon.dashboard.page import AGENTS, Page, page_on_a_daemon

TOKEN = "cross-site-token-5e1f0a9b"
REBOUND = "rebound.test"
SCRIPT_SECONDS = 30


class _Elsewhere(BaseHTTPRequestHandler):
    """Another site's page: a blank document on another loopback origin."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>elsewhere</title><p>another site"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[str]:
    """The URL of another site's page (127.0.0.1 on another port: another origin)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["no-token", "token"])
def page(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    # A daemon without a token may not start programs on TCP at all (it refuses to start so);
    # with one, it may, and a rebound page still registers no program.
    programs = ["--allow-process-agents"] if request.param else []
    with page_on_a_daemon(
        tmp_path_factory.mktemp("cross-site"),
        *programs,
        token=request.param,
        browser_arguments=[f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"],
    ) as opened:
        opened.driver.set_script_timeout(SCRIPT_SECONDS)
        yield opened


def stored(page: Page) -> tuple[list, list, list]:
    """What the store holds that a request could add: the runs with their states and event
    counts, the agents, the graphs."""
    runs = page.call("GET", "/v1/runs")["runs"]
    return (
        sorted((r["run"], r["status"]["state"], r["event_count"]) for r in runs),
        page.call("GET", "/v1/agents")["agents"],
        page.call("GET", "/v1/graphs")["graphs"],
    )


# Sent from the other site's page: a no-cors fetch is a "simple" request, sent without asking the
# daemon first, whatever it answers (the page cannot read it, and needs not to).
NO_CORS_POSTS = """
const [daemon, agent, suspended, done] = arguments;
const start = JSON.stringify({agent, input: {invoice_id: "INV-CROSS"}});
const approve = JSON.stringify({input: {answer: true}});
const send = (path, body) => fetch(daemon + path, {method: "POST", mode: "no-cors", body})
  .then(() => "sent", (failure) => String(failure));
done(await Promise.all([
  send("/v1/runs", new Blob([start])),            // no Content-Type at all
  send("/v1/runs", start),                        // text/plain;charset=UTF-8
  send(`/v1/runs/${suspended}/resume`, new Blob([approve])),
  send(`/v1/runs/${suspended}/resume`, approve),
  send("/v1/graphs", new Blob(['{"schema_version": 1, "nodes": [], "edges": []}'])),
]));
"""


def test_a_no_cors_post_from_another_origin_starts_nothing_and_answers_no_gate(
    page: Page, elsewhere: str
) -> None:
    agent = page.register(AGENTS / "refund-desk.toml")
    question = {"question": "Refund INV-9?", "type": "confirm"}
    suspended = page.start_run(AGENTS / "ask-operator.toml", question)
    page.wait_state(suspended, "suspended")
    before = stored(page)

    page.driver.get(elsewhere)
    sent = page.driver.execute_async_script(NO_CORS_POSTS, page.url, agent, suspended)
    assert sent == ["sent"] * 5, sent  # each went out (an opaque answer), none failed to send

    # The daemon answers a request before the next one on its connection: by now every one of
    # them has been refused, or has recorded what it would record.
    assert stored(page) == before
    assert page.status(suspended)["state"] == "suspended"


WEBSOCKET = """
const [url, run, done] = arguments;
const seen = {opened: false, messages: []};
const socket = new WebSocket(url);
socket.onopen = () => {
  seen.opened = true;
  socket.send(JSON.stringify({op: "watch_runs"}));
  socket.send(JSON.stringify({op: "subscribe", run, from_seq: 0}));
};
socket.onmessage = (message) => {
  seen.messages.push(message.data);
  socket.close();
};
socket.onclose = (closed) => done({...seen, code: closed.code});
"""


def test_a_websocket_from_another_origin_is_refused_and_reads_nothing(
    page: Page, elsewhere: str
) -> None:
    secret = {"customer_email": "ada@example.com", "invoice_id": "INV-SECRET"}
    run_id = page.start_run(AGENTS / "refund-desk.toml", secret)
    page.wait_state(run_id, "completed")

    page.driver.get(elsewhere)
    url = page.url.replace("http://", "ws://", 1) + "/v1/ws"
    seen = page.driver.execute_async_script(WEBSOCKET, url, run_id)
    assert seen["opened"] is False, seen
    assert seen["messages"] == [], seen
    assert seen["code"] == 1006  # refused at the handshake: it never was a WebSocket


REBOUND_PAGE = """
const [agent, done] = arguments;
const answers = {};
const call = async (name, path, init) => {
  const answer = await fetch(path, init);
  answers[name] = {status: answer.status, body: await answer.text()};
};
await call("register", "/v1/agents",
  {method: "POST", headers: {"Content-Type": "application/toml"}, body: agent});
const registered = answers.register.status === 201 && JSON.parse(answers.register.body).agent;
await call("start", "/v1/runs", {
  method: "POST",
  headers: {"Content-Type": "application/json"},
  body: JSON.stringify({agent: registered || "sha256:" + "0".repeat(64), input: "x"}),
});
await call("runs", "/v1/runs");
await call("health", "/v1/health");
done(answers);
"""


def test_a_rebound_name_is_refused_every_request_and_runs_no_program(
    page: Page, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-as-the-daemons-user"
    agent = (
        'name = "rebound"\nkind = "process"\n'
        f"command = {json.dumps(['sh', '-c', f'id > {marker}'])}\ntimeout = 30\n"
    )
    before = stored(page)

    # To the browser this page is http://rebound.test:PORT, and every request it makes is
    # same-origin: it could read each answer, if it got one.
    page.driver.get(f"http://{REBOUND}:{page.daemon.port}/")
    answers = page.driver.execute_async_script(REBOUND_PAGE, agent)
    for name, answer in answers.items():
        assert answer["status"] == 403, (name, answer)
        refusal = json.loads(answer["body"])["error"]
        assert refusal["code"] == "forbidden" and REBOUND in refusal["message"], refusal
    assert stored(page) == before
    assert not marker.exists()
    # Not even the page's shell is served under that name.
    shown = page.driver.find_element("tag name", "body").text
    assert "forbidden" in shown and "Host" in shown, shown
