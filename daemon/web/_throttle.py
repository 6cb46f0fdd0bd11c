"""How often one client may give the daemon a wrong token: the login and the bearer check.

A client is the address the request came from (``client_key``: the peer's, or, behind a proxy the
operator trusts, the address that proxy forwarded), an IPv6 one by its /64, the block one host is
handed. Each client has a fixed window that opens at its first wrong token: ``FAILED_TRIES`` wrong
tokens within ``WINDOW_SECONDS`` spend it, and until the window ends every further try of a token
from that client is refused with 429 ``too_many_requests`` and a ``Retry-After``, before the token
is compared. Comparing it anyway would limit nothing: the one right guess would still be told
apart from the wrong ones. A right token counts nothing, so a client that only ever sends the right
one is never slowed, and a page's session cookie is not a try of the token at all.

The window is a constant and the count a flag (``salvor serve --token-tries``, default
``FAILED_TRIES``; 0 turns the limit off): a token is at least 16 bytes (``salvor serve`` refuses a
shorter one), so guessing is hopeless at any rate and the limit is here to keep a guesser from
costing the daemon work; but many honest clients behind one address the daemon cannot see past (a
NAT, a proxy it does not trust) or a harness that probes every route with a wrong token on purpose
(a fuzzer) need more tries, and only the operator knows that.

At most ``MAX_CLIENTS`` windows are kept; past that the ended ones go, then the oldest, so a caller
with many addresses costs a bounded amount of memory (and at worst frees its own window early).
Everything here is synchronous and quick, on the trio thread.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from salvor.protocol import ErrorCode

from ._errors import OperationRefused

FAILED_TRIES = 10
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 4096


class TooManyTries(OperationRefused):
    """429 too_many_requests: the client gave too many wrong tokens lately; nothing was compared
    and nothing recorded. ``retry_after`` is the whole seconds until its window ends."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            ErrorCode.TOO_MANY_REQUESTS,
            f"too many wrong tokens from this client lately; try again in {retry_after} seconds "
            "(the Retry-After header) with the right one",
        )
        self.retry_after = retry_after


def client_key(address: str | None) -> str:
    """The key a client's tries are counted under: its address, an IPv6 one by its /64 (one host
    is handed a whole /64); ``""`` when there is none (a Unix socket)."""
    if not address:
        return ""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


@dataclass(slots=True)
class _Window:
    ends: float
    failures: int


class FailedTries:
    """The wrong tokens of recent clients, one fixed window each.

    ``clock`` gives monotonic seconds (a test injects its own to pass a window's end).
    """

    def __init__(
        self,
        *,
        limit: int = FAILED_TRIES,
        seconds: float = WINDOW_SECONDS,
        capacity: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.seconds = seconds
        self.capacity = capacity
        self.clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def check(self, client: str | None) -> None:
        """Refuse a try of the token from a client that has spent its window.

        Raises:
            TooManyTries: 429, with the seconds until the window ends.
        """
        if self.limit <= 0:
            return
        key = client_key(client)
        window = self._windows.get(key)
        if window is None:
            return
        left = window.ends - self.clock()
        if left <= 0:
            del self._windows[key]
        elif window.failures >= self.limit:
            raise TooManyTries(max(1, math.ceil(left)))

    def failed(self, client: str | None) -> None:
        """Count one wrong token from ``client`` (nothing is kept without a limit)."""
        if self.limit <= 0:
            return
        key = client_key(client)
        now = self.clock()
        window = self._windows.get(key)
        if window is None or window.ends <= now:
            if window is None and len(self._windows) >= self.capacity:
                self._make_room(now)
            self._windows[key] = window = _Window(ends=now + self.seconds, failures=0)
            self._windows.move_to_end(key)
        window.failures += 1

    def _make_room(self, now: float) -> None:
        for key in [key for key, window in self._windows.items() if window.ends <= now]:
            del self._windows[key]
        while len(self._windows) >= self.capacity:
            self._windows.popitem(last=False)
