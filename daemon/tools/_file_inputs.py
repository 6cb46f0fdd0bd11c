"""A tool's declared file inputs: the arguments whose whole value is the path of a file it reads.

In a flow, such an argument written as a literal absolute path is a file of the client's, which the
daemon hands the tool as a temporary copy (``graphs._tool_files``); ``GET /v1/tools`` lists them.
"""

from __future__ import annotations

import re
from typing import Any

# A file input names one top-level argument: the path is that argument's value alone (never a
# path built from two arguments, a dotted path into one, or a directory).
_ARGUMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def check_file_inputs(where: str, value: Any, input_schema: Any = None) -> tuple[str, ...]:
    """Validate declared file inputs: distinct top-level argument names, each one the input
    schema (when it lists ``properties``) declares as a string.

    Raises:
        ValueError: one sentence naming ``where`` and the bad entry.
    """
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{where} must be a non-empty array of argument names")
    properties = input_schema.get("properties") if isinstance(input_schema, dict) else None
    for name in value:
        if not isinstance(name, str) or not _ARGUMENT.match(name):
            raise ValueError(
                f"{where} holds {name!r}, which is not one argument's name: a file input is an "
                "argument whose whole value is the file's path"
            )
        if isinstance(properties, dict):
            declared = properties.get(name)
            if not isinstance(declared, dict) or declared.get("type") != "string":
                raise ValueError(
                    f"{where} names {name!r}, which the tool's input schema does not declare as "
                    "a string property"
                )
    if len(set(value)) != len(value):
        raise ValueError(f"{where} names one argument twice")
    return tuple(value)
