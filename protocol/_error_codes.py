"""The control plane's error codes and the HTTP status each one answers with, defined once.

Every refusal names an ``ErrorCode`` member; its status comes from this
table, never from the call site, so one code cannot answer with two
statuses. The control-plane spec's "Error envelope" table names most of
them (``tests/protocol/test_error_codes.py`` holds the two tables equal);
the rest are salvor's own (the HTTP layer's refusals, the store's, the
daemon's lifetime) and are marked below.

The codes live in the pure core because its errors (and the store's) carry
them too; ``salvor.daemon.web`` re-exports the table for the HTTP layer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Self


class ErrorCode(enum.StrEnum):
    """A stable machine token of the error envelope.

    ``status`` is the HTTP status it answers with.
    """

    status: int

    def __new__(cls, code: str, status: int) -> Self:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        return member

    # The spec's table.
    BAD_REQUEST = "bad_request", 400
    UNAUTHORIZED = "unauthorized", 401
    UNKNOWN_RUN = "unknown_run", 404
    UNKNOWN_AGENT = "unknown_agent", 404
    INVALID_GRAPH = "invalid_graph", 400
    APPROVAL_SCHEMA_VIOLATION = "approval_schema_violation", 400
    UNKNOWN_GRAPH = "unknown_graph", 404
    NOT_A_GRAPH_RUN = "not_a_graph_run", 409
    INVALID_FORK_NODE = "invalid_fork_node", 409
    ORIGIN_NEEDS_RECONCILIATION = "origin_needs_reconciliation", 409
    WRITE_REPLAY_HAZARD = "write_replay_hazard", 409
    RUN_EXISTS = "run_exists", 409
    WRONG_STATE = "wrong_state", 409
    CLIENT_DRIVEN_RUN = "client_driven_run", 409
    NEEDS_RECONCILIATION = "needs_reconciliation", 409
    STILL_SLEEPING = "still_sleeping", 409
    MISSING_DRIVE_TOKEN = "missing_drive_token", 401
    INVALID_DRIVE_TOKEN = "invalid_drive_token", 403
    LEASE_HELD = "lease_held", 409
    DIVERGENCE = "divergence", 409
    UNSUPPORTED_EVENT_KIND = "unsupported_event_kind", 422
    PAYLOAD_TOO_LARGE = "payload_too_large", 413
    MODEL_EXECUTOR_UNAVAILABLE = "model_executor_unavailable", 503
    MODEL_EXECUTION = "model_execution", 502
    UNKNOWN_TOOL = "unknown_tool", 404
    TOOL_REGISTRY_UNAVAILABLE = "tool_registry_unavailable", 503
    TOOL_EXECUTION = "tool_execution", 502
    INTERNAL = "internal", 500

    # Ours: refusals the HTTP layer gives before any route runs.
    NOT_FOUND = "not_found", 404
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    REQUEST_TIMEOUT = "request_timeout", 408
    HEADERS_TOO_LARGE = "headers_too_large", 431
    # A client over a per-client cap (its open streams, its wrong tokens lately); the answer says
    # when to try again.
    TOO_MANY_REQUESTS = "too_many_requests", 429
    NOT_IMPLEMENTED = "not_implemented", 501
    HTTP_VERSION_NOT_SUPPORTED = "http_version_not_supported", 505
    # A flow sent with a call whose bytes fail a check (a member's or the flow file's), or that
    # names an upload this daemon does not hold: the call is refused whole.
    INVALID_FLOW_FILES = "invalid_flow_files", 422
    # A body read as JSON that does not say so (a browser's form or text/plain, or no type).
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", 415

    # Ours: runs, client-performed calls, the store and the daemon's lifetime.
    PORT_HELD = "port_held", 409
    CLIENT_COMPLETION_REFUSED = "client_completion_refused", 403
    CLAIM_HELD = "claim_held", 409
    STORE_OWNED = "store_owned", 409
    STORE_UNAVAILABLE = "store_unavailable", 503
    STORE_TOO_NEW = "store_too_new", 503
    LISTEN_FAILED = "listen_failed", 503
    # Quotas (issue 29): a run's log is full (its event count or its bytes), or the store's
    # filesystem is below the free-space floor new work needs.
    QUOTA_EXCEEDED = "quota_exceeded", 413
    INSUFFICIENT_STORAGE = "insufficient_storage", 507
    # A flow asked for by its ``namespace/name`` that no flow of this store is kept as.
    UNKNOWN_FLOW = "unknown_flow", 404
    # An MCP server to attach to a run by a name the operator's --attachable-mcp file does not
    # declare.
    UNKNOWN_MCP_SERVER = "unknown_mcp_server", 404

    # Ours: a request whose Host does not name the daemon or whose Origin is another page's, and
    # the page's session (a cookie-authenticated change without its CSRF token).
    FORBIDDEN = "forbidden", 403


# code -> status as a read-only mapping, for readers that want the whole table (the OpenAPI
# document).
ERROR_STATUS: Mapping[ErrorCode, int] = MappingProxyType({code: code.status for code in ErrorCode})
