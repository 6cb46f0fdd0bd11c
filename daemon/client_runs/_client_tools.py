"""Client-performed tool declarations: what an operator says about a tool a client runs itself.

A declaration (one TOML or JSON file per tool, loaded by ``salvor serve
--client-tool FILE``, never registered over HTTP) fixes the tool's effect,
the schema its input must meet, what a finished call looks like
(``output_schema``, ``require_equal``), whether the client's own report of a
result is believed (``trust_completion``), and what its idempotency key is
derived from. The daemon holds no code for such a tool.

Schemas are honoured in a subset of JSON Schema (type, required, properties,
items, enum, the numeric and length bounds); any other keyword is ignored, so
``pattern`` or ``format`` in a declaration is a comment, not a rule.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from salvor.protocol import (
    Effect,
    MalformedEvent,
    NextStep,
    SchemaViolation,
    StepKind,
    check_schema,
    sha256_hash,
    validate,
)

from ..web import bad_request
from ._answers import CLIENT_TOOL

_FIELDS = {
    "name",
    "effect",
    "input_schema",
    "output_schema",
    "trust_completion",
    "idempotency_key",
    "require_equal",
}
_HONOURED = {
    "type",
    "required",
    "properties",
    "items",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
}


class DeclarationError(ValueError):
    """A declaration file that does not validate; the message is one
    sentence naming the file and field."""


def honoured(schema: Any) -> Any:
    """The part of a schema this daemon checks: the honoured keywords, all the way down."""
    if not isinstance(schema, dict):
        return schema
    kept = {k: v for k, v in schema.items() if k in _HONOURED}
    if isinstance(kept.get("properties"), dict):
        kept["properties"] = {name: honoured(sub) for name, sub in kept["properties"].items()}
    if "items" in kept:
        kept["items"] = honoured(kept["items"])
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTool:
    name: str
    effect: Effect
    input_schema: dict
    output_schema: dict | None = None
    # Whether the client's own report of what the call returned is recorded;
    # when false, a person resolves every call (secure by default).
    trust_completion: bool = False
    idempotency_key: tuple[str, ...] = ()
    require_equal: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The declaration as ``GET /v1/client-tools`` lists it (absent
        fields omitted, never null)."""
        body: dict[str, Any] = {
            "name": self.name,
            "effect": self.effect.value,
            "input_schema": self.input_schema,
        }
        if self.output_schema is not None:
            body["output_schema"] = self.output_schema
        body["trust_completion"] = self.trust_completion
        if self.idempotency_key:
            body["idempotency_key"] = list(self.idempotency_key)
        if self.require_equal:
            body["require_equal"] = list(self.require_equal)
        return CLIENT_TOOL.check(body)

    def check_input(self, tool_input: Any) -> None:
        """Raises OperationRefused (bad_request) when the input fails the declared schema."""
        _check(honoured(self.input_schema), tool_input, f"the input of client tool {self.name}")

    def check_output(self, output: Any, recorded_input: Any) -> None:
        """A finished call's output against the declaration: its schema, then
        every ``require_equal`` field.

        Raises:
            OperationRefused: bad_request naming the tool and what is wrong.
        """
        if self.output_schema is not None:
            _check(honoured(self.output_schema), output, f"the output of client tool {self.name}")
        for name in self.require_equal:
            asked = recorded_input.get(name) if isinstance(recorded_input, dict) else None
            got = output.get(name, _MISSING) if isinstance(output, dict) else _MISSING
            if got is _MISSING or got != asked:
                shown = "missing" if got is _MISSING else json.dumps(got)
                raise bad_request(
                    f"client tool {self.name}: the output's `{name}` is {shown}, but the recorded "
                    f"intent asked for {json.dumps(asked)}; "
                    "require_equal holds them to the same value"
                )

    def key(self, run_id: str, seq: int, tool_input: Any) -> str:
        """The idempotency key the daemon derives (the client never chooses it).

        Raises:
            OperationRefused: bad_request when the input lacks a field the key is derived from.
        """
        if not self.idempotency_key:
            return sha256_hash({"run": run_id, "seq": seq, "tool": self.name})
        identity: dict[str, Any] = {"run": run_id, "tool": self.name}
        for name in self.idempotency_key:
            if not isinstance(tool_input, dict) or name not in tool_input:
                raise bad_request(
                    f"client tool {self.name} derives its idempotency key from "
                    f"`{name}`, which the input lacks"
                )
            identity[name] = tool_input[name]
        return sha256_hash(identity)

    @property
    def deduplicates(self) -> bool:
        """A declared key dedupes a write or an idempotent call; a read
        never (a poll must see change)."""
        return bool(self.idempotency_key) and self.effect is not Effect.READ


_MISSING: Any = object()


def _check(schema: dict, value: Any, what: str) -> None:
    try:
        validate(schema, value, what=what)
    except SchemaViolation as exc:
        raise bad_request(exc.message, details={"violations": exc.violations}) from None


def _names(raw: Any, field: str, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if (
        not isinstance(raw, list)
        or not all(isinstance(n, str) and n for n in raw)
        or len(set(raw)) != len(raw)
    ):
        raise DeclarationError(f"{where}: `{field}` must be a list of distinct input field names")
    return tuple(raw)


def check_resolution(
    tools: Mapping[str, ClientTool], run_id: str, tool: str, recorded_input: Any, output: Any
) -> None:
    """A hand-recorded output for a client's write must satisfy the tool's
    declaration (not its trust rule).

    The client's call was never witnessed by salvor: the declaration is the
    only thing that says what a finished one looks like.

    Raises:
        OperationRefused: bad_request when the tool is not declared here or the output fails it.
    """
    declared = tools.get(tool)
    if declared is None:
        raise bad_request(
            f"the dangling call of run {run_id} is client tool {tool!r}, and no declaration of "
            "it is loaded here, so the output cannot be checked",
            next_step=NextStep(kind=StepKind.DECLARE_CLIENT_TOOL, run=run_id, tool=tool),
        )
    declared.check_output(output, recorded_input)


def parse_declaration(text: str, fmt: str, *, where: str = "the declaration") -> ClientTool:
    """Validate one declaration strictly.

    Raises:
        DeclarationError: naming ``where`` and the field.
    """
    try:
        raw = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise DeclarationError(f"{where} is not valid {fmt.upper()}: {exc}") from None
    if not isinstance(raw, dict):
        raise DeclarationError(f"{where} must be a table of fields")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise DeclarationError(
            f"{where}: unknown field `{unknown[0]}`; a declaration "
            f"takes {', '.join(sorted(_FIELDS))}"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise DeclarationError(f"{where}: `name` must be a tool name of 1 to 64 characters")
    try:
        effect = Effect(raw.get("effect"))
    except ValueError:
        raise DeclarationError(
            f"{where}: `effect` must be one of read, idempotent, write"
        ) from None
    schemas = {}
    for field in ("input_schema", "output_schema"):
        schema = raw.get(field)
        if schema is None:
            if field == "input_schema":
                raise DeclarationError(
                    f"{where}: `input_schema` is required (the tool's parameter schema)"
                )
            continue
        try:
            check_schema(schema)
            check_schema(honoured(schema))
        except MalformedEvent as exc:
            raise DeclarationError(
                f"{where}: `{field}` is not a usable JSON schema: {exc.message}"
            ) from None
        schemas[field] = schema
    trust = raw.get("trust_completion", False)
    if not isinstance(trust, bool):
        raise DeclarationError(f"{where}: `trust_completion` must be true or false")
    return ClientTool(
        name=name,
        effect=effect,
        input_schema=schemas["input_schema"],
        output_schema=schemas.get("output_schema"),
        trust_completion=trust,
        idempotency_key=_names(raw.get("idempotency_key"), "idempotency_key", where),
        require_equal=_names(raw.get("require_equal"), "require_equal", where),
    )


def load_declarations(paths: Iterable[str]) -> dict[str, ClientTool]:
    """Every declaration file, by tool name.

    Raises:
        DeclarationError: a file is unreadable or invalid, or two declare one name.
    """
    tools: dict[str, ClientTool] = {}
    for path in paths:
        file = Path(path)
        fmt = "json" if file.suffix.lower() == ".json" else "toml"
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeclarationError(
                f"--client-tool {path}: cannot read it ({exc.strerror or exc})"
            ) from None
        tool = parse_declaration(text, fmt, where=f"--client-tool {path}")
        if tool.name in tools:
            raise DeclarationError(f"--client-tool {path}: tool {tool.name!r} is declared twice")
        tools[tool.name] = tool
    return tools
