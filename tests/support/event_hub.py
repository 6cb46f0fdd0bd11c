"""What the stream tests read of the live-event hub: how many streams listen on a run.

The hub keeps its subscribers private; only tests ask how many there are (to
wait until a stream has subscribed, and to see that a closed one let go).
"""

from __future__ import annotations

from salvor.daemon.runs._event_hub import EventHub


def subscriber_count(hub: EventHub, run_id: str) -> int:
    return len(hub._subscribers.get(run_id, ()))
