"""The model gateway: one neutral model call over a provider's HTTP API.

The gateway turns a neutral ModelRequest into one HTTP exchange with an
Anthropic Messages or OpenAI Chat Completions endpoint (streamed or not),
retries what is safe to retry, and hands back a neutral ModelResult. It
runs under trio (httpx's async client, trio sleeps); the shapes themselves
live in ``_model_wire``.

A model call has no external effect, so re-issuing one after a failure or a
crash is always safe; what the gateway must never do is leak the credential.
The API key goes into a request header and nowhere else: not into error
messages, not into results, not into logs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from salvor.protocol import SSEDecoder

from ..web import tls_context
from ._clients import ModelClients
from ._demo import demo_complete
from ._wire import WIRES, StreamedError, WireError, error_message, ticker

# Receives each piece of a streamed call's ticker text as it arrives.
Delta = Callable[[dict[str, Any]], Awaitable[None]]

PUBLIC_BASE_URLS = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com",
}
DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
PROVIDERS = ("anthropic", "openai", "demo")

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_BACKOFF_CAP_SECONDS = 8.0
# Error types a provider may send inside a stream that mean "try again".
_RETRYABLE_STREAM_ERRORS = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "server_error", "timeout_error"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEndpoint:
    """Where and how to reach a model: wire format, base URL, credential."""

    provider: str
    base_url: str | None
    api_key: str | None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(
                f"unknown model provider {self.provider!r}; expected one of {PROVIDERS}"
            )

    def __repr__(self) -> str:
        # The dataclass repr would print the key into tracebacks and logs.
        key = "None" if self.api_key is None else "'<redacted>'"
        return (
            f"ModelEndpoint(provider={self.provider!r}, base_url={self.base_url!r}, api_key={key})"
        )


def resolve_endpoint(
    *,
    provider: str = "anthropic",
    base_url: str | None = None,
    base_url_env: str | None = None,
    api_key_env: str | None = None,
    environ: Mapping[str, str],
) -> ModelEndpoint:
    """Decide an agent's model endpoint from its definition and the environment.

    The base URL is the variable named by ``base_url_env`` when it is set and
    non-empty, else ``base_url``, else ``SALVOR_MODEL_BASE_URL``, else the
    provider's public endpoint. The key is read from ``api_key_env``, or the
    provider's usual variable; a missing or empty key means no auth header.

    Raises:
      ValueError: ``provider`` is not one of anthropic, openai, demo.
    """
    if provider not in PROVIDERS:
        raise ValueError(f"unknown model provider {provider!r}; expected one of {PROVIDERS}")
    if provider == "demo":
        return ModelEndpoint(provider="demo", base_url=None, api_key=None)
    url = (
        (environ.get(base_url_env) if base_url_env else None)
        or base_url
        or environ.get("SALVOR_MODEL_BASE_URL")
        or PUBLIC_BASE_URLS[provider]
    )
    key = environ.get(api_key_env or DEFAULT_KEY_ENV[provider]) or None
    return ModelEndpoint(provider=provider, base_url=url, api_key=key)


def endpoint_url(base_url: str, path: str) -> str:
    """``{base}/v1/{path}``, whether or not the base already ends in ``/v1``."""
    base = base_url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/v1/{path}"


def retry_delay(attempt: int, first_delay: float) -> float:
    """Seconds to wait after failed attempt ``attempt`` (0-based): doubling, capped."""
    return min(first_delay * 2**attempt, _BACKOFF_CAP_SECONDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResult:
    """A neutral ModelResponse and its Usage, both plain JSON."""

    response: dict[str, Any]
    usage: dict[str, Any]


class ModelCallError(Exception):
    """A model call failed; nothing was recorded as its answer.

    Attributes:
      message: what went wrong, with the HTTP status and the provider's own
        message when there was one. Never contains the API key.
      status: the HTTP status, or None for connection errors and timeouts.
      retryable: whether issuing the same request again may succeed.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable


class ModelGateway:
    """Issues neutral model requests to one endpoint.

    Args:
      endpoint: where to send requests.
      stream: ask for server-sent events instead of one JSON body. The
        assembled result is the same either way.
      max_retries: extra attempts after a retryable failure (connection
        error, timeout, HTTP 408/409/429/5xx).
      timeout_seconds: httpx timeout for connecting and for each read.
      retry_backoff_seconds: the first backoff; it doubles per attempt and is
        capped at 8 seconds. Tests pass a small value.
      http_client: a client to share; the gateway closes only a client it
        created itself.
      clients: where to borrow a client from (given back by ``aclose``), when
        ``http_client`` is not given: a daemon keeps its clients between drives.
    """

    def __init__(
        self,
        endpoint: ModelEndpoint,
        *,
        stream: bool = False,
        max_retries: int = 2,
        timeout_seconds: float = 120.0,
        retry_backoff_seconds: float = 0.5,
        http_client: httpx.AsyncClient | None = None,
        clients: ModelClients | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._endpoint = endpoint
        self._stream = stream
        self._max_retries = max_retries
        self._backoff = retry_backoff_seconds
        self._timeout = httpx.Timeout(timeout_seconds)
        self._owns_client = http_client is None and endpoint.provider != "demo"
        self._client = http_client
        self._lender = clients if self._owns_client else None
        if endpoint.provider != "demo":
            # Parsed once here, not on every call: httpx parses a URL given as text again for
            # each request, and these are the same for every call of the gateway.
            self._wire = WIRES[endpoint.provider]
            base_url = endpoint.base_url or PUBLIC_BASE_URLS[endpoint.provider]
            self._url_text = endpoint_url(base_url, self._wire.path)
            self._url = httpx.URL(self._url_text)
            self._headers = self._wire.headers(endpoint.api_key)
        if self._lender is not None:
            self._client = self._lender.lend()
        elif self._owns_client:
            self._client = httpx.AsyncClient(timeout=self._timeout, verify=tls_context())

    async def aclose(self) -> None:
        """Give the HTTP client back to where it was borrowed, or close it if this gateway
        created it."""
        if not self._owns_client or self._client is None:
            return
        client, self._client = self._client, None
        if self._lender is not None:
            await self._lender.give_back(client)
        else:
            await client.aclose()

    async def complete(
        self, request: dict[str, Any], *, on_delta: Delta | None = None
    ) -> ModelResult:
        """Issue one neutral model request and return its neutral result.

        ``on_delta``: stream this call and hand every piece of ticker text
        (and the usage) to it as it arrives. Once a piece has gone out, a
        failure is not retried: the watcher would see the text twice.

        Raises:
          ModelCallError: the provider refused the request, or every attempt
            failed. No partial answer is kept.

        Cancellation:
          Not shielded: a cancelled call simply has no answer, and the
          caller's open intent says it may be re-issued.
        """
        if self._endpoint.provider == "demo":
            await trio.lowlevel.checkpoint()
            response, usage = demo_complete(request)
            return ModelResult(response=response, usage=usage)

        attempt = 0
        sent = [False]

        async def relay(delta: dict[str, Any]) -> None:
            sent[0] = True
            await on_delta(delta)

        while True:
            try:
                response, usage = await self._attempt(
                    request, relay if on_delta is not None else None
                )
                return ModelResult(response=response, usage=usage)
            except ModelCallError as error:
                if not error.retryable or attempt >= self._max_retries or sent[0]:
                    if attempt:
                        error.message = f"{error.message} (after {attempt + 1} attempts)"
                        error.args = (error.message,)
                    raise
            await trio.sleep(retry_delay(attempt, self._backoff))
            attempt += 1

    async def _attempt(
        self, request: dict[str, Any], on_delta: Delta | None = None
    ) -> tuple[dict, dict]:
        provider, wire, url, headers = self._endpoint.provider, self._wire, self._url, self._headers
        assert self._client is not None
        stream = self._stream or on_delta is not None
        body = wire.body(request, stream=stream)
        model = request["model"]
        try:
            if stream:
                headers = {**headers, "accept": "text/event-stream"}
                async with self._client.stream(
                    "POST", url, json=body, headers=headers, timeout=self._timeout
                ) as reply:
                    if reply.status_code >= 400:
                        await reply.aread()
                        raise self._status_error(reply)
                    assembler = wire.stream(fallback_model=model)
                    decoder = SSEDecoder()
                    async for chunk in reply.aiter_bytes():
                        for event in decoder.feed(chunk):
                            assembler.feed(event.event, event.data)
                            if (
                                on_delta is not None
                                and (delta := ticker(provider, event.event, event.data)) is not None
                            ):
                                await on_delta(delta)
                    for event in decoder.close():
                        assembler.feed(event.event, event.data)
                    return assembler.finish()
            reply = await self._client.post(url, json=body, headers=headers, timeout=self._timeout)
            if reply.status_code >= 400:
                raise self._status_error(reply)
            return wire.decode(reply.json(), fallback_model=model)
        except httpx.TimeoutException:
            raise ModelCallError(
                f"{provider} model call to {self._url_text} timed out", retryable=True
            ) from None
        except httpx.TransportError as error:
            raise ModelCallError(
                f"{provider} model call to {self._url_text} failed: {self._redact(str(error))}",
                retryable=True,
            ) from None
        except StreamedError as error:
            raise ModelCallError(
                f"{provider} stream reported an error: {self._redact(error.message)}",
                retryable=error.kind in _RETRYABLE_STREAM_ERRORS,
            ) from None
        except (WireError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ModelCallError(
                f"{provider} answered with a malformed response: {self._redact(str(error))}"
            ) from None

    def _status_error(self, reply: httpx.Response) -> ModelCallError:
        status = reply.status_code
        try:
            detail = error_message(reply.json())
        except ValueError:
            detail = reply.text[:500] or None
        message = f"{self._endpoint.provider} model call failed with HTTP {status}"
        if detail:
            message += f": {self._redact(detail)}"
        retryable = status in _RETRYABLE_STATUS or status >= 500
        return ModelCallError(message, status=status, retryable=retryable)

    def _redact(self, text: str) -> str:
        # Providers sometimes echo (part of) a rejected key; never pass it on.
        key = self._endpoint.api_key
        return text.replace(key, "<redacted>") if key else text
