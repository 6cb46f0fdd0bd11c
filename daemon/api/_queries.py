"""The queries of ``GET /v1/runs`` and ``GET /v1/reconciliations``, declared once: the names each
handler takes and the parameters the OpenAPI document lists, and the paging both share.

The handler refuses a name outside ``RUNS_QUERY`` (400 ``bad_request``, naming the ones it takes)
and reads each value by its own rule; the document's ``parameters`` are ``RUNS_QUERY.described()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from salvor.protocol import RunState

from ..web import bad_request, whole_number
from ._schema import JSON

MAX_PAGE = 1000
# An agent's or a graph's content hash, as the API names both.
HASH_PATTERN = "^sha256:[0-9a-f]{64}$"


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryParameter:
    name: str
    schema: JSON
    description: str = ""

    def described(self) -> JSON:
        parameter = {"name": self.name, "in": "query", "schema": self.schema}
        return {**parameter, "description": self.description} if self.description else parameter


@dataclass(frozen=True, slots=True)
class Query:
    parameters: tuple[QueryParameter, ...]
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(p.name for p in self.parameters))

    def refuse_unknown(self, given: Iterable[str]) -> None:
        """Refuse a name the query does not take.

        Raises:
            OperationRefused: bad_request, for the first name (in order) the query does not take.
        """
        unknown = sorted(set(given) - self.names)
        if unknown:
            raise bad_request(
                f"unknown query parameter `{unknown[0]}`; use "
                f"{', '.join(p.name for p in self.parameters)}"
            )

    def described(self) -> list[JSON]:
        return [p.described() for p in self.parameters]


_LIMIT = QueryParameter(
    name="limit",
    schema={"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
    description="A page size; without it every matching run is listed.",
)
_CURSOR = QueryParameter(
    name="cursor",
    schema={"type": "string", "format": "salvor-cursor"},
    description="The `next_cursor` of the previous page (opaque: anything else is a 400).",
)

RUNS_QUERY = Query(
    (
        QueryParameter(name="status", schema={"enum": [s.value for s in RunState]}),
        QueryParameter(
            name="label",
            schema={"type": "string", "pattern": "^[^:]+:"},
            description="`key:value`: only runs carrying that label.",
        ),
        QueryParameter(
            name="agent",
            schema={"type": "string", "pattern": HASH_PATTERN},
            description="An agent's hash: only the runs of that agent.",
        ),
        QueryParameter(
            name="graph",
            schema={"type": "string", "pattern": HASH_PATTERN},
            description="A graph's hash: only the runs of that graph (and their forks).",
        ),
        _LIMIT,
        _CURSOR,
    )
)
RECONCILIATIONS_QUERY = Query((_LIMIT, _CURSOR))


def page_of(args) -> dict:
    """A listing's ``limit`` and ``after`` (its cursor) from the query's ``limit`` and ``cursor``.

    The cursor is the store's to judge (a foreign one is its 400 ``bad_request``).

    Raises:
        OperationRefused: bad_request when ``limit`` is not a whole number from 1 to ``MAX_PAGE``.
    """
    limit = None
    if "limit" in args:
        limit = whole_number(args["limit"]) or 0
        if not 1 <= limit <= MAX_PAGE:
            raise bad_request(f"`limit` must be a whole number from 1 to {MAX_PAGE}")
    return {"limit": limit, "after": args.get("cursor")}
