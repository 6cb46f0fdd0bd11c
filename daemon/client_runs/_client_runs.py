"""The client-run service: every operation the ``/v1/client-runs`` routes perform, over one store.

Built once per daemon from what those operations need (the store access, the
drive leases, the tool registry, the client-tool declarations, the model
executor, and the resolve verb of the runs above this package), so a route
hands over what the request said and never sees the store behind it. Each
method keeps the refusals of the function it calls: a refusal records
nothing, and a step that fails mid-effect leaves its intent open.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from salvor.protocol import Actor, Envelope, ErrorCode

from ..models import Delta, ModelGateway
from ..recording import FreeSpaceFloor, StoreAccess, chosen_run_id
from ..tools import ToolRegistry
from ..web import OperationRefused
from ._appends import ClientAppends
from ._client_tools import ClientTool
from ._leases import DriveLeases
from ._performed import declared, model_completion, model_intent, tool_completion, tool_intent
from ._steps import ModelCall, open_model_step, perform_model_step, tool_step

# ``RunControl.resolve`` (``runtime.control``): recording a dangling write's outcome is a run
# verb of the package above this one, shared with server-driven runs, so it is handed in.
Resolve = Callable[[str, Any, Mapping[str, ClientTool]], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class OpenedRun:
    """What opening a client-driven run answers: its id, the drive token, and its log so far."""

    run_id: str
    drive_token: str
    # Whether this open created the run (nothing recorded and nothing opened before).
    fresh: bool
    log: list[Envelope]


class ClientRuns:
    """The operations on client-driven runs, one method per route."""

    def __init__(
        self,
        access: StoreAccess,
        registry: ToolRegistry,
        *,
        leases: DriveLeases,
        client_tools: Mapping[str, ClientTool],
        model_executor: ModelGateway | None,
        resolve: Resolve,
        floor: FreeSpaceFloor | None = None,
    ) -> None:
        self._access = access
        self._registry = registry
        self._leases = leases
        # Client-performed tools the operator declared, by name.
        self._client_tools = client_tools
        # None: this daemon performs no model step (each is refused before it records anything).
        self._model_executor = model_executor
        self._resolve = resolve
        # Shared with the ASGI front, which answers the append ahead of the app.
        self._appends = ClientAppends(access, leases, floor)

    # -- the run and its lease -------------------------------------------------

    async def open(
        self, run_id: str | None, token: str | None, *, record_prompts: bool
    ) -> OpenedRun:
        """Open (or adopt, or re-open with its token) a client-driven run; a new id when None.

        Raises:
            OperationRefused: bad_request (a name-based id, the kind salvor derives for children:
                ``chosen_run_id``), run_exists (the id has a server-driven history), or the
                lease's refusal (another driver holds it); nothing is recorded either way.
        """
        run_id = str(uuid.uuid4()) if run_id is None else chosen_run_id(run_id)
        view = await self._access.read(self._access.store.read_view, run_id)
        if view is not None and view.driven_by != Actor.CLIENT:
            raise OperationRefused(
                ErrorCode.RUN_EXISTS,
                f"run {run_id} already has history as a server-driven run; "
                "a client-driven run needs an id of its own",
            )
        fresh = view is None and not await self._leases.opened(run_id)
        drive_token = await self._leases.open(
            run_id,
            token,
            terminal=view is not None and view.terminal,
            record_prompts=record_prompts,
        )
        log = [] if view is None else await self._read_log(run_id, 0)
        return OpenedRun(run_id, drive_token, fresh, log)

    async def release(self, run_id: str, token: str | None) -> bool:
        """Give the lease up; whether the token held it (nothing is recorded)."""
        return await self._leases.release(run_id, token)

    async def heartbeat(self, run_id: str, token: str | None) -> int:
        """Refresh the lease; the whole seconds until it lapses.

        Raises:
            OperationRefused: unknown_run (no client-driven run), or the lease's refusal.
        """
        await self._known(run_id)
        return await self._leases.heartbeat(run_id, token)

    async def driving(self, run_id: str, token: str | None) -> str:
        """The canonical run id of a driving call, once its run and its drive token check out.

        Raises:
            OperationRefused: bad_request (not a run id), unknown_run, or the lease's refusal.
        """
        return await self._appends.driving(run_id, token)

    # -- the log ----------------------------------------------------------------

    async def read_log(self, run_id: str, from_seq: int) -> list[Envelope]:
        """The run's events from ``from_seq`` on; no drive token needed to read.

        Raises:
            OperationRefused: unknown_run (no client-driven run).
        """
        await self._known(run_id)
        return await self._read_log(run_id, from_seq)

    async def append(self, run_id: str, body: dict) -> dict:
        """Append ``body["events"]`` to a run ``driving`` admitted; the answer's body.

        Raises:
            OperationRefused / GuardRefusal / StoreError: refused whole, nothing written.
        """
        return await self._appends.append(run_id, body)

    # -- steps the daemon performs ------------------------------------------------

    async def open_model_step(self, run_id: str, seq: int, request: Any) -> ModelCall:
        """Check the step and record its intent (or find it recorded, maybe answered).

        Raises:
            OperationRefused: bad_request, model_executor_unavailable; nothing recorded.
            GuardRefusal: divergence at ``seq``.
        """
        return await open_model_step(
            self._access,
            run_id,
            seq,
            request,
            record_prompts=await self._leases.record_prompts(run_id),
            executor=self._model_executor,
        )

    async def perform_model_step(
        self, run_id: str, call: ModelCall, *, on_delta: Delta | None = None
    ) -> dict:
        """The opened step's ``{"response", "usage"}``: from the log, or called and recorded now.

        Raises:
            OperationRefused: model_execution (502); the intent stays open for a retry.
        """
        if call.answer is not None:
            return call.answer
        return await perform_model_step(
            self._access, run_id, call, self._model_executor, on_delta=on_delta
        )

    async def tool_step(self, run_id: str, seq: int, tool: Any, tool_input: Any, key: Any) -> dict:
        """Perform (or answer from the log) the registry tool call at ``seq``; ``{"output"}``."""
        return await tool_step(self._access, self._registry, run_id, seq, tool, tool_input, key)

    # -- calls the client performs ----------------------------------------------------

    def declared_tools(self) -> list[dict]:
        """The client tools the operator declared, by name."""
        return [self._client_tools[name].to_json() for name in sorted(self._client_tools)]

    async def client_tool_intent(self, run_id: str, seq: int, tool: Any, tool_input: Any) -> dict:
        """Open (or find again) the client-performed call at ``seq``; what the client does next.

        Raises:
            OperationRefused: bad_request, unknown_tool (not declared here); nothing recorded.
            GuardRefusal: divergence at ``seq``, or its key held by an unfinished call.
        """
        declaration = declared(self._client_tools, tool)
        return await tool_intent(self._access, declaration, run_id, seq, tool_input)

    async def client_tool_completion(self, run_id: str, seq: int, body: dict) -> dict:
        """Record what the client says its call at ``seq`` returned or how it failed."""
        return await tool_completion(self._access, self._client_tools, run_id, seq, body)

    async def client_model_intent(
        self, run_id: str, seq: int, request_hash: Any, request_body: Any
    ) -> dict:
        """Open (or find again) the client-performed model call at ``seq``."""
        return await model_intent(
            self._access,
            run_id,
            seq,
            request_hash,
            request_body,
            record_prompts=await self._leases.record_prompts(run_id),
        )

    async def client_model_completion(
        self, run_id: str, seq: int, response: Any, usage: Any
    ) -> dict:
        """Record what the client says its model call at ``seq`` returned."""
        return await model_completion(self._access, run_id, seq, response, usage)

    async def resolve(self, run_id: str, output: Any) -> None:
        """Record what the run's dangling write did, by its own driver (which keeps its lease).

        Raises:
            OperationRefused: wrong_state (no dangling write), or bad_request (a client's
                write whose declaration is gone or whose output it rejects); nothing recorded.
        """
        await self._resolve(run_id, output, self._client_tools)

    # -- helpers ------------------------------------------------------------------------

    async def _known(self, run_id: str) -> None:
        await self._appends.check_client_driven(run_id)

    async def _read_log(self, run_id: str, from_seq: int) -> list[Envelope]:
        return await self._access.read(self._access.store.read_log, run_id, from_seq)
