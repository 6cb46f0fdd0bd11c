"""A map node's items as child runs: their ids, the items the log records, and one drive of the
items not yet recorded.

A map's items are child runs (ordinary agent runs of the body agent) whose ids derive from the
graph run, the node and the index (``map_child_id``), so a re-walk after a crash finds the
children a killed drive started instead of starting second ones. A child's head is durable before
the child is driven; up to the node's ``concurrency`` children drive at once, each through the
agent drive every run uses, and each finished child is recorded in the graph run's log as
``MapItemCompleted`` in finishing order, with the child's usage, by one task, the walker, that
writes that log; the children only write their own.

A failed item ends the map before any later item starts (no head is written for it); the items
in flight are never cancelled (a cancel would cut a write mid-call) but reach their rest first.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio
from salvor.protocol import (
    EMPTY_VIEW,
    CodedError,
    EventKind,
    GraphNode,
    MapItemCompleted,
    ReplayDivergence,
    RunStarted,
    RunState,
    RunView,
)
from salvor.store import SeqConflict, store_fault

from ..agents import AgentDefinition, DriveKit, drive
from ..flows import MAP_OF_LABEL, inherited_labels
from ..recording import RunContext

# The namespace of map children's run ids (uuid5 over "<graph run>/<node>/<index>").
MAP_ITEMS = uuid.UUID("6d0f3c1e-8a52-5b7e-9c4d-2f1a0e7b9c35")

# A child in one of these states fails its map node (and the graph run).
CHILD_FAILED = (RunState.FAILED, RunState.ABANDONED)

# How a map item's drive ended: the child's view at rest, why its drive stopped short, or the
# store fault it stopped on.
_ItemEnd = RunView | str | CodedError


def map_child_id(run_id: str, node: str, index: int) -> str:
    """The run id of item ``index`` of map ``node`` in graph run ``run_id``: the same every walk."""
    return str(uuid.uuid5(MAP_ITEMS, f"{run_id}/{node}/{index}"))


def recorded_items(ctx: RunContext) -> dict[int, Any]:
    """The map items the log already records (taken from the cursor), by index."""
    outputs: dict[int, Any] = {}
    while not ctx.live:
        try:
            found = ctx.cursor.take(EventKind.MAP_ITEM_COMPLETED)
        except ReplayDivergence:
            break  # the map's NodeExited (or a divergence the walk's narration reports)
        outputs[found.event.index] = found.event.output
    return outputs


@dataclass(frozen=True, slots=True, kw_only=True)
class _ItemStart:
    """What a map item's task is given: its slot (given back when it ends), where it says how it
    ended, and the flag that says the map is ending (set by the item that ends it)."""

    slots: trio.Semaphore
    send: trio.MemorySendChannel
    ending: trio.Event


@dataclass(slots=True)
class MapEnd:
    """How one drive of a map's items ended short, if it did: the first item that failed, the
    first that rested short of an output, and the store fault that stopped the drive."""

    failed: tuple[int, str, RunView] | None = None
    stopped: tuple[int, str, RunView | str] | None = None
    fault: CodedError | None = None


class MapItems:
    """One drive of the items of map ``node`` of graph run ``run_id`` not yet recorded: each a
    child run of ``agent``, labelled as the map's and with the graph run's inherited labels."""

    def __init__(
        self,
        kit: DriveKit,
        run_id: str,
        labels: Mapping[str, str] | None,
        node: GraphNode,
        agent: AgentDefinition,
    ) -> None:
        self.kit = kit
        self.run_id = run_id
        self.labels = labels
        self.node = node
        self.agent = agent

    async def drive(
        self, ctx: RunContext, inputs: dict[int, Any], outputs: dict[int, Any]
    ) -> MapEnd:
        """Drive the children of ``inputs`` (item index -> child input, in item order), filling
        ``outputs`` and recording each completed item in ``ctx``'s log as it completes.

        Whatever ends the map short (a failed item, a store fault) starts no later item and
        cancels none in flight: each item in flight reaches its rest first.
        """
        send, receive = trio.open_memory_channel[tuple[int, str, _ItemEnd]](math.inf)
        slots = trio.Semaphore(self.node.concurrency or 8)
        # Set by whatever ends the map short (a failed item, a store fault): from then on no
        # further item is started, so no child exists that nothing will drive.
        ending = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._start_in_item_order, nursery, inputs, send, slots, ending)
            return await self._collect(ctx, receive, outputs, ending)

    async def _start_in_item_order(
        self,
        nursery: trio.Nursery,
        inputs: dict[int, Any],
        send: trio.MemorySendChannel,
        slots: trio.Semaphore,
        ending: trio.Event,
    ) -> None:
        # A slot is taken before an item's task exists, so items start in item order.
        async with send:
            for index, child_input in inputs.items():
                await slots.acquire()
                if ending.is_set():
                    slots.release()
                    return
                nursery.start_soon(
                    self._drive_child,
                    map_child_id(self.run_id, self.node.id, index),
                    child_input,
                    index,
                    _ItemStart(slots=slots, send=send.clone(), ending=ending),
                )

    async def _collect(
        self,
        ctx: RunContext,
        receive: trio.MemoryReceiveChannel,
        outputs: dict[int, Any],
        ending: trio.Event,
    ) -> MapEnd:
        """Take each item's end as it comes, record the completed ones, and say how the map
        ended."""
        end = MapEnd()
        async with receive:
            async for index, child, rested in receive:
                if end.fault is not None:
                    continue  # the next walk records what the items in flight did
                if isinstance(rested, CodedError):
                    # The store failed under the child: the walk raises it as itself, so the
                    # root's drive stops on a store fault and the healer re-drives the tree.
                    end.fault = rested
                elif isinstance(rested, RunView) and rested.state is RunState.COMPLETED:
                    outputs[index] = rested.detail.get("output")
                    end.fault = await _record_item(ctx, self.node, index, child, rested)
                    if end.fault is not None:
                        ending.set()
                elif isinstance(rested, RunView) and rested.state in CHILD_FAILED:
                    end.failed = end.failed or (index, child, rested)
                else:
                    # Resting short of an output: the other items still finish and are
                    # recorded, so the next walk drives only the ones left.
                    end.stopped = end.stopped or (index, child, rested)
        return end

    async def _drive_child(
        self, child: str, child_input: Any, index: int, start: _ItemStart
    ) -> None:
        """Start ``child`` durably (once: its id is derived) and drive it; send how it ended.

        ``start.slots``: the slot the starter took for this item, given back when the drive
        ends. An item whose map is ending already (``start.ending``) is not started at all: no
        head is written. A child that failed, or whose drive stopped on a store fault, ends the
        map (``start.ending`` is set before its slot is given back, so no later item starts).
        """
        slots = start.slots
        async with start.send:
            if start.ending.is_set():
                slots.release()
                return
            head = RunStarted(
                agent_def_hash=self.agent.agent_def_hash,
                input=child_input,
                labels={MAP_OF_LABEL: self.run_id, **inherited_labels(self.labels)},
            )
            try:
                with contextlib.suppress(SeqConflict):  # a killed walk started it already
                    await self.kit.access.append(child, [head], EMPTY_VIEW)
                rested: _ItemEnd = await drive(self.kit, child, self.agent)
            except CodedError as exc:
                # A store fault is the walk's to raise (``MapEnd.fault``); any other stop is
                # short of an output (a call that may pass, another writer at its seq): the
                # next walk drives it again.
                rested = exc if store_fault(exc) else exc.message
            except BaseException:
                slots.release()
                raise
            if isinstance(rested, CodedError) or (
                isinstance(rested, RunView) and rested.state in CHILD_FAILED
            ):
                start.ending.set()
            with contextlib.suppress(trio.BrokenResourceError):
                await start.send.send((index, child, rested))
            slots.release()


async def _record_item(
    ctx: RunContext, node: GraphNode, index: int, child: str, rested: RunView
) -> CodedError | None:
    """Record map item ``index`` of ``node`` as ``child`` completed it; the error that stopped
    the record, if one did (a store fault stays one the driving set can heal)."""
    try:
        await ctx.record(
            MapItemCompleted(
                node=node.id,
                index=index,
                run_id=child,
                output=rested.detail.get("output"),
                usage=rested.usage(),
            )
        )
    except CodedError as exc:
        return exc
    return None
