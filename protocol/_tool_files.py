"""Tool files: the file arguments of a flow's tool nodes, which the client sends with the flow.

A tool may declare file inputs: arguments whose value is a path the tool reads. In a flow, such an
argument is a *file argument* when the node's input writes it as a literal absolute path ending in
``.json``, ``.yaml``, ``.png`` or ``.txt`` (any case). The client sends the file at that path as a
member of role ``tool`` keyed by the path as written; the daemon hands the tool the bytes in a
temporary file of its own and records the call with the client's path.

Anything else given to a declared file input (a ``$`` reference, a relative path, another suffix,
an input that is a reference as a whole) is not a file argument: over a link the pre-check refuses
it, since the daemon would read its own disk instead of the client's.
Pure: nothing here opens a path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._graph import GraphNode

# The suffixes a tool file may have, as the client and the daemon compare them (lower case).
TOOL_FILE_SUFFIXES = (".json", ".png", ".txt", ".yaml")

# Tool name -> its declared file inputs (argument names), as a registry lists them.
FileInputs = Mapping[str, Sequence[str]]


def is_file_argument(value: Any) -> bool:
    """True for a value a declared file input takes from the client: a literal absolute path
    with one of ``TOOL_FILE_SUFFIXES`` (a ``$`` reference is never one: it is not absolute)."""
    return (
        isinstance(value, str)
        and value.startswith("/")
        and value.lower().endswith(TOOL_FILE_SUFFIXES)
    )


def declared_arguments(call: GraphNode, file_inputs: FileInputs) -> list[tuple[str, Any]]:
    """Each declared file input ``call`` (a tool node, or a map's tool body) gives, with its
    value as the node's input writes it: the literal for an input object that names it, the
    whole template when the input is not an object (a reference: any argument may come from it).
    An input object that leaves an argument out gives it nothing, and so is not listed."""
    if call.tool is None:
        return []
    names = file_inputs.get(call.tool, ())
    if isinstance(call.input, dict):
        return [(name, call.input[name]) for name in names if name in call.input]
    return [(name, call.input) for name in names]
