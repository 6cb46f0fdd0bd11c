"""The command line's flag values, checked while the arguments are parsed.

A value that cannot be what its flag asks for (a label without ``=``, a ``--listen`` without a
host, ``--input`` that is not JSON, a run id that is not a UUID) is a usage error: argparse
refuses it before any store is opened, in one sentence on stderr, with exit status 2. Each
function here is an argparse ``type=``; what it raises is what the sentence says.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NoReturn

from salvor.protocol import CodedError, MalformedJson, RunState, parse_strict

from ..flows import caller_labels
from ..recording import parse_run_id
from ..web import canonical_host, canonical_origin

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


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets): the host without them, and the port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not _port_text(port):
        raise argparse.ArgumentTypeError(
            f"--listen {text[:80]!r} must look like HOST:PORT, e.g. 127.0.0.1:8420"
        )
    return host.strip("[]"), int(port)


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
