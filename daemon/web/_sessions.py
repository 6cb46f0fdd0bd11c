"""The page's login sessions, held in the daemon's memory.

A person who gave the daemon's token once (``POST /v1/session``) holds a session: a random id (the
``salvor_session`` cookie's value) and a random CSRF token, both from ``secrets``, living
``SESSION_SECONDS``. Nothing of it is stored anywhere but here, so a restart ends every session, and
the token itself is never kept: a session proves the token was given, it does not hold it.

At most ``MAX_SESSIONS`` live at once; a login past that ends the oldest (expired ones go first), so
a caller who logs in in a loop costs a bounded amount of memory. Ids are looked up by their SHA-256
digest and then compared in constant time, so neither the lookup nor the compare tells a guesser
how much of an id it got right.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from salvor.protocol import format_instant

SESSION_COOKIE = "salvor_session"
SESSION_SECONDS = 12 * 60 * 60
MAX_SESSIONS = 1024


@dataclass(frozen=True, slots=True)
class Session:
    """One login: the cookie's value, the CSRF token its state-changing requests carry, and when
    it ends (in the clock's seconds since the epoch)."""

    id: str
    csrf: str
    expires: float

    def csrf_matches(self, presented: str | None) -> bool:
        """Whether ``presented`` is this session's CSRF token (constant-time compare)."""
        return presented is not None and hmac.compare_digest(
            presented.encode("utf-8", "surrogateescape"), self.csrf.encode()
        )

    def expires_at(self) -> str:
        """The end as an RFC 3339 instant (UTC)."""
        return format_instant(datetime.fromtimestamp(self.expires, UTC))


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    """The live sessions, oldest first.

    ``clock`` gives seconds since the epoch (``time.time``; a test injects its own to reach an
    expiry). Every method is synchronous and quick: called on the trio thread, it never blocks.
    """

    def __init__(
        self,
        *,
        seconds: float = SESSION_SECONDS,
        capacity: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.seconds = seconds
        self.capacity = capacity
        self.clock = clock
        self._live: OrderedDict[bytes, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def open(self) -> Session:
        """A new session; past ``capacity`` the expired ones end, then the oldest."""
        now = self.clock()
        if len(self._live) >= self.capacity:
            self._drop_expired(now)
        while len(self._live) >= self.capacity:
            self._live.popitem(last=False)
        session = Session(
            id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32), expires=now + self.seconds
        )
        self._live[_digest(session.id)] = session
        return session

    def find(self, session_id: str) -> Session | None:
        """The live session under ``session_id``; None for an unknown or expired one (which
        then ends)."""
        key = _digest(session_id)
        session = self._live.get(key)
        if session is None or not hmac.compare_digest(
            session.id.encode(), session_id.encode("utf-8", "surrogateescape")
        ):
            return None
        if session.expires <= self.clock():
            del self._live[key]
            return None
        return session

    def end(self, session_id: str) -> bool:
        """End the session under ``session_id``; whether there was a live one."""
        live = self.find(session_id) is not None
        if live:
            del self._live[_digest(session_id)]
        return live

    def _drop_expired(self, now: float) -> None:
        for key in [key for key, session in self._live.items() if session.expires <= now]:
            del self._live[key]
