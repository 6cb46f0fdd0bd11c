"""What the served document says of the origins a definition may dial: exactly those the
operator declared (``--mcp-origin``, ``--service-origin``), and only the header variables bound
to each, so a definition the document admits is one registration accepts, and one it refuses is
refused (``agents.Credentials.check_reach`` is the rule; this is its shape in JSON Schema).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..agents import DeclaredOrigin
from ._schema import JSON

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Nothing may be dialled: the branch or field admits no value at all.
NOTHING: JSON = {"not": {}}


def _any_case(text: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in text)


def url_on(origin: str) -> str:
    """A pattern of the URLs on ``origin`` (``scheme://host:port``, as ``origin_of`` spells it):
    scheme and host in any case, a default port written or left out."""
    scheme, _, authority = origin.partition("://")
    host, _, port = authority.rpartition(":")
    port_part = f"(:{port})?" if int(port) == _DEFAULT_PORTS.get(scheme) else f":{port}"
    return f"^{_any_case(scheme)}://{_any_case(host)}{port_part}([/?#].*)?$"


def value_naming_only(names: Iterable[str]) -> str:
    """A pattern of the header values whose every ``${NAME}`` is one of ``names``."""
    bound = "|".join(re.escape(name) for name in sorted(names))
    placeholder = rf"|\$\{{(?:{bound})\}}" if bound else ""
    return rf"^([^\r\n\u0000$]|\$(?!\{{){placeholder})*$"


def dialled(origins: Iterable[DeclaredOrigin], *, bearer: bool) -> list[JSON]:
    """One ``anyOf`` branch per declared origin: its URLs, and header values (and, where a
    server has one, ``bearer_token_env``) naming only what the operator bound to it."""
    branches = []
    for declared in sorted(origins, key=lambda d: d.origin):
        properties: JSON = {
            "url": {"pattern": url_on(declared.origin)},
            "headers": {
                "additionalProperties": {"pattern": value_naming_only(declared.header_envs)}
            },
        }
        if bearer:
            envs = sorted(declared.header_envs)
            properties["bearer_token_env"] = {"enum": envs} if envs else NOTHING
        branches.append({"properties": properties})
    return branches
