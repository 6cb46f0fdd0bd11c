"""What the operator declares on ``salvor serve``'s command line for definitions to name: model
endpoints, each with the one key bound to it (``--model-endpoint``), and origins, each with the
variables its headers may read (``--mcp-origin``, ``--service-origin``); parsed, keys read from
their files once, URLs compared by what they reach.

A refusal is one sentence (``CredentialError``) and never holds a key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..models import DEFAULT_KEY_ENV
from ..web import is_http_url

_DEFAULT_PORTS = {"http": 80, "https": 443}


class CredentialError(ValueError):
    """An operator's declaration is malformed or its key file unreadable;
    one sentence, no key in it."""


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
class DeclaredOrigin:
    """An origin the operator allowed definitions to dial (an MCP server's, a service's
    trigger), and the variables its headers may name."""

    origin: str
    header_envs: frozenset[str] = frozenset()


# The name `--mcp-origin`'s declarations had first.
McpOrigin = DeclaredOrigin


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


def parse_mcp_origin(text: str, flag: str = "--mcp-origin") -> DeclaredOrigin:
    """``ORIGIN[,header_env=VAR]...`` as ``--mcp-origin`` (or ``flag``: ``--service-origin``)
    takes it.

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
            f"{flag} needs an origin such as https://tools.example.com, not {origin[:80]!r}"
        )
    envs = set()
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or name != "header_env" or not value:
            raise CredentialError(
                f"{flag} takes header_env=VAR after the origin, not {option[:40]!r}"
            )
        envs.add(value)
    return DeclaredOrigin(origin=origin_of(origin), header_envs=frozenset(envs))
