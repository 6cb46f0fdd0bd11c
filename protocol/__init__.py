"""salvor's pure core: events, their wire codec, canonical hashing, the fold,
the append guard, the record-and-replay rules (a cursor over a whole log, a
lane per boundary), schema checks, the strict JSON parser every caller's
text goes through, the error-code table and the server-sent-event framing.

This package imports nothing outside the standard library and fastjsonschema,
and does no IO.
"""

from ._canonical import canonical_json as canonical_json
from ._canonical import sha256_hash as sha256_hash
from ._clock import format_instant as format_instant
from ._clock import parse_instant as parse_instant
from ._envelope import SCHEMA_VERSION as SCHEMA_VERSION
from ._envelope import Envelope as Envelope
from ._envelope import decode_envelope as decode_envelope
from ._envelope import decode_event as decode_event
from ._envelope import encode_envelope as encode_envelope
from ._envelope import encode_payload as encode_payload
from ._error_codes import ERROR_STATUS as ERROR_STATUS
from ._error_codes import ErrorCode as ErrorCode
from ._errors import CodedError as CodedError
from ._errors import GuardRefusal as GuardRefusal
from ._errors import MalformedEvent as MalformedEvent
from ._errors import ProtocolError as ProtocolError
from ._errors import ReplayDivergence as ReplayDivergence
from ._errors import SchemaViolation as SchemaViolation
from ._errors import abstract_error as abstract_error
from ._errors import excerpt as excerpt
from ._events import BUDGET_KINDS as BUDGET_KINDS
from ._events import EVENT_TYPES as EVENT_TYPES
from ._events import TOOL_ERROR_KEY as TOOL_ERROR_KEY
from ._events import TOOL_SLEEP_KEY as TOOL_SLEEP_KEY
from ._events import TOOL_SUSPEND_KEY as TOOL_SUSPEND_KEY
from ._events import Actor as Actor
from ._events import BudgetExceeded as BudgetExceeded
from ._events import Effect as Effect
from ._events import Event as Event
from ._events import EventKind as EventKind
from ._events import ModelCallCompleted as ModelCallCompleted
from ._events import ModelCallRequested as ModelCallRequested
from ._events import NowObserved as NowObserved
from ._events import RandomObserved as RandomObserved
from ._events import Resumed as Resumed
from ._events import RunAbandoned as RunAbandoned
from ._events import RunCompleted as RunCompleted
from ._events import RunFailed as RunFailed
from ._events import RunStarted as RunStarted
from ._events import SleepCompleted as SleepCompleted
from ._events import SleepStarted as SleepStarted
from ._events import Suspended as Suspended
from ._events import ToolCallCompleted as ToolCallCompleted
from ._events import ToolCallRequested as ToolCallRequested
from ._fold import EMPTY_VIEW as EMPTY_VIEW
from ._fold import IDLE_STATES as IDLE_STATES
from ._fold import RESTING_STATES as RESTING_STATES
from ._fold import TERMINAL_STATES as TERMINAL_STATES
from ._fold import Pending as Pending
from ._fold import PendingKind as PendingKind
from ._fold import RunState as RunState
from ._fold import RunView as RunView
from ._fold import fold as fold
from ._fold import status_seen_at as status_seen_at
from ._fold import step as step
from ._guard import LEGAL_NEXT as LEGAL_NEXT
from ._guard import check_batch as check_batch
from ._guard import check_next as check_next
from ._guard import check_resume_input as check_resume_input
from ._labels import check_labels as check_labels
from ._replay import CallNames as CallNames
from ._replay import Decision as Decision
from ._replay import Divergence as Divergence
from ._replay import DivergenceReason as DivergenceReason
from ._replay import Mismatch as Mismatch
from ._replay import RecordedCall as RecordedCall
from ._replay import ReplayCursor as ReplayCursor
from ._replay import ReplayLane as ReplayLane
from ._replay import Shortfall as Shortfall
from ._replay import Step as Step
from ._replay import diverge as diverge
from ._replay import model_mismatch as model_mismatch
from ._replay import resume_step as resume_step
from ._replay import tool_mismatch as tool_mismatch
from ._schema import BUDGET_EXTENSION_SCHEMA as BUDGET_EXTENSION_SCHEMA
from ._schema import check_schema as check_schema
from ._schema import validate as validate
from ._schema import validate_budget_extension as validate_budget_extension
from ._sse import ServerSentEvent as ServerSentEvent
from ._sse import SSEDecoder as SSEDecoder
from ._sse import sse_frame as sse_frame
from ._strict_json import MAX_EXACT_INTEGER as MAX_EXACT_INTEGER
from ._strict_json import MAX_NESTING as MAX_NESTING
from ._strict_json import MalformedJson as MalformedJson
from ._strict_json import check_document as check_document
from ._strict_json import check_nesting as check_nesting
from ._strict_json import decode_text as decode_text
from ._strict_json import parse_strict as parse_strict
from ._strict_json import value_depth as value_depth
