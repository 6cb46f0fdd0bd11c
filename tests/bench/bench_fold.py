"""Benchmark: events per second of ``protocol.fold`` over a 100,000-event log.

Prints one JSON object. Two figures: folding already-built envelopes, and
decoding the pinned wire JSON lines with ``decode_envelope`` and then folding.
Best of several rounds. Never a timed assertion (pytest does not collect this
file: its name does not start with ``test_``).

    python tests/bench/bench_fold.py [--events 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from salvor.protocol import (
    SCHEMA_VERSION,
    Envelope,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    RandomObserved,
    RunStarted,
    ToolCallCompleted,
    ToolCallRequested,
    decode_envelope,
    encode_envelope,
    fold,
)

TARGET_EVENTS_PER_S = 300_000
RUN_ID = "3f1c2a4e-5b6d-4e7f-8a9b-0c1d2e3f4a5b"


def realistic_events(count: int) -> list:
    """RunStarted, then model/tool steps, with a clock or random read now and then."""
    events = [
        RunStarted(agent_def_hash="sha256:" + "ab" * 32, input={"ticket": "refund INV-7 please"})
    ]
    step = 0
    while len(events) < count:
        seq = len(events)
        if step % 50 == 0:
            events.append(NowObserved(now=f"2025-01-01T00:{(step // 50) % 60:02d}:00Z"))
        elif step % 97 == 0:
            events.append(RandomObserved(value=f"{step:032x}"))
        else:
            events.append(ModelCallRequested(request_hash=f"sha256:{step:064x}"))
            events.append(
                ModelCallCompleted(
                    seq=seq,
                    response={
                        "model": "claude-sonnet-4-5",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": f"toolu_{step}",
                                "name": "lookup_invoice",
                                "input": {"invoice_id": f"INV-{step}"},
                            }
                        ],
                        "stop_reason": "tool_use",
                    },
                    usage={"input_tokens": 120 + step, "output_tokens": 35},
                )
            )
            events.append(
                ToolCallRequested(
                    tool="lookup_invoice",
                    input={"invoice_id": f"INV-{step}"},
                    effect="read",
                    idempotency_key=None,
                )
            )
            events.append(
                ToolCallCompleted(
                    seq=seq + 2,
                    output={
                        "invoice_id": f"INV-{step}",
                        "amount_cents": 1234,
                        "status": "paid",
                        "customer_email": f"billing+inv-{step}@example.com",
                    },
                )
            )
        step += 1
    return events[:count]


def envelopes_of(events: list) -> list[Envelope]:
    return [
        Envelope(
            run_id=RUN_ID,
            seq=seq,
            schema_version=SCHEMA_VERSION,
            recorded_at=f"2025-01-01T00:00:{seq % 60:02d}.{seq % 1_000_000:06d}Z",
            event=event,
        )
        for seq, event in enumerate(events)
    ]


def best_rate(fn, count: int, rounds: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return count / min(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    envelopes = envelopes_of(realistic_events(args.events))
    lines = [encode_envelope(envelope) for envelope in envelopes]
    # Sanity: the whole log folds to a live run with every step counted, and
    # the wire lines read back to the same view.
    view = fold(envelopes)
    if view.next_seq != args.events or fold(decode_envelope(line) for line in lines) != view:
        raise SystemExit("bench_fold: the log does not fold consistently")

    fold_rate, fold_times = best_rate(lambda: fold(envelopes), args.events, args.rounds)
    decode_rate, decode_times = best_rate(
        lambda: fold(decode_envelope(line) for line in lines), args.events, args.rounds
    )
    print(
        json.dumps(
            {
                "bench": "fold",
                "events": args.events,
                "fold_events_per_s": round(fold_rate),
                "decode_and_fold_events_per_s": round(decode_rate),
                "target_events_per_s": TARGET_EVENTS_PER_S,
                "meets_target": fold_rate >= TARGET_EVENTS_PER_S,
                "wire_bytes": sum(len(line.encode()) for line in lines),
                "rounds_seconds": {
                    "fold": [round(t, 4) for t in fold_times],
                    "decode_and_fold": [round(t, 4) for t in decode_times],
                },
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
