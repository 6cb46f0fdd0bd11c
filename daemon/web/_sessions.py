"""The page's login sessions: the ``Logins`` they are kept behind, in the daemon's memory
(``Sessions``) or in the store (``StoredSessions``, what ``salvor serve`` uses, so a person logged
in through one node is logged in on every node over the same store).

A person who gave the daemon's token once (``POST /v1/session``) holds a session: a random id (the
``salvor_session`` cookie's value) and a CSRF token, living ``SESSION_SECONDS``. The token itself
is never kept: a session proves the token was given, it does not hold it. In memory, a restart
ends every session and the CSRF token is random; in the store, only the id's SHA-256 is written
and the CSRF token is derived from the id (a keyed digest no reader of the store can make), so
any node can answer it from the cookie alone.

At most ``MAX_SESSIONS`` live at once; a login past that ends the oldest (expired ones go first), so
a caller who logs in in a loop costs a bounded amount of memory. Ids are looked up by their SHA-256
digest and then compared in constant time, so neither the lookup nor the compare tells a guesser
how much of an id it got right.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import trio
from salvor.protocol import format_instant
from salvor.store import LoginSessions

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


def _derived_csrf(session_id: str) -> str:
    # Another digest of the id than the one stored, so the store's rows give no CSRF token away.
    keyed = hashlib.sha256(b"salvor csrf\0" + session_id.encode("utf-8", "surrogateescape"))
    return base64.urlsafe_b64encode(keyed.digest()).rstrip(b"=").decode()


class Logins(Protocol):
    """The live login sessions, ``capacity`` at most, each lasting ``seconds``."""

    seconds: float

    async def open(self) -> Session:
        """A new session; past the capacity the expired ones end, then the oldest."""
        ...

    async def find(self, session_id: str) -> Session | None:
        """The live session under ``session_id``; None for an unknown or expired one."""
        ...

    async def end(self, session_id: str) -> bool:
        """End the session under ``session_id``; whether there was a live one."""
        ...

    async def count(self) -> int:
        """How many sessions are live now."""
        ...


class Sessions:
    """The live sessions in this process's memory, oldest first (a ``Logins``).

    ``clock`` gives seconds since the epoch (``time.time``; a test injects its own to reach an
    expiry). Every method is quick: called on the trio thread, it never blocks.
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

    async def count(self) -> int:
        self._drop_expired(self.clock())
        return len(self._live)

    async def open(self) -> Session:
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

    async def find(self, session_id: str) -> Session | None:
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

    async def end(self, session_id: str) -> bool:
        """End the session under ``session_id``; whether there was a live one."""
        live = await self.find(session_id) is not None
        if live:
            del self._live[_digest(session_id)]
        return live

    def _drop_expired(self, now: float) -> None:
        for key in [key for key, session in self._live.items() if session.expires <= now]:
            del self._live[key]


class StoredSessions:
    """The live sessions in the store (``store.sessions``), on the database's clock (a
    ``Logins``).

    Error handling: every method raises ``StoreUnavailable`` when the store cannot be read or
    written (a login is then refused, a request by cookie answered 503); nothing changed.
    """

    def __init__(
        self, rows: LoginSessions, *, seconds: float = SESSION_SECONDS, capacity: int = MAX_SESSIONS
    ) -> None:
        self.seconds = seconds
        self.capacity = capacity
        self._rows = rows

    async def open(self) -> Session:
        session_id = secrets.token_urlsafe(32)
        expires = await trio.to_thread.run_sync(
            lambda: self._rows.open(
                _digest(session_id).hex(), seconds=self.seconds, capacity=self.capacity
            )
        )
        return Session(id=session_id, csrf=_derived_csrf(session_id), expires=expires.timestamp())

    async def find(self, session_id: str) -> Session | None:
        expires = await trio.to_thread.run_sync(self._rows.find, _digest(session_id).hex())
        if expires is None:
            return None
        return Session(id=session_id, csrf=_derived_csrf(session_id), expires=expires.timestamp())

    async def end(self, session_id: str) -> bool:
        return await trio.to_thread.run_sync(self._rows.end, _digest(session_id).hex())

    async def count(self) -> int:
        return await trio.to_thread.run_sync(self._rows.count)
