"""The API reference as the repository keeps it, ``docs/openapi.json``: the document a daemon
started as the README starts it (``salvor serve --demo-tools``, no model endpoint declared, no
process agents) serves at ``GET /v1/openapi.json``, as text with every byte decided (keys sorted,
two-space indent, a final newline), so a change to a route shows as a diff of that file.

Regenerate it after changing a route's declaration::

    .venv/bin/python -m salvor.daemon.api._reference > docs/openapi.json

tests/daemon/api/test_openapi_reference.py holds the file to what a real daemon serves.
"""

from __future__ import annotations

import json
import sys

from ..agents import Credentials
from ..skills import SkillLibrary
from ..tools import demo_registry
from ._app import API_OPERATIONS
from ._openapi import openapi_document
from ._schema import JSON

REGENERATE = ".venv/bin/python -m salvor.daemon.api._reference > docs/openapi.json"


def reference_document() -> JSON:
    """The document a README daemon serves: the demo tools, built-in agents only over HTTP, and
    only the demo model among the ``[llm]`` choices (its environment declares no endpoint)."""
    declared = Credentials.for_daemon(environ={})
    return openapi_document(
        API_OPERATIONS,
        tools=demo_registry().names(),
        skills=SkillLibrary().names(),
        process_agents=False,
        llm_choices=declared.llm_choices(),
        mcp_origins=declared.origins("mcp"),
        service_origins=declared.origins("service"),
    )


def reference_text(document: JSON) -> str:
    """``document`` as ``docs/openapi.json`` holds it."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_text(reference_document()))
