"""Where the daemon's credentials may go: the endpoints and MCP origins the operator declared.

A credential is bound to an endpoint by the operator (``salvor serve
--model-endpoint``, ``--mcp-origin``, the providers' public hosts, the
daemon's ``SALVOR_MODEL_BASE_URL``). A definition that arrives over HTTP may
only *name* one of those endpoints: it never picks a URL, a variable or a
file, and the key sent with a request is always the one bound to the
endpoint the request goes to. Agent files the operator runs from the command
line are trusted and resolve as they always have (``resolve_endpoint``).

Keys held in files (``key_file=``, ``SALVOR_AGENT_KEY_FILE``,
``$CREDENTIALS_DIRECTORY``) are read once, at start; a key never appears in a
repr, a log line or an error message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..models import DEFAULT_KEY_ENV, PUBLIC_BASE_URLS, ModelEndpoint, resolve_endpoint
from ..web import header_placeholders, is_http_url

# systemd's LoadCredential= names, by what they hold.
AGENT_KEY_CREDENTIAL = "agent-key"
PROVIDER_KEY_CREDENTIALS = {"anthropic": "anthropic-api-key", "openai": "openai-api-key"}
_ENDPOINT_HINT = "salvor serve --model-endpoint URL[,key_env=VAR|,key_file=PATH]"
_ORIGIN_HINT = "salvor serve --mcp-origin ORIGIN[,header_env=VAR]"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class CredentialError(ValueError):
    """An operator's declaration is malformed or its key file unreadable;
    one sentence, no key in it."""


class Undeclared(ValueError):
    """A definition from HTTP names an endpoint, variable or origin the operator did not declare."""


def _host_port(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 0)


def normalise_endpoint(url: str) -> str:
    """A model base URL compared by what it reaches: a trailing ``/`` or ``/v1`` does not matter."""
    scheme, host, port = _host_port(url)
    path = urlsplit(url).path.rstrip("/").removesuffix("/v1").rstrip("/")
    query = urlsplit(url).query
    return f"{scheme}://{host}:{port}{path}" + (f"?{query}" if query else "")


def origin_of(url: str) -> str:
    """``scheme://host:port`` of a URL, the default port spelled out."""
    scheme, host, port = _host_port(url)
    return f"{scheme}://{host}:{port}"


def read_key_file(path: str, what: str) -> str:
    """The key a file holds, its trailing newline stripped.

    Raises:
        CredentialError: the file cannot be read, is not UTF-8, or is empty.
    """
    try:
        key = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise CredentialError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CredentialError(f"{what} {path!r} is not UTF-8 text") from None
    if not key or any(c in key for c in "\r\n\0"):
        raise CredentialError(f"{what} {path!r} must hold one key on one line")
    return key


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclaredEndpoint:
    """A model endpoint the operator named, and the one credential bound to it.

    ``key_env``: the variable holding its key. ``key``: a key read from a
    file at start. ``provider_default``: the provider's usual key (the
    daemon's ``SALVOR_MODEL_BASE_URL``). With none of them, no key is sent.
    """

    base_url: str
    key_env: str | None = None
    key: str | None = field(default=None, repr=False)
    provider_default: bool = False

    def bound_env(self, provider: str) -> str | None:
        """The variable whose key this endpoint gets (None: a file's key, or no key)."""
        return DEFAULT_KEY_ENV.get(provider) if self.provider_default else self.key_env

    def key_for(
        self, provider: str, environ: Mapping[str, str], provider_keys: Mapping[str, str]
    ) -> str | None:
        """The key sent to this endpoint.

        ``provider_keys``: variable name -> the key systemd's credential of
        that name holds, used when the variable itself is unset.
        """
        if self.key is not None:
            return self.key
        env = self.bound_env(provider)
        if env is None:
            return None
        return environ.get(env) or provider_keys.get(env)


@dataclass(frozen=True, slots=True, kw_only=True)
class McpOrigin:
    """An MCP origin the operator allowed, and the variables its headers may name."""

    origin: str
    header_envs: frozenset[str] = frozenset()


def parse_model_endpoint(text: str) -> DeclaredEndpoint:
    """``URL[,key_env=VAR|,key_file=PATH]`` as ``--model-endpoint`` takes it (the file is read now).

    Raises:
        CredentialError: one sentence naming what is wrong.
    """
    url, *options = text.split(",")
    if not is_http_url(url):
        raise CredentialError(
            f"--model-endpoint needs an http:// or https:// URL first, not {url[:80]!r}"
        )
    found: dict[str, str] = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or name not in ("key_env", "key_file") or not value:
            raise CredentialError(
                "--model-endpoint takes key_env=VAR or key_file=PATH "
                f"after the URL, not {option[:40]!r}"
            )
        found[name] = value
    if len(found) > 1 or len(options) > 1:
        raise CredentialError(
            "--model-endpoint takes one of key_env=VAR or key_file=PATH, not both"
        )
    if "key_file" in found:
        return DeclaredEndpoint(
            base_url=url, key=read_key_file(found["key_file"], "the key_file of --model-endpoint")
        )
    return DeclaredEndpoint(base_url=url, key_env=found.get("key_env"))


def parse_mcp_origin(text: str) -> McpOrigin:
    """``ORIGIN[,header_env=VAR]...`` as ``--mcp-origin`` takes it.

    Raises:
        CredentialError: one sentence naming what is wrong.
    """
    origin, *options = text.split(",")
    parts = urlsplit(origin) if is_http_url(origin) else None
    if (
        parts is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise CredentialError(
            f"--mcp-origin needs an origin such as https://tools.example.com, not {origin[:80]!r}"
        )
    envs = set()
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or name != "header_env" or not value:
            raise CredentialError(
                f"--mcp-origin takes header_env=VAR after the origin, not {option[:40]!r}"
            )
        envs.add(value)
    return McpOrigin(origin=origin_of(origin), header_envs=frozenset(envs))


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmChoice:
    """One endpoint a definition from HTTP may name for ``provider``, with the
    only ``api_key_env`` it may give.

    ``default``: the endpoint ``provider`` reaches with no ``base_url``.
    ``key_env`` None: ``api_key_env`` must be left out.
    """

    provider: str
    base_url: str
    key_env: str | None
    default: bool


class Credentials:
    """The operator's declarations, and the keys bound to them.

    ``strict``: the daemon's rule, that a request carries only the key bound
    to the endpoint it goes to. A bare ``Credentials()`` (the command line)
    resolves agent files exactly as ``resolve_endpoint`` always has.
    """

    def __init__(
        self,
        *,
        endpoints: tuple[DeclaredEndpoint, ...] = (),
        mcp_origins: tuple[McpOrigin, ...] = (),
        provider_keys: Mapping[str, str] | None = None,
        upstream_key: str | None = None,
        strict: bool = False,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.environ = environ
        self.strict = strict
        self.upstream_key = upstream_key
        self._provider_keys = dict(provider_keys or {})
        self._endpoints: dict[str, DeclaredEndpoint] = {}
        self._origins: dict[str, McpOrigin] = {}
        # The daemon-wide variable and the public hosts are declared by being there.
        implicit = []
        if environ.get("SALVOR_MODEL_BASE_URL"):
            implicit.append(
                DeclaredEndpoint(base_url=environ["SALVOR_MODEL_BASE_URL"], provider_default=True)
            )
        implicit += [
            DeclaredEndpoint(base_url=url, key_env=DEFAULT_KEY_ENV[p])
            for p, url in PUBLIC_BASE_URLS.items()
        ]
        for endpoint in (*endpoints, *implicit):
            self.declare_endpoint(endpoint)
        for origin in mcp_origins:
            self.declare_origin(origin)

    def __repr__(self) -> str:
        return (
            f"Credentials(endpoints={list(self._endpoints)!r}, "
            f"mcp_origins={list(self._origins)!r}, strict={self.strict})"
        )

    @classmethod
    def for_daemon(
        cls,
        model_endpoints=(),
        mcp_origins=(),
        *,
        environ: Mapping[str, str] = os.environ,
    ) -> Credentials:
        """The daemon's declarations from its flags and environment; every key file is read now.

        Raises:
            CredentialError: a flag is malformed or a key file unreadable;
                nothing is started.
        """
        endpoints = tuple(parse_model_endpoint(text) for text in model_endpoints)
        origins = tuple(parse_mcp_origin(text) for text in mcp_origins)
        directory = environ.get("CREDENTIALS_DIRECTORY")
        provider_keys = {}
        upstream_key = None
        if directory:
            # systemd's LoadCredential=: only the names we know, and only those it loaded.
            for provider, name in PROVIDER_KEY_CREDENTIALS.items():
                path = os.path.join(directory, name)
                if os.path.exists(path):
                    provider_keys[DEFAULT_KEY_ENV[provider]] = read_key_file(
                        path, f"the credential {name}"
                    )
            path = os.path.join(directory, AGENT_KEY_CREDENTIAL)
            if os.path.exists(path):
                upstream_key = read_key_file(path, f"the credential {AGENT_KEY_CREDENTIAL}")
        if environ.get("SALVOR_AGENT_KEY_FILE"):
            upstream_key = read_key_file(environ["SALVOR_AGENT_KEY_FILE"], "SALVOR_AGENT_KEY_FILE")
        return cls(
            endpoints=endpoints,
            mcp_origins=origins,
            provider_keys=provider_keys,
            upstream_key=upstream_key,
            strict=True,
            environ=environ,
        )

    def declare_endpoint(self, endpoint: DeclaredEndpoint) -> None:
        """Add one declaration; the first one for an endpoint wins
        (flags before the implicit ones)."""
        self._endpoints.setdefault(normalise_endpoint(endpoint.base_url), endpoint)

    def declare_origin(self, origin: McpOrigin) -> None:
        self._origins.setdefault(origin.origin, origin)

    def declared(self, url: str) -> DeclaredEndpoint | None:
        try:
            return self._endpoints.get(normalise_endpoint(url))
        except ValueError:  # a port that is not a number: nobody declared that
            return None

    def llm_choices(self) -> tuple[LlmChoice, ...]:
        """Every (provider, endpoint, key variable) an ``[llm]`` table from HTTP may
        name, for the OpenAPI document.

        Exactly what ``check_llm`` admits for a real provider, up to the
        spelling of a URL (a trailing ``/`` or ``/v1`` reaches the same one).
        """
        choices = []
        for provider in PUBLIC_BASE_URLS:
            default = self.environ.get("SALVOR_MODEL_BASE_URL") or PUBLIC_BASE_URLS[provider]
            for endpoint in self._endpoints.values():
                if not is_http_url(endpoint.base_url):
                    # A SALVOR_MODEL_BASE_URL that is no URL: check_llm admits no definition there.
                    continue
                choices.append(
                    LlmChoice(
                        provider=provider,
                        base_url=endpoint.base_url,
                        key_env=endpoint.bound_env(provider),
                        default=self.declared(default) is endpoint
                        if is_http_url(default)
                        else False,
                    )
                )
        return tuple(choices)

    # -- what a definition from HTTP may name ----------------------------------------

    def check_llm(
        self,
        *,
        provider: str,
        base_url: str | None,
        base_url_env: str | None,
        api_key_env: str | None,
    ) -> None:
        """Refuse an ``[llm]`` table from HTTP that picks an endpoint or a
        variable the operator did not bind.

        Raises:
            Undeclared: one sentence naming the field and the flag that allows it.
        """
        if base_url_env is not None:
            raise Undeclared(
                "[llm] base_url_env makes the daemon read a variable of its own, so it is only "
                "honoured in agent files run with `salvor run`; over HTTP name an endpoint the "
                f"operator declared with `{_ENDPOINT_HINT}`"
            )
        if provider == "demo":
            return
        url = base_url or self.environ.get("SALVOR_MODEL_BASE_URL") or PUBLIC_BASE_URLS[provider]
        declared = self.declared(url) if is_http_url(url) else None
        if declared is None:
            raise Undeclared(
                f"[llm] base_url {url[:80]!r} is not a model endpoint this daemon's operator "
                f"declared; the operator allows one with `{_ENDPOINT_HINT}`"
            )
        if api_key_env is not None and api_key_env != declared.bound_env(provider):
            raise Undeclared(
                f"[llm] api_key_env {api_key_env[:64]!r} is not the key the operator bound to "
                f"{declared.base_url[:80]!r}; leave it out (the endpoint's own key is used), or "
                f"the operator binds it with `{_ENDPOINT_HINT}`"
            )

    def check_mcp_url(
        self, server: str, url: str, headers: Mapping[str, str], bearer_token_env: str | None
    ) -> None:
        """Refuse an MCP ``url`` server from HTTP on an undeclared origin,
        or naming an unbound variable.

        Raises:
            Undeclared: one sentence naming the server and the flag that allows it.
        """
        allowed = self._origins.get(origin_of(url))
        if allowed is None:
            raise Undeclared(
                f"[[mcp_servers]] {server!r}: `url` {origin_of(url)[:80]!r} is not an MCP origin "
                "this daemon's operator declared, so it is not contacted; the operator "
                f"allows one with `{_ORIGIN_HINT}`"
            )
        named = [name for value in headers.values() for name in header_placeholders(value)]
        if bearer_token_env is not None:
            named.append(bearer_token_env)
        unbound = next((name for name in named if name not in allowed.header_envs), None)
        if unbound is not None:
            raise Undeclared(
                f"[[mcp_servers]] {server!r}: the headers name ${{{unbound[:64]}}}, which the "
                f"operator did not bind to {allowed.origin}; the operator "
                f"binds it with `{_ORIGIN_HINT}`"
            )

    # -- what a drive sends ----------------------------------------------------

    def endpoint_for(
        self,
        *,
        provider: str,
        base_url: str | None,
        base_url_env: str | None,
        api_key_env: str | None,
    ) -> ModelEndpoint:
        """The endpoint a definition reaches and the key that goes with it.

        Strict (the daemon): the URL resolves as it always has; a declared
        endpoint gets its own bound key; one nobody declared (an agent file
        the operator wrote) gets the key its ``api_key_env`` names, or none,
        never a provider's default key.
        """
        resolved = resolve_endpoint(
            provider=provider,
            base_url=base_url,
            base_url_env=base_url_env,
            api_key_env=api_key_env,
            environ=self.environ,
        )
        if resolved.provider == "demo" or not self.strict:
            return resolved
        declared = self.declared(resolved.base_url)
        if declared is not None and api_key_env in (None, declared.bound_env(provider)):
            key = declared.key_for(provider, self.environ, self._provider_keys)
        else:
            key = (self.environ.get(api_key_env) or None) if api_key_env is not None else None
        return ModelEndpoint(provider=provider, base_url=resolved.base_url, api_key=key)
