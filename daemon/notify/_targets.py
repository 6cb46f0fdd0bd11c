"""Where a notification goes: the operator's webhook (an HTTP POST) or command (the body on its
stdin), and what each counts as delivered.

Both are named on the command line only (``NotifyConfig``); nothing an HTTP caller sends reaches
here. A delivery answers None when it was accepted (a 2xx, an exit status 0) and otherwise the
reason it was not, one line for the daemon's log; it never raises for what the receiver did.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import trio
from salvor import __version__

from ..processes import child_environment, kill_group, open_tied_process
from ..web import tls_context

SIGNATURE_HEADER = "X-Salvor-Signature"
# Each delivery's bound: a receiver that hangs holds its own row's retry, nothing else.
DELIVERY_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConfig:
    """The operator's notification targets (``salvor serve --notify-*``); one or both are set.

    ``secret``: the bytes each webhook body is signed with, read from the environment variable
    ``--notify-secret-env`` named when the daemon started; it is kept here only, never stored,
    logged or shown (``repr`` leaves it out).
    """

    webhook: str | None = None
    command: tuple[str, ...] | None = None
    secret: bytes | None = None
    timeout: float = DELIVERY_TIMEOUT_SECONDS

    def __repr__(self) -> str:
        signed = ", signed" if self.secret else ""
        return f"NotifyConfig(webhook={self.webhook!r}, command={self.command!r}{signed})"

    @classmethod
    def from_flags(
        cls,
        webhook: str | None,
        command: str | None,
        secret_env: str | None,
        environ: Mapping[str, str] = os.environ,
    ) -> NotifyConfig | None:
        """The config the three flags describe; None when neither target is named.

        Raises:
            ValueError: a webhook that is no http(s) URL, a command that does not parse or is
                empty, a secret variable that is unset or signs nothing (no webhook); the
                message is one sentence naming the flag.
        """
        if webhook is None and command is None:
            if secret_env is not None:
                raise ValueError(
                    "--notify-secret-env signs webhook bodies: name the webhook with "
                    "--notify-webhook URL"
                )
            return None
        if webhook is not None:
            problem = webhook_url_problem(webhook)
            if problem is not None:
                raise ValueError(f"--notify-webhook {webhook[:200]!r} {problem}")
        argv: tuple[str, ...] | None = None
        if command is not None:
            try:
                argv = tuple(shlex.split(command))
            except ValueError as exc:
                raise ValueError(f"--notify-command does not parse as a command line ({exc})")
            if not argv:
                raise ValueError("--notify-command names no command")
        secret = None
        if secret_env is not None:
            if webhook is None:
                raise ValueError(
                    "--notify-secret-env signs webhook bodies, and no --notify-webhook is named"
                )
            value = environ.get(secret_env)
            if not value:
                raise ValueError(
                    f"--notify-secret-env names {secret_env}, but that environment variable is "
                    "not set"
                )
            secret = value.encode("utf-8")
        return cls(webhook=webhook, command=argv, secret=secret)


def webhook_url_problem(url: str) -> str | None:
    """What makes ``url`` no webhook this daemon POSTs to (the end of a sentence); None: none."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port that is no number raises here
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "names no host"
    return None


def signature(secret: bytes, body: bytes) -> str:
    """The ``X-Salvor-Signature`` value of ``body``: ``sha256=`` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class Webhook:
    """POSTs each body to the operator's URL over one client for the deliverer's life."""

    def __init__(self, url: str, secret: bytes | None, timeout: float) -> None:
        self.url = url
        self._secret = secret
        self._timeout = timeout
        # No redirects: the operator named this URL, and a receiver must not send the body on.
        # No proxy variables from the environment either (trust_env), as for every call the
        # daemon makes on the operator's behalf.
        self._client = httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, trust_env=False, verify=tls_context()
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def deliver(self, body: bytes) -> str | None:
        headers = {"Content-Type": "application/json", "User-Agent": f"salvor/{__version__}"}
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = signature(self._secret, body)
        # httpx bounds each phase (connect, each read); this bounds the whole exchange, so a
        # receiver trickling bytes cannot hold a delivery slot for longer.
        with trio.move_on_after(self._timeout) as bounded:
            try:
                response = await self._client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                return f"the webhook could not be reached ({type(exc).__name__}: {exc})"
        if bounded.cancelled_caught:
            return f"the webhook did not answer within {self._timeout:g}s"
        if 200 <= response.status_code < 300:
            return None
        return f"the webhook answered HTTP {response.status_code}"


class Command:
    """Runs the operator's command once per body, the body on its stdin.

    The command gets the daemon's child-process environment (an allow-list, never the daemon's
    own: the secret and the store URL stay here), runs in a process group of its own tied to
    the daemon's life, and is killed with its group past ``timeout``. Its stderr is the daemon's,
    so what it complains about lands in the daemon's log.
    """

    def __init__(self, argv: tuple[str, ...], timeout: float) -> None:
        self.argv = argv
        self._timeout = timeout

    async def deliver(self, body: bytes) -> str | None:
        try:
            process = await open_tied_process(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env=child_environment(os.environ),
                start_new_session=True,
            )
        except OSError as exc:
            return f"the command {self.argv[0]} could not be started ({exc.strerror or exc})"
        try:
            with trio.move_on_after(self._timeout) as bounded:
                try:
                    await process.stdin.send_all(body)
                except trio.BrokenResourceError:
                    pass  # it did not read its stdin: its exit status still decides
                await process.stdin.aclose()
                await process.wait()
        finally:
            if process.returncode is None:
                kill_group(process.pid)
                with trio.CancelScope(shield=True):
                    await process.wait()
        if bounded.cancelled_caught:
            return f"the command {self.argv[0]} did not finish within {self._timeout:g}s"
        if process.returncode != 0:
            return f"the command {self.argv[0]} exited with status {process.returncode}"
        return None
