"""Where the daemon's credentials may go: the one rule for what a definition may name.

A credential is bound to an endpoint by the operator (``salvor serve
--model-endpoint``, ``--mcp-origin``, ``--service-origin``, the providers'
public hosts, the daemon's ``SALVOR_MODEL_BASE_URL``). A definition the
daemon holds may only *name* one of those endpoints: it never picks a URL, a
variable or a file, and the key sent with a request is always the one bound
to the endpoint the request goes to. ``Credentials.check_reach`` is that
rule, for every field of every kind that names a URL, a header variable or a
key (a built-in agent's ``[llm]``, a service agent's ``url`` and
``headers``, every ``url`` MCP server's origin, headers and
``bearer_token_env``); a stdio server's and a process agent's ``env`` are
passed as written and name nothing of the daemon's. The daemon applies it
when a definition is registered and again before each drive, so a definition
stored before the operator changed the flags is never dialled with a secret.
Agent files the operator runs from the command line (``salvor run``) are
trusted and resolve as they always have (``resolve_endpoint``).

Keys held in files (``key_file=``, ``SALVOR_AGENT_KEY_FILE``,
``$CREDENTIALS_DIRECTORY``) are read once, at start; a key never appears in a
repr, a log line or an error message.

The declarations themselves (what the flags say, parsed) are ``_operator_declarations``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..models import DEFAULT_KEY_ENV, PUBLIC_BASE_URLS, ModelEndpoint, resolve_endpoint
from ..web import header_placeholders, is_http_url
from ._operator_declarations import (
    CredentialError,
    DeclaredEndpoint,
    DeclaredOrigin,
    McpOrigin,
    normalise_endpoint,
    origin_of,
    parse_mcp_origin,
    parse_model_endpoint,
    read_key_file,
)

# The operator's declarations are offered here too, beside the rule that holds definitions to
# them (the tests and the test server take them from this module).
__all__ = [
    "CredentialError",
    "Credentials",
    "DeclaredEndpoint",
    "DeclaredOrigin",
    "LlmChoice",
    "McpOrigin",
    "Undeclared",
    "normalise_endpoint",
    "origin_of",
    "parse_mcp_origin",
    "parse_model_endpoint",
    "read_key_file",
]

# systemd's LoadCredential= names, by what they hold.
AGENT_KEY_CREDENTIAL = "agent-key"
PROVIDER_KEY_CREDENTIALS = {"anthropic": "anthropic-api-key", "openai": "openai-api-key"}
_ENDPOINT_HINT = "salvor serve --model-endpoint URL[,key_env=VAR|,key_file=PATH]"
_ORIGIN_HINTS = {
    "mcp": "salvor serve --mcp-origin ORIGIN[,header_env=VAR]",
    "service": "salvor serve --service-origin ORIGIN[,header_env=VAR]",
}


class Undeclared(ValueError):
    """A definition names an endpoint, variable or origin the operator did not declare.

    ``at``: the field it is about, as ``DefinitionError.at`` says it. The message
    names the field and the flag that allows it, never a variable's value.
    """

    def __init__(self, message: str, *, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.at = at


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
        mcp_origins: tuple[DeclaredOrigin, ...] = (),
        service_origins: tuple[DeclaredOrigin, ...] = (),
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
        # What dials an origin ("mcp", "service") -> origin -> its declaration.
        self._origins: dict[str, dict[str, DeclaredOrigin]] = {"mcp": {}, "service": {}}
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
        for origin in service_origins:
            self.declare_origin(origin, dialled_by="service")

    def __repr__(self) -> str:
        return (
            f"Credentials(endpoints={list(self._endpoints)!r}, "
            f"mcp_origins={list(self._origins['mcp'])!r}, "
            f"service_origins={list(self._origins['service'])!r}, strict={self.strict})"
        )

    @classmethod
    def for_daemon(
        cls,
        model_endpoints=(),
        mcp_origins=(),
        service_origins=(),
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
        services = tuple(parse_mcp_origin(text, "--service-origin") for text in service_origins)
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
            service_origins=services,
            provider_keys=provider_keys,
            upstream_key=upstream_key,
            strict=True,
            environ=environ,
        )

    def declare_endpoint(self, endpoint: DeclaredEndpoint) -> None:
        """Add one declaration; the first one for an endpoint wins
        (flags before the implicit ones)."""
        self._endpoints.setdefault(normalise_endpoint(endpoint.base_url), endpoint)

    def declare_origin(self, origin: DeclaredOrigin, dialled_by: str = "mcp") -> None:
        """Allow definitions to dial ``origin`` as an MCP server (``"mcp"``) or a service's
        trigger (``"service"``)."""
        self._origins[dialled_by].setdefault(origin.origin, origin)

    def declared(self, url: str) -> DeclaredEndpoint | None:
        try:
            return self._endpoints.get(normalise_endpoint(url))
        except ValueError:  # a port that is not a number: nobody declared that
            return None

    def origins(self, dialled_by: str) -> tuple[DeclaredOrigin, ...]:
        """The origins the operator declared for ``dialled_by`` (``"mcp"``, ``"service"``), for
        the OpenAPI document."""
        return tuple(self._origins[dialled_by].values())

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

    # -- what a definition may name: the one rule ---------------------------------------

    def check_reach(self, agent: Any) -> None:
        """Refuse a definition that names a URL, a header variable or a key the operator did
        not declare, in any field of any kind.

        ``agent``: an ``AgentDefinition`` (read by its fields, so this module needs none of the
        parsers). A built-in agent's ``[llm]`` must name a declared model endpoint and only the
        key bound to it; a service agent's ``url`` a declared service origin and its
        ``headers`` only the variables bound to it; every ``url`` MCP server (a built-in's,
        a process's) a declared MCP origin and only its variables. A stdio
        server's ``command`` and ``env`` and a process agent's ``env`` are passed as written:
        salvor fills nothing in from its own environment, so they name nothing.

        Raises:
            Undeclared: one sentence naming the field and the flag that allows it; ``at`` is
                the field.
        """
        if agent.kind == "builtin":
            llm = agent.llm
            self.check_llm(
                provider=llm.provider,
                base_url=llm.base_url,
                base_url_env=llm.base_url_env,
                api_key_env=llm.api_key_env,
            )
        if agent.service is not None:
            self.check_service(agent.service.url, agent.service.headers)
        for index, server in enumerate(agent.mcp_servers):
            if server.url is not None:
                try:
                    self.check_mcp_url(
                        server.name, server.url, server.headers, server.bearer_token_env
                    )
                except Undeclared as exc:
                    raise Undeclared(str(exc), at=("mcp_servers", index)) from None

    def check_llm(
        self,
        *,
        provider: str,
        base_url: str | None,
        base_url_env: str | None,
        api_key_env: str | None,
    ) -> None:
        """Refuse an ``[llm]`` table that picks an endpoint or a variable the operator did not
        bind.

        Raises:
            Undeclared: one sentence naming the field and the flag that allows it.
        """
        if base_url_env is not None:
            raise Undeclared(
                "[llm] base_url_env makes the daemon read a variable of its own, so it is only "
                "honoured in agent files run with `salvor run`; over HTTP name an endpoint the "
                f"operator declared with `{_ENDPOINT_HINT}`",
                at=("llm",),
            )
        if provider == "demo":
            return
        url = base_url or self.environ.get("SALVOR_MODEL_BASE_URL") or PUBLIC_BASE_URLS[provider]
        declared = self.declared(url) if is_http_url(url) else None
        if declared is None:
            raise Undeclared(
                f"[llm] base_url {url[:80]!r} is not a model endpoint this daemon's operator "
                f"declared; the operator allows one with `{_ENDPOINT_HINT}`",
                at=("llm",),
            )
        if api_key_env is not None and api_key_env != declared.bound_env(provider):
            raise Undeclared(
                f"[llm] api_key_env {api_key_env[:64]!r} is not the key the operator bound to "
                f"{declared.base_url[:80]!r}; leave it out (the endpoint's own key is used), or "
                f"the operator binds it with `{_ENDPOINT_HINT}`",
                at=("llm",),
            )

    def check_mcp_url(
        self, server: str, url: str, headers: Mapping[str, str], bearer_token_env: str | None
    ) -> None:
        """Refuse an MCP ``url`` server on an undeclared origin, or naming an unbound variable.

        Raises:
            Undeclared: one sentence naming the server and the flag that allows it.
        """
        named = [name for value in headers.values() for name in header_placeholders(value)]
        if bearer_token_env is not None:
            named.append(bearer_token_env)
        where = f"[[mcp_servers]] {server!r}:"
        self._check_origin("mcp", url, f"{where} `url`", named, f"{where} the headers")

    def check_service(self, url: str, headers: Mapping[str, str]) -> None:
        """Refuse a service agent's trigger ``url`` on an undeclared origin, or ``headers``
        naming an unbound variable.

        Raises:
            Undeclared: one sentence naming the field and the flag that allows it.
        """
        self._check_origin("service", url, "`url`", [], "", at=("url",))
        for header, value in headers.items():
            self._check_origin(
                "service",
                url,
                "`url`",
                header_placeholders(value),
                f"`headers` value of {header}",
                at=("headers", header),
            )

    def _check_origin(
        self,
        dialled_by: str,
        url: str,
        url_field: str,
        named: list[str],
        headers_field: str,
        at: tuple[str | int, ...] = (),
    ) -> None:
        """May a definition make the daemon dial ``url``, sending the variables ``named``?
        Only on an origin the operator declared for ``dialled_by`` (``"mcp"``, ``"service"``),
        and only the variables the operator bound to that origin."""
        hint = _ORIGIN_HINTS[dialled_by]
        what = "an MCP origin" if dialled_by == "mcp" else "a service origin"
        allowed = self._origins[dialled_by].get(origin_of(url)) if is_http_url(url) else None
        if allowed is None:
            raise Undeclared(
                f"{url_field} {origin_of(url)[:80]!r} is not {what} this daemon's operator "
                f"declared, so it is not contacted; the operator allows one with `{hint}`",
                at=at,
            )
        unbound = next((name for name in named if name not in allowed.header_envs), None)
        if unbound is not None:
            raise Undeclared(
                f"{headers_field} name{'s' if dialled_by == 'service' else ''} "
                f"${{{unbound[:64]}}}, which the operator did not bind to {allowed.origin}; the "
                f"operator binds it with `{hint}`",
                at=at,
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
        endpoint gets its own bound key; one nobody declared gets no key at all
        (``check_reach`` fails such a run before its drive asks for one; this is
        the second lock on the same door).
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
        key = None
        if declared is not None and api_key_env in (None, declared.bound_env(provider)):
            key = declared.key_for(provider, self.environ, self._provider_keys)
        return ModelEndpoint(provider=provider, base_url=resolved.base_url, api_key=key)
