"""The OpenAPI contract a test holds the daemon to: requests and answers validated against the
document the daemon serves, and a record of which documented statuses a suite reached.

Used by every suite that drives routes (tests/daemon/api, tests/daemon/client_runs); a test module
imports it from here, never from another test module.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import gettempdir
from typing import Any

import httpx
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from salvor.daemon.api._app import API_OPERATIONS
from salvor.daemon.api._openapi import openapi_document
from salvor.daemon.recording import FreeSpaceFloor

DOCUMENT = openapi_document(API_OPERATIONS)
BASE = "urn:salvor:openapi"
NDJSON = "application/x-ndjson"
MISSING_RUN = "00000000-0000-4000-8000-000000000000"
# The agents the document's tests register: the README's refund desk, and one that asks first.
REFUND_DESK = (Path(__file__).resolve().parents[2] / "contrib/agents/refund-desk.toml").read_text()
GATED = {  # as JSON, with a name
    "name": "gated",
    "model": "demo-planner",
    "system_prompt": "Ask first.",
    "llm": {"provider": "demo"},
    "tools": [{"name": "request_approval"}],
}
OVERSIZED = b"x" * (8 * 1024 * 1024 + 1)
STEP_PATHS = ("/v1/client-runs/{run_id}/model-step", "/v1/client-runs/{run_id}/tool-step")
# Covered by tests/daemon/client_runs/test_performed.py (they need declared client tools).
CLIENT_PERFORMED_PATHS = tuple(
    f"/v1/client-runs/{{run_id}}/{name}"
    for name in (
        "client-tool-intent",
        "client-tool-completion",
        "client-model-intent",
        "client-model-completion",
        "resolve",
    )
)

# Bodies in another format that a document's JSON schema describes all the same (an agent
# definition as TOML, a graph document as YAML).
_PARSERS = {
    "application/toml": tomllib.loads,
    "application/yaml": yaml.safe_load,
    "text/yaml": yaml.safe_load,
}
# Covered by tests/daemon/api/test_openapi_graphs.py.
GRAPH_PATHS = ("/v1/graphs", "/v1/graphs/validate", "/v1/graphs/{graph_hash}")
# Covered by tests/daemon/api/test_named_flows.py.
FLOW_PATHS = ("/v1/flows", "/v1/flows/{namespace}/{name}")
# Covered by tests/daemon/api/test_graph_runs.py.
GRAPH_RUN_PATHS = ("/v1/graph-runs",)
# Covered by tests/daemon/api/test_flow_uploads.py.
UPLOAD_PATHS = ("/v1/uploads",)
# Covered by tests/daemon/api/test_forks.py.
FORK_PATHS = ("/v1/runs/{run_id}/graph", "/v1/runs/{run_id}/fork", "/v1/runs/{run_id}/forks")
# Covered by tests/daemon/api/test_settings.py.
SETTINGS_PATHS = ("/v1/settings/edit-mode",)
# The page's login: tests/daemon/api/test_session.py answers every status it documents.
SESSION_PATHS = ("/v1/session",)
# Covered by tests/daemon/api/test_children.py.
CHILD_PATHS = ("/v1/runs/{run_id}/children",)
# Answered in the Prometheus text format, not JSON: tests/daemon/api/test_metrics.py reads it.
METRICS_PATHS = ("/metrics",)


def pointer(*parts: str) -> str:
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


# A refusal of a body's shape: a field the body does not take, or one of the wrong type
# (``_bodies``).
_SHAPE_REFUSAL = re.compile(
    r"(the agent definition does not build: )?unknown field |`[a-z_]+` must be "
)


class Contract:
    """Validates requests and answers against a document, and remembers what it saw.

    ``document`` is the one the daemon under test serves (``served``); by default the unnarrowed
    one.
    A request body the daemon took (2xx) must be one the document admits, and one it refused for
    its shape (an unknown field, a field of the wrong type) one the document does not admit. A
    TOML agent definition is held to the same schema as its JSON form: they take the same fields.
    """

    def __init__(self, document: dict = DOCUMENT) -> None:
        self.document = document
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        self._registry = Registry().with_resource(BASE, resource)
        self.seen: set[tuple[str, str, str]] = set()
        # (path, method) whose request body the daemon took and the document admitted.
        self.requests: set[tuple[str, str]] = set()

    @classmethod
    async def served(cls, client: httpx.AsyncClient) -> Contract:
        """A contract with the document this daemon serves (its tools, llm choices, agent kinds)."""
        response = await client.get("/v1/openapi.json")
        assert response.status_code == 200, response.text
        return cls(response.json())

    def errors(self, pointer: str, value: Any) -> list:
        validator = Draft202012Validator(
            {"$ref": f"{BASE}#{pointer}"},
            registry=self._registry,
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
        return sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))

    def admits(self, pointer: str, value: Any) -> bool:
        return not self.errors(pointer, value)

    def validate(self, pointer: str, value: Any, what: str) -> None:
        errors = self.errors(pointer, value)
        assert not errors, (
            f"{what} does not match {pointer}:\n"
            + "\n".join(f"  at {list(e.absolute_path)}: {e.message}" for e in errors[:5])
            + f"\nbody: {json.dumps(value)[:2000]}"
        )

    def request_body(self, template: str, method: str, kwargs: dict) -> tuple[str, Any] | None:
        """(schema pointer, the body as JSON) for a request that sends one; None for no body or one
        that is not JSON, TOML or YAML at all (which no schema describes)."""
        if "json" in kwargs:
            media, value = "application/json", kwargs["json"]
        elif kwargs.get("content"):
            media = {k.lower(): v for k, v in (kwargs.get("headers") or {}).items()}.get(
                "content-type", ""
            )
            try:
                text = kwargs["content"]
                text = text.decode() if isinstance(text, bytes) else text
                value = _PARSERS.get(media, json.loads)(text)
            except (UnicodeDecodeError, ValueError, yaml.YAMLError):
                return None
        else:
            return None
        operation = self.document["paths"][template][method]
        assert "requestBody" in operation, f"{method} {template} takes no body, yet one was sent"
        # An agent definition's two formats share one schema, and so do a graph document's.
        media = "application/json" if media in _PARSERS else media
        return pointer("paths", template, method, "requestBody", "content", media, "schema"), value

    def check_request(
        self, template: str, method: str, kwargs: dict, response: httpx.Response
    ) -> None:
        what = f"{method.upper()} {template} -> {response.status_code}"
        operation = self.document["paths"][template][method]
        sent = self.request_body(template, method, kwargs)
        if sent is None:
            if kwargs.get("content") and response.is_success:
                # A body no schema reads (an upload's archive), taken as its media type says.
                self.requests.add((template, method))
                return
            if response.is_success and operation.get("requestBody", {}).get("required"):
                raise AssertionError(f"{what} took no body, yet the document requires one")
            return
        pointer, value = sent
        if response.is_success:
            self.validate(pointer, value, f"the request of {what}")
            self.requests.add((template, method))
        elif response.status_code == 400 and _SHAPE_REFUSAL.match(
            response.json()["error"]["message"]
        ):
            assert not self.admits(pointer, value), (
                f"{what} refused the body's shape ({response.json()['error']['message']}), "
                f"yet the document admits it: {json.dumps(value)[:2000]}"
            )

    def responsepointer(self, template: str, method: str, status: str, media: str) -> str:
        response = self.document["paths"][template][method]["responses"][status]
        if "$ref" in response:
            base = response["$ref"][1:]
        else:
            base = pointer("paths", template, method, "responses", status)
        return base + pointer("content", media, "schema")

    async def call(
        self,
        client: httpx.AsyncClient,
        method: str,
        template: str,
        *,
        expect: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Send, check the status is documented (and ``expect`` when given),
        validate the body; returns it."""
        path_params = {
            k: kwargs.pop(k)
            for k in ("run_id", "agent_hash", "graph_hash", "namespace", "name")
            if k in kwargs
        }
        response = await client.request(method, template.format(**path_params), **kwargs)
        op, status = method.lower(), str(response.status_code)
        what = f"{method} {template} -> {status}"
        assert status in self.document["paths"][template][op]["responses"], (
            f"undocumented: {what}: {response.text}"
        )
        if expect is not None:
            assert response.status_code == expect, f"{what}: {response.text}"
        self.seen.add((template, op, status))
        if status != "413":
            self.check_request(template, op, kwargs, response)
        if response.headers["content-type"].startswith("text/event-stream"):
            return self.frames(response.text)
        if response.headers["content-type"] == NDJSON:
            where = self.responsepointer(template, op, status, NDJSON)
            lines = [json.loads(line) for line in response.text.splitlines() if line]
            for line in lines:
                self.validate(where, line, f"{what}: a line")
            return lines
        assert response.headers["content-type"] == "application/json", what
        body = response.json()
        self.validate(self.responsepointer(template, op, status, "application/json"), body, what)
        return body

    def frames(self, text: str) -> list[tuple[str, dict]]:
        """An event stream's frames, each validated: (event name, data)."""
        frames = []
        for block in text.split("\n\n"):
            lines = [line for line in block.splitlines() if line and not line.startswith(":")]
            if not lines:
                continue
            fields = dict(line.split(": ", 1) for line in lines)
            name = fields.get("event", "message")
            data = json.loads(fields["data"])
            schema = {"message": "Envelope", "end": "EndFrame"}[name]
            self.validate(
                pointer("components", "schemas", schema), data, f"a stream frame ({name})"
            )
            frames.append((name, data))
        return frames

    def unreached(self) -> set[tuple[str, str, str]]:
        documented = {
            (path, method, status)
            for path, operations in self.document["paths"].items()
            for method, operation in operations.items()
            for status in operation["responses"]
            # 500 is never provoked; a stalled body (408) is the body-deadline tests' own, a
            # session cookie's 403 (the shared `Forbidden`) tests/daemon/api/test_session.py's,
            # a guesser's 429 (`TooManyRequests`) tests/daemon/api/test_token_tries.py's,
            # and a body's 415 (the shared `UnsupportedMediaType`)
            # tests/daemon/api/test_browsers.py's.
            if status not in ("500", "408")
            and operation["responses"][status]
            not in (
                {"$ref": "#/components/responses/Forbidden"},
                {"$ref": "#/components/responses/TooManyRequests"},
                {"$ref": "#/components/responses/UnsupportedMediaType"},
            )
        }
        return documented - self.seen


@contextmanager
def below_the_free_space_floor(state: Any) -> Iterator[None]:
    """The daemon of ``state`` as if its store's filesystem were below the free-space floor
    (one no filesystem can reach): every route declared as new work, and a new client-driven
    run's head, answer 507. The daemon's own floor is raised (on any backend) for the block."""
    floor: FreeSpaceFloor = state.floor
    kept = (floor.directory, floor.min_free_bytes)
    floor.directory, floor.min_free_bytes = Path(gettempdir()), 1 << 62
    try:
        yield
    finally:
        floor.directory, floor.min_free_bytes = kept
