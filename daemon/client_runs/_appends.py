"""The guarded append of client-driven runs: who may append, and what lands.

A client appends the events its own cursor produced (``RunStarted``,
observations, parking and finishing); model and tool events go through the
step endpoints. A batch is decoded and checked whole before the store is
touched; a byte-identical re-append of recorded events is a no-op, other
bytes at a recorded seq, a gap or an illegal event are a divergence, and a
refused batch writes nothing.

Both ways in share this: the Quart route and the ASGI front that answers
the same path in ``salvor serve`` (``api/_front.py``).
"""

from __future__ import annotations

import dataclasses

from salvor.protocol import (
    EMPTY_VIEW,
    Actor,
    Envelope,
    ErrorCode,
    EventKind,
    GuardRefusal,
    MalformedEvent,
    RunView,
    decode_envelope,
    encode_payload,
    excerpt,
)
from salvor.store import SeqConflict

from ..flows import caller_labels
from ..recording import FreeSpaceFloor, StoreAccess, parse_run_id
from ..web import OperationRefused, bad_request, unknown_run
from ._answers import APPENDED
from ._leases import DriveLeases

# What the client's own cursor emits: no secret, no outside effect.
APPENDABLE = frozenset(
    {
        EventKind.RUN_STARTED,
        EventKind.NOW_OBSERVED,
        EventKind.RANDOM_OBSERVED,
        EventKind.SUSPENDED,
        EventKind.RESUMED,
        EventKind.SLEEP_STARTED,
        EventKind.SLEEP_COMPLETED,
        EventKind.BUDGET_EXCEEDED,
        EventKind.RUN_COMPLETED,
        EventKind.RUN_FAILED,
    }
)
_STEPS = (
    "model and tool events are recorded through the model-step, tool-step, client-tool and "
    "client-model endpoints, never appended by hand"
)
MAX_EVENTS_PER_APPEND = 1024


def server_driven(run_id: str) -> OperationRefused:
    """A client-run route asked about a run the daemon drives: there is no lease to beat or log
    to rebuild a cursor from, so it says where that run is read instead."""
    return OperationRefused(
        ErrorCode.UNKNOWN_RUN,
        f"run {run_id} is server-driven (salvor drives it itself, not a client), and the "
        f"/v1/client-runs routes serve only runs a client drives; read it with "
        f"GET /v1/runs/{run_id} and its events with GET /v1/runs/{run_id}/events",
    )


# How many runs' last views are kept (a hint each; see ``ClientAppends``).
LAST_VIEWS = 4096


def _stamped(envelope: Envelope) -> Envelope:
    """The client's event as this server records it: a head is marked client-driven."""
    event = envelope.event
    if event.KIND is EventKind.RUN_STARTED and event.driven_by != Actor.CLIENT:
        try:
            event = dataclasses.replace(event, driven_by=Actor.CLIENT)
        except MalformedEvent as exc:
            raise bad_request(f"the RunStarted at seq {envelope.seq}: {exc.message}") from None
    return dataclasses.replace(envelope, event=event)


# Where a kind the generic append never takes is recorded instead, for the refusal.
_ABANDONED = "a run is abandoned by POST /v1/runs/{id}/abandon, never by an appended event"
_GRAPH = "a client-driven run is an agent run; only the daemon's graph walker narrates a graph"
_GRAPH_KINDS = frozenset(
    {
        EventKind.GRAPH_RUN_STARTED,
        EventKind.NODE_ENTERED,
        EventKind.NODE_EXITED,
        EventKind.NODE_SKIPPED,
        EventKind.MAP_ITEM_COMPLETED,
    }
)
_ATTACHED = "a client-driven run's tools are its client's; the daemon attaches none to it"
_NOT_APPENDABLE = {
    kind.value: (
        _ABANDONED
        if kind is EventKind.RUN_ABANDONED
        else _ATTACHED
        if kind is EventKind.TOOLS_ATTACHED
        else _GRAPH
        if kind in _GRAPH_KINDS
        else _STEPS
    )
    for kind in EventKind
    if kind not in APPENDABLE
}


def _refuse_unappendable(index: int, item: object) -> None:
    """Refuse a known kind the generic append never takes, before its envelope or payload is read.

    Raises:
        OperationRefused: unsupported_event_kind (422); nothing is written.
    """
    event = item.get("event") if isinstance(item, dict) else None
    kind = event.get("kind") if isinstance(event, dict) else None
    if isinstance(kind, str) and kind in _NOT_APPENDABLE:
        raise OperationRefused(
            ErrorCode.UNSUPPORTED_EVENT_KIND,
            f"events[{index}] is a {kind}, which this endpoint never appends: "
            f"{_NOT_APPENDABLE[kind]}",
        )


def read_batch(body: dict, run_id: str) -> list[Envelope]:
    """The batch decoded and checked on its own (kinds, run ids, labels), before any store read."""
    raw = body["events"]
    if not isinstance(raw, list) or not raw:
        raise bad_request("`events` must be a non-empty array of event envelopes")
    if len(raw) > MAX_EVENTS_PER_APPEND:
        raise OperationRefused(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"a batch holds at most {MAX_EVENTS_PER_APPEND} events; this one has {len(raw)}",
        )
    # Kinds are judged before any envelope is decoded: a model or tool event
    # is refused for what it is, whatever its payload or its neighbours hold.
    for index, item in enumerate(raw):
        _refuse_unappendable(index, item)
    batch = []
    for index, item in enumerate(raw):
        try:
            envelope = decode_envelope(item)
        except MalformedEvent as exc:
            raise bad_request(f"events[{index}]: {exc.message}") from None
        if envelope.run_id != run_id:
            raise bad_request(
                f"events[{index}] is for run {excerpt(envelope.run_id)}, not {run_id}"
            )
        kind = envelope.event.KIND
        if kind is EventKind.RUN_STARTED:
            caller_labels(envelope.event.labels, f"events[{index}]: ")
        batch.append(_stamped(envelope))
    return batch


class ClientAppends:
    """Appends for client-driven runs over one store and one set of leases.

    It remembers each run's view after its own last append, so the next one
    needs no store read. Any commit to the run in this daemon (a step, a
    resolve, an append) drops the entry, and an append puts its new view
    back. It is only ever a hint: a commit by another process over the same
    store is not seen, but an append decided on a stale view is refused by
    the store's seq check (or by the guard) with nothing written, and is
    decided again on the stored view. The oldest entries go first.
    """

    def __init__(
        self, access: StoreAccess, leases: DriveLeases, floor: FreeSpaceFloor | None = None
    ) -> None:
        self._access = access
        self._leases = leases
        # A new run's head is new work: refused while the store's filesystem is below the floor.
        self._floor = floor
        self._last_views: dict[str, RunView] = {}
        access.on_commit.append(self._forget)

    def _forget(self, envelopes: list[Envelope], _view: RunView) -> None:
        self._last_views.pop(envelopes[0].run_id, None)

    async def check_client_driven(self, run_id: str) -> None:
        """Refuse a run that is not a client's (opened here, or its head says so).

        Raises:
            OperationRefused: unknown_run, naming a run this daemon drives as such (the
                client-run routes serve no other kind, and the spec answers the other kind with
                the same code as no run at all).
        """
        if await self._leases.opened(run_id):
            return
        view = await self._access.read(self._access.store.read_view, run_id)
        if view is None:
            raise unknown_run(run_id)
        if view.driven_by != Actor.CLIENT:
            raise server_driven(run_id)

    async def driving(self, run_id: str, token: str | None) -> str:
        """The canonical run id of a driving call, once its run and the
        presented drive token check out.

        Raises:
            OperationRefused: bad_request (not a run id), unknown_run (no client-driven run),
                or the lease's refusal (missing or wrong token).
        """
        run_id = parse_run_id(run_id)
        try:
            # A lease stands only on a client's run (an open refuses any other), so a call its
            # token admits needs no other read: one store read on a driving call's usual path.
            await self._leases.check(run_id, token)
        except OperationRefused:
            # The run's own refusal comes first: no run, or not a client's.
            await self.check_client_driven(run_id)
            raise
        return run_id

    async def append(self, run_id: str, body: dict) -> dict:
        """Append ``body["events"]`` to a run ``driving`` admitted; the answer's body.

        Raises:
            OperationRefused / GuardRefusal / StoreError: the batch is refused
                and nothing of it was written.
        """
        batch = read_batch(body, run_id)
        view = self._last_views.pop(run_id, None)
        if view is not None:
            try:
                return await self._append_after(run_id, batch, view)
            except (SeqConflict, GuardRefusal):
                pass  # refused against the hint, nothing written: decide again on the stored view
        view = await self._access.read(self._access.store.read_view, run_id) or EMPTY_VIEW
        return await self._append_after(run_id, batch, view)

    async def _append_after(self, run_id: str, batch: list[Envelope], view: RunView) -> dict:
        recorded = {}
        if batch[0].seq < view.next_seq:
            log = await self._access.read(self._access.store.read_log, run_id, batch[0].seq)
            recorded = {e.seq: e for e in log}
        appended: list[int] = []
        new: list[Envelope] = []
        for envelope in batch:
            known = recorded.get(envelope.seq)
            if known is not None and not new:
                # A retry of what is already recorded is a no-op;
                # anything else there is a divergence.
                if known.event.KIND is not envelope.event.KIND or encode_payload(
                    known.event, seq=known.seq
                ) != encode_payload(envelope.event, seq=envelope.seq):
                    raise GuardRefusal(
                        f"seq {envelope.seq} of run {run_id} already holds a different "
                        f"{known.event.KIND.value}; the log is append-only"
                    )
                appended.append(envelope.seq)
                continue
            expected = view.next_seq + len(new)
            if envelope.seq != expected:
                raise GuardRefusal(
                    f"events must be appended in order: seq {envelope.seq} is not the next "
                    f"position {expected} of run {run_id}"
                )
            new.append(envelope)
        if new:
            if new[0].event.KIND is not EventKind.RUN_STARTED and view.next_seq == 0:
                raise GuardRefusal(
                    f"run {run_id} has no head yet: its first event must be a RunStarted"
                )
            if view.next_seq == 0 and self._floor is not None:
                await self._floor.check("a new client-driven run")
            envelopes, view = await self._access.append(run_id, [e.event for e in new], view)
            appended.extend(e.seq for e in envelopes)
        if len(self._last_views) >= LAST_VIEWS:
            del self._last_views[next(iter(self._last_views))]
        self._last_views[run_id] = view
        return APPENDED.build(appended=appended)
