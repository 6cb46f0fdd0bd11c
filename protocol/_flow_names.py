"""A flow's name, ``namespace/name``: what ``flow_write``, ``POST /v1/graphs?name=``,
``POST /v1/graph-runs``'s ``flow_name`` and ``salvor graph run`` keep and find a flow by.

Each part is 1 to 64 letters, digits, ``_``, ``-`` or ``.``, starting with a letter or digit: a
name fits a URL path segment and a label value as it is, and can never be ``.`` or ``..``.
"""

from __future__ import annotations

import re

from ._errors import excerpt

FLOW_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The namespace a flow_write without one writes into.
DEFAULT_NAMESPACE = "custom"


class BadFlowName(ValueError):
    """A flow name that is not ``namespace/name`` of two good parts; the message says why."""


def check_flow_part(field: str, value: str) -> str:
    """``value`` when it is a good ``field`` (``namespace`` or ``name``) of a flow name.

    Raises:
        BadFlowName: it is not.
    """
    if not isinstance(value, str) or not FLOW_NAME_PART.fullmatch(value):
        shown = excerpt(value, 80) if isinstance(value, str) else type(value).__name__
        raise BadFlowName(
            f"`{field}` must be 1 to 64 letters, digits, `_`, `-` or `.` (starting with a "
            f"letter or digit), not {shown!r}"
        )
    return value


def split_flow_name(text: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``namespace/name``.

    Raises:
        BadFlowName: ``text`` is not two good parts joined by one ``/``.
    """
    if not isinstance(text, str) or text.count("/") != 1:
        shown = excerpt(text, 80) if isinstance(text, str) else type(text).__name__
        raise BadFlowName(f"a flow's name is `namespace/name`, not {shown!r}")
    namespace, name = text.split("/")
    return check_flow_part("namespace", namespace), check_flow_part("name", name)
