"""What an operator watches of a running daemon: its Prometheus registry and the instruments in
it, and its log as JSON lines naming the run each record concerns.

Rule: every room may count (and log) into this one, and it imports no other room. A daemon owns
its registry (never the library's process-wide default), so several daemons in one interpreter
(the tests) never mix their counts. Labels carry bounded, daemon-chosen values only, never a
string a caller sent.
"""

from ._instruments import (
    MCP_TRANSPORTS,
    STREAM_TRANSPORTS,
    DaemonMetrics,
    NodeReading,
    Readings,
    counting_into,
    current_metrics,
    stop_counting,
)
from ._log_lines import (
    JsonLines,
    concerning_run,
    run_of,
)

__all__ = [
    "MCP_TRANSPORTS",
    "STREAM_TRANSPORTS",
    "DaemonMetrics",
    "JsonLines",
    "NodeReading",
    "Readings",
    "concerning_run",
    "counting_into",
    "current_metrics",
    "run_of",
    "stop_counting",
]
