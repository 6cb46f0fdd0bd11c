"""The daemon's log as JSON lines, and the run a log record concerns.

``salvor serve --log-format json`` writes each record as one JSON object on one line:
``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, ``run`` when the
record concerns one run, ``error`` (the formatted exception) when it carries one, ``worker`` in a
worker of ``salvor serve --workers N`` (its index: the workers share one stderr). Nothing else
of a record is written: an ``extra`` a call site passed never reaches the line unless it is the
run, so a line holds no more than the text format's line does (no secret either holds).

Which run a record concerns: the ``run`` a call site passed (``extra={"run": run_id}``), else the
run whose drive the logging task belongs to (``concerning_run``, set by the driver and inherited
by every task the drive starts).
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("salvor_log_run", default=None)


def concerning_run(run_id: str) -> None:
    """Mark the current task (and the tasks it starts from now on) as working on ``run_id``.

    Set once at the top of a task of its own (a drive): trio gives each task a copy of the
    context, so the mark ends with the task and never leaks to a sibling.
    """
    _RUN.set(run_id)


def run_of(record: logging.LogRecord) -> str | None:
    """The run ``record`` concerns, or None."""
    run = getattr(record, "run", None)
    return run if isinstance(run, str) else _RUN.get()


class JsonLines(logging.Formatter):
    """One JSON object per record, on one line (JSON escapes every newline inside a value).

    ``worker``: the index written on every line of a worker of ``salvor serve --workers N``.
    """

    def __init__(self, *, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line = {
            # RFC 3339, with UTC spelled Z.
            "time": created.replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run = run_of(record)
        if run is not None:
            line["run"] = run
        if self._worker is not None:
            line["worker"] = self._worker
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)
