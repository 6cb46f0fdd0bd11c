"""A run's labels: the one check of their shape and bounds, for every surface that accepts them.

Labels are correlation tags on ``RunStarted``: an object of string values,
at most ``MAX_LABELS`` of them, each key 1 to ``MAX_LABEL_KEY_BYTES`` bytes
of UTF-8 and each value at most ``MAX_LABEL_VALUE_BYTES``. The event checks
the shape when it is built; the guard, the API, the CLI and client-driven
appends check the bounds here too, with the same sentences.
"""

from __future__ import annotations

from typing import Any

from ._errors import SchemaViolation, excerpt

MAX_LABELS = 16
MAX_LABEL_KEY_BYTES = 64
MAX_LABEL_VALUE_BYTES = 256

NOT_A_LABEL_MAP = "`labels` must be an object of string values"


def is_label_map(value: Any) -> bool:
    """Whether ``value`` has the shape of labels (bounds aside): an object of string values."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def check_labels(labels: Any) -> None:
    """Enforce the labels' shape and bounds.

    An object of strings, at most 16, keys ≤ 64 bytes, values ≤ 256 bytes.

    None (no labels) passes.

    Raises:
        SchemaViolation: the shape is wrong or a bound is crossed (maps to ``400 bad_request``).
    """
    if labels is None:
        return
    if not is_label_map(labels):
        raise SchemaViolation(NOT_A_LABEL_MAP)
    if len(labels) > MAX_LABELS:
        raise SchemaViolation(f"at most {MAX_LABELS} labels are allowed, got {len(labels)}")
    for key, value in labels.items():
        if not key or len(key.encode()) > MAX_LABEL_KEY_BYTES:
            raise SchemaViolation(
                f"label key {excerpt(key)!r} must be 1 to {MAX_LABEL_KEY_BYTES} bytes"
            )
        if len(value.encode()) > MAX_LABEL_VALUE_BYTES:
            raise SchemaViolation(f"label {key!r} has a value over {MAX_LABEL_VALUE_BYTES} bytes")
