"""The command line's flag values, checked while the arguments are parsed.

A value that cannot be what its flag asks for (a label without ``=``, a ``--listen`` without a
host, ``--input`` that is not JSON, a run id that is not a UUID) is a usage error: argparse
refuses it before any store is opened, in one sentence on stderr, with exit status 2. Each
function here is an argparse ``type=``; what it raises is what the sentence says.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from salvor.protocol import CodedError, MalformedJson, RunState, parse_strict

from ..flows import caller_labels
from ..recording import parse_run_id
from ..web import canonical_host, canonical_origin

# sun_path holds 108 bytes on Linux, its terminating NUL among them.
MAX_SOCKET_PATH_BYTES = 107
RUN_STATES = tuple(state.value for state in RunState if state is not RunState.NOT_STARTED)


class Parser(argparse.ArgumentParser):
    """An argument parser whose every usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        # argparse names the flag before a value's refusal; the checks below already begin
        # with it ("argument --input: --input is not valid JSON" says it twice).
        head, sep, rest = message.partition(": ")
        if sep and head.startswith("argument "):
            flags = head.removeprefix("argument ").split("/")
            if any(rest.startswith(flag + " ") for flag in flags):
                message = rest
        self.exit(2, f"salvor: {message} (`{self.prog} --help` says what it takes)\n")


def json_value(flag: str) -> Callable[[str], Any]:
    """A flag whose value is one strict JSON text (``--input``, ``--output``)."""

    def parse(text: str) -> Any:
        try:
            return parse_strict(text, flag)
        except MalformedJson as exc:
            raise argparse.ArgumentTypeError(
                f"{exc.message}; quote it for the shell, e.g. "
                f'{flag} \'{{"invoice_id": "INV-1001"}}\''
            ) from None

    return parse


def key_value(text: str) -> tuple[str, str]:
    """``K=V``: a label to filter by (any key, the daemon's own among them)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--label {text[:40]!r} must look like key=value")
    return key, value


def caller_label(text: str) -> tuple[str, str]:
    """``K=V``: a label a run is started with, under the rules the API applies to it."""
    key, value = key_value(text)
    try:
        caller_labels({key: value})
    except CodedError as exc:
        raise argparse.ArgumentTypeError(f"--label {text[:40]!r}: {exc.message}") from None
    return key, value


def add_label_option(parser: argparse.ArgumentParser) -> None:
    """``--label K=V``, repeatable: the labels a new run is started with."""
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        type=caller_label,
        metavar="K=V",
        help="correlation tag (repeatable)",
    )


def run_uuid(text: str) -> str:
    """A run id, in its canonical form."""
    try:
        return parse_run_id(text)
    except CodedError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


class ListenAddress(NamedTuple):
    """Where ``salvor serve`` listens: ``host`` and ``port``, or a Unix socket's path."""

    host: str = ""
    port: int = 0
    unix_socket: str | None = None


def listen_address(text: str) -> ListenAddress:
    """``HOST:PORT`` (an IPv6 host in brackets: the host without them, and the port), or
    ``unix:PATH`` (the path made absolute)."""
    if text.startswith("unix:"):
        path = text.removeprefix("unix:")
        if not path:
            raise argparse.ArgumentTypeError(
                "--listen unix: must name the socket's path, e.g. "
                "--listen unix:$XDG_RUNTIME_DIR/salvor.sock"
            )
        path = os.path.abspath(os.path.expanduser(path))
        if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise argparse.ArgumentTypeError(
                f"--listen unix:{path[:80]} is longer than the {MAX_SOCKET_PATH_BYTES} bytes a "
                "Unix socket's path may have; pick a shorter one"
            )
        return ListenAddress(unix_socket=path)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not _port_text(port):
        raise argparse.ArgumentTypeError(
            f"--listen {text[:80]!r} must look like HOST:PORT, e.g. 127.0.0.1:8420, or unix:PATH"
        )
    return ListenAddress(host.strip("[]"), int(port))


def allowed_host(text: str) -> str:
    """A name ``--allow-host`` lets a request's Host give (``web.canonical_host``)."""
    try:
        return canonical_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def allowed_origin(text: str) -> str:
    """An origin ``--allow-origin`` lets call the daemon (``web.canonical_origin``)."""
    try:
        return canonical_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(text: str) -> int:
    """A TCP port, 0 for a free one."""
    if not _port_text(text):
        raise argparse.ArgumentTypeError(
            f"--proxy-port {text[:40]!r} must be a port number from 0 (a free one) to 65535"
        )
    return int(text)


def token_tries(text: str) -> int:
    """``--token-tries``: wrong tokens a client may give per window; 0 turns the limit off."""
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise argparse.ArgumentTypeError(
            f"--token-tries {text[:40]!r} must be a whole number of wrong tokens (0 turns the "
            "limit off)"
        )
    return int(text)


def trusted_proxy(text: str) -> str:
    """``--trusted-proxy``: an IP address or network, normalised (``127.0.0.1/32``)."""
    from ..web import trusted_network

    try:
        return str(trusted_network(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- one machine, every core (issue 30, item 4) --
MAX_WORKERS = 256
AUTO_WORKERS = "auto"


def cores() -> int:
    """The cores this process may run on (its CPU affinity, so a container's or taskset's
    limit counts), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(text: str) -> int | str:
    """``--workers``: how many daemon processes serve, or ``AUTO_WORKERS`` (one per core, as
    many as the store allows: ``salvor serve`` decides once it knows the store)."""
    if text == AUTO_WORKERS:
        return AUTO_WORKERS
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_WORKERS):
        raise argparse.ArgumentTypeError(
            f"--workers {text[:40]!r} must be a number of worker processes from 1 to "
            f"{MAX_WORKERS}, or auto (one per core)"
        )
    return int(text)


def _port_text(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535


def wake_interval(text: str) -> float:
    """Seconds between wake sweeps; 0 turns the sweeper off."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(
            f"--wake-interval {text[:40]!r} must be 0 (off) or a positive number of seconds"
        )
    return seconds


def positive_seconds(flag: str, *, zero: bool = False) -> Callable[[str], float]:
    """A parser of ``flag``'s seconds: a finite number above 0 (or 0 too, with ``zero``)."""

    def parse(text: str) -> float:
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
            least = "0 or more" if zero else "above 0"
            raise argparse.ArgumentTypeError(
                f"{flag} {text[:40]!r} must be a number of seconds, {least}"
            )
        return seconds

    return parse


# -- streaming bounds (issue 29): --stream-buffer-bytes, --max-streams-per-client --


def stream_buffer_bytes(text: str) -> int:
    """What one stream or WebSocket may hold unsent: a whole number of bytes, at least 64 KiB."""
    if not (text.isascii() and text.isdigit() and len(text) <= 12 and int(text) >= 65536):
        raise argparse.ArgumentTypeError(
            f"--stream-buffer-bytes {text[:40]!r} must be a whole number of bytes, at least 65536"
        )
    return int(text)


def streams_per_client(text: str) -> int:
    """Open streams per client: a whole number, 0 for no cap."""
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise argparse.ArgumentTypeError(
            f"--max-streams-per-client {text[:40]!r} must be a whole number (0: no cap)"
        )
    return int(text)


def run_limit(text: str) -> int:
    """How many runs a listing shows: a positive whole number."""
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0):
        raise argparse.ArgumentTypeError(
            f"--limit must be a positive whole number of runs, not {text[:40]!r}"
        )
    return int(text)


def run_state(text: str) -> str:
    """A run state a listing filters by."""
    if text not in RUN_STATES:
        raise argparse.ArgumentTypeError(
            f"--state {text[:40]!r} is not a run state; use one of {', '.join(RUN_STATES)}"
        )
    return text


# Quotas (issue 29, item 5): sizes and counts of `salvor serve`'s limits.
_SIZE_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_in_bytes(flag: str, *, zero: str | None = None) -> Callable[[str], int]:
    """A byte count, bare or with a KiB, MiB or GiB suffix (``64MiB``); 0 only when ``zero``
    says what it means."""

    def parse(text: str) -> int:
        digits = text.rstrip("KMGiB")
        unit = text[len(digits) :]
        size = None
        if unit in _SIZE_UNITS and digits.isascii() and digits.isdigit() and len(digits) <= 15:
            size = int(digits) * _SIZE_UNITS[unit]
        if size is None or (size == 0 and zero is None):
            allowed = "0 (" + zero + ") or " if zero else ""
            raise argparse.ArgumentTypeError(
                f"{flag} {text[:40]!r} must be {allowed}a positive number of bytes, bare or with "
                "a KiB, MiB or GiB suffix (64MiB)"
            )
        return size

    return parse


def event_count(flag: str) -> Callable[[str], int]:
    """A positive whole number of events."""

    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit() and len(text) <= 12 and int(text) > 0):
            raise argparse.ArgumentTypeError(
                f"{flag} {text[:40]!r} must be a positive whole number of events"
            )
        return int(text)

    return parse
