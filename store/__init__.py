"""salvor's store: run logs, their materialised folds, agents, graphs, idempotency
claims and the operator's notification outbox in SQLite (the default) or
PostgreSQL, through synchronous SQLAlchemy Core. The only code in salvor that
talks to a database; the daemon calls it from threads.
"""

from ._change_signal import ChangeNotice as ChangeNotice
from ._client_leases import ClientLease as ClientLease
from ._client_leases import ClientLeases as ClientLeases
from ._errors import BadCursor as BadCursor
from ._errors import ClaimHeld as ClaimHeld
from ._errors import CorruptLog as CorruptLog
from ._errors import Fenced as Fenced
from ._errors import PayloadTooLarge as PayloadTooLarge
from ._errors import QuotaExceeded as QuotaExceeded
from ._errors import SeqConflict as SeqConflict
from ._errors import StoreError as StoreError
from ._errors import StoreOwned as StoreOwned
from ._errors import StoreTooNew as StoreTooNew
from ._errors import StoreUnavailable as StoreUnavailable
from ._errors import store_fault as store_fault
from ._event_store import EventStore as EventStore
from ._location import default_store_url as default_store_url
from ._location import normalize_store_url as normalize_store_url
from ._location import sqlite_path as sqlite_path
from ._log_writer import AppendRequest as AppendRequest
from ._named_flows import FlowVersion as FlowVersion
from ._named_flows import NamedFlow as NamedFlow
from ._named_flows import Naming as Naming
from ._notifications import Notice as Notice
from ._notifications import NotificationKind as NotificationKind
from ._notifications import notice_of as notice_of
from ._outbox import Outbox as Outbox
from ._ownership import Holder as Holder
from ._ownership import RunHint as RunHint
from ._ownership import StoreLocks as StoreLocks
from ._ownership import open_locks as open_locks
from ._quota import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from ._quota import DEFAULT_MAX_RUN_BYTES as DEFAULT_MAX_RUN_BYTES
from ._quota import DEFAULT_MAX_RUN_EVENTS as DEFAULT_MAX_RUN_EVENTS
from ._quota import ENDING_MARGIN_BYTES as ENDING_MARGIN_BYTES
from ._quota import RunQuota as RunQuota
from ._records import GRAPH_SUMMARY_KEYS as GRAPH_SUMMARY_KEYS
from ._records import SUMMARY_KEYS as SUMMARY_KEYS
from ._records import SUMMARY_REQUIRED as SUMMARY_REQUIRED
from ._records import Claim as Claim
from ._records import GraphSummary as GraphSummary
from ._records import Notification as Notification
from ._records import ParkedWrite as ParkedWrite
from ._records import ProbeAnswer as ProbeAnswer
from ._records import RunSummary as RunSummary
from ._records import StoredAgent as StoredAgent
from ._records import StoredGraph as StoredGraph
from ._run_owners import Claimed as Claimed
from ._run_owners import Fence as Fence
from ._run_owners import NodeRecord as NodeRecord
from ._run_owners import OwnerRelease as OwnerRelease
from ._run_owners import RunOwner as RunOwner
from ._run_owners import RunOwners as RunOwners
from ._schema import STORE_VERSION as STORE_VERSION
from ._sessions import LoginSessions as LoginSessions
from ._view_codec import view_from_json as view_from_json
from ._view_codec import view_to_json as view_to_json
