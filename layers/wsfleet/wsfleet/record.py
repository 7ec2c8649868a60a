"""The items wsfleet keeps in the connections table.

* A **connection item** (``pk = "CONN#<connection_id>"``) is the desired state of one
  upstream stream and its ownership: which worker holds it (``lease_owner``, absent while
  free), under which epoch (the fence on every write to it), and how far the durable
  checkpoint (``last_seq``) has got. It carries no expiry: it is alive while its owner's
  worker lease is (lease model v2, see :mod:`wsfleet.lease`), so holding it costs no writes.
* A **worker item** (``pk = "WORKER#<worker_id>"``) is that worker's one liveness lease
  (``expires_at_ms``, renewed every heartbeat; ``dead_at_ms`` once it is over, for good) and
  the control queue STOP notifications for its connections are sent to.

Index keys are derived here (:func:`index_keys`), so every write that changes desired state or
ownership sets exactly the keys its result needs. The four indexes and why none is hot:

=============  ========================  ===================================================
Index          Partition key             Written when
=============  ========================  ===================================================
gsi_owner      ``lease_owner``           acquire, release, STOP (one key per worker)
gsi_unowned    ``unowned_shard`` (16)    a STARTED connection becomes free or is taken
gsi_state      ``state_shard`` (3 x 16)  START, STOP, FAILED
gsi_workers    ``worker_index``          a worker registers or its item is deleted
=============  ========================  ===================================================

None takes a write per heartbeat or per checkpoint: those change only attributes that are
neither keys nor projected into any index.

Records are immutable values; converting to and from plain DynamoDB items (already
deserialized to Python types) is all this module does.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from .upstream_options import DEFAULT_OPTIONS, UpstreamOptions

__all__ = [
    "CONNECTION_ID_PATTERN",
    "CONNECTION_PREFIX",
    "INDEX_SHARDS",
    "WINDOW_FIELDS",
    "WORKER_INDEX_VALUE",
    "WORKER_PREFIX",
    "ConnectionRecord",
    "DesiredState",
    "WorkerRecord",
    "connection_id_from_pk",
    "connection_pk",
    "incarnation_id",
    "index_keys",
    "index_shard",
    "is_startable_connection_id",
    "is_valid_connection_id",
    "worker_base_id",
    "worker_pk",
]

CONNECTION_PREFIX = "CONN#"
WORKER_PREFIX = "WORKER#"
CONNECTION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Write sharding of the low-cardinality indexes (gsi_unowned, gsi_state): a key value takes
#: at most 1/16 of the transitions, so a START storm or a fleet-wide redeploy stays far below
#: DynamoDB's 1,000 WCU/s per partition (bench/SCALE.md).
INDEX_SHARDS = 16
#: The one ``worker_index`` value: gsi_workers lists worker items (written at register only).
WORKER_INDEX_VALUE = "WORKER"


class DesiredState(StrEnum):
    """What the API asked for. The lease says what is actually happening."""

    STARTED = "STARTED"
    STOPPED = "STOPPED"
    #: Terminal until a new START: the crash-loop breaker tripped (see
    #: :func:`wsfleet.lease.breaker_verdict`); ``stop_reason`` and ``last_error`` say why.
    FAILED = "FAILED"


def is_valid_connection_id(connection_id: str) -> bool:
    """Connection ids are 1-128 characters of ``[A-Za-z0-9._:-]``."""
    return bool(CONNECTION_ID_PATTERN.fullmatch(connection_id))


def is_startable_connection_id(connection_id: str) -> bool:
    """What START accepts: a valid id that is not only dots.

    ``.`` and ``..`` are dot segments that HTTP clients (curl, browsers, most libraries)
    remove from a path, so ``/connections/..`` would never reach its connection; ``...`` is
    refused with them, one rule for a client to remember. Such ids stay *valid* keys, so a
    connection started before the rule can still be read and stopped (``POST /events`` STOP
    carries the id in the body, out of any client's reach).

    >>> [is_startable_connection_id(i) for i in ("a.b", ".a", "..", "...")]
    [True, True, False, False]
    """
    return is_valid_connection_id(connection_id) and connection_id.strip(".") != ""


def connection_pk(connection_id: str) -> str:
    """``"abc"`` -> ``"CONN#abc"``."""
    return f"{CONNECTION_PREFIX}{connection_id}"


def connection_id_from_pk(pk: str) -> str:
    """``"CONN#abc"`` -> ``"abc"``; raises ValueError for any other key."""
    if not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"not a connection key: {pk!r}")
    return pk[len(CONNECTION_PREFIX):]


#: Separates a worker's base id from its incarnation ("w0+2"): a worker whose lease is over
#: starts again in the same process under a new id, since the old id is dead for good.
INCARNATION_SEPARATOR = "+"


def incarnation_id(base_id: str, incarnation: int) -> str:
    """The worker id of incarnation ``incarnation`` (1 is the base id itself).

    >>> incarnation_id("w0", 1), incarnation_id("w0", 3)
    ('w0', 'w0+3')
    """
    return base_id if incarnation <= 1 else f"{base_id}{INCARNATION_SEPARATOR}{incarnation}"


def worker_base_id(worker_id: str) -> str:
    """The process's base id of any of its incarnations: ``"w0+3"`` -> ``"w0"``."""
    return worker_id.partition(INCARNATION_SEPARATOR)[0]


def worker_pk(worker_id: str) -> str:
    """``"w1"`` -> ``"WORKER#w1"``."""
    return f"{WORKER_PREFIX}{worker_id}"


def index_shard(pk: str) -> int:
    """A connection's stable shard, 0..INDEX_SHARDS-1 (crc32 of its key: same everywhere).

    >>> index_shard("CONN#abc")
    3
    """
    return zlib.crc32(pk.encode()) % INDEX_SHARDS


def index_keys(
    pk: str, state: DesiredState, *, owned: bool, since_ms: int
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The index attributes a connection in ``state`` (owned or free) must carry: the ones
    to SET and the ones to REMOVE.

    A STARTED connection without an owner is in gsi_unowned (since ``since_ms``), so the
    reconciler finds it if the hint that should have found it was lost.

    >>> index_keys("CONN#abc", DesiredState.STARTED, owned=False, since_ms=5)
    ({'state_shard': 'STARTED#03', 'unowned_shard': '03', 'unowned_since_ms': 5}, ())
    >>> index_keys("CONN#abc", DesiredState.STOPPED, owned=True, since_ms=5)
    ({'state_shard': 'STOPPED#03'}, ('unowned_shard', 'unowned_since_ms'))
    """
    shard = index_shard(pk)
    keys: dict[str, Any] = {"state_shard": f"{state.value}#{shard:02d}"}
    if state is DesiredState.STARTED and not owned:
        keys.update(unowned_shard=f"{shard:02d}", unowned_since_ms=since_ms)
        return keys, ()
    return keys, ("unowned_shard", "unowned_since_ms")


def _int(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = item.get(name)
    return default if value is None else int(value)


def _opt_int(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value)


def _opt_str(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value)


#: The connection attributes of an at-least-once sink's replay window (``sent_limit`` and the
#: ``replayed_*`` totals), written only with writes the holder makes anyway.
WINDOW_FIELDS = (
    "sent_limit", "replayed_takeovers", "replayed_frames", "replayed_from_seq", "replayed_to_seq"
)


@dataclass(frozen=True, kw_only=True)
class ConnectionRecord:
    """One connection item. ``lease_owner == ""`` (absent in DynamoDB) means free."""

    pk: str
    desired_state: DesiredState
    ws_url: str
    last_seq: int = 0
    lease_owner: str = ""
    lease_epoch: int = 0
    created_at_ms: int = 0
    updated_at_ms: int = 0
    stop_reason: str | None = None
    last_error: str | None = None
    resume: bool = True
    #: Crash-loop breaker: failures counted so far, all at checkpoint ``failure_seq``. Kept on
    #: the item (not in a worker) so the count survives hand-overs between workers.
    failure_count: int = 0
    failure_seq: int | None = None
    #: When the first failure of the current count happened (worker clock, ms): the breaker
    #: also counts failures at other positions within its window of this.
    failure_since_ms: int | None = None
    #: Free and STARTED since then (the gsi_unowned sort key); None while owned or not STARTED.
    unowned_since_ms: int | None = None
    #: How to talk to the upstream beyond its URL (headers, credential reference, subscribe
    #: message, resume mapping); the default is the plain ``ws_url`` dialogue.
    upstream: UpstreamOptions = DEFAULT_OPTIONS
    #: Resumes after which the upstream's first frame skipped past the checkpoint, and the
    #: frames skipped in all (:func:`wsfleet.upstream_options.resume_gap`).
    resume_gaps: int = 0
    gap_frames: int = 0
    #: When a rebalancing hand-off last moved it (the release sets it): not moved again
    #: within REBALANCE_DWELL_SECONDS of that, whoever owns it now.
    rebalanced_at_ms: int | None = None
    #: At-least-once sinks (kinesis, firehose; :mod:`wsfleet_worker.checkpoint`): no holder
    #: has sent a frame above this seq, so a takeover re-sends at most ``(last_seq,
    #: sent_limit]``. None: nothing above ``last_seq`` was sent (or the sink is idempotent).
    sent_limit: int | None = None
    #: Takeovers that inherited such a window, the frames their new holders re-sent inside
    #: those windows (an upper bound of the duplicates consumers see), and the last window.
    replayed_takeovers: int = 0
    replayed_frames: int = 0
    replayed_from_seq: int | None = None
    replayed_to_seq: int | None = None

    @property
    def connection_id(self) -> str:
        return connection_id_from_pk(self.pk)

    @classmethod
    def new(cls, connection_id: str, ws_url: str, now_ms: int) -> ConnectionRecord:
        """A freshly STARTED connection with no owner and nothing received yet."""
        return cls(
            pk=connection_pk(connection_id),
            desired_state=DesiredState.STARTED,
            ws_url=ws_url,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
            unowned_since_ms=now_ms,
        )

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ConnectionRecord:
        """Build from a deserialized DynamoDB item (numbers may be ``Decimal``)."""
        return cls(
            pk=str(item["pk"]),
            desired_state=DesiredState(item.get("desired_state", DesiredState.STOPPED)),
            ws_url=str(item.get("ws_url", "")),
            last_seq=_int(item, "last_seq"),
            lease_owner=str(item.get("lease_owner", "")),
            lease_epoch=_int(item, "lease_epoch"),
            created_at_ms=_int(item, "created_at_ms"),
            updated_at_ms=_int(item, "updated_at_ms"),
            stop_reason=_opt_str(item, "stop_reason"),
            last_error=_opt_str(item, "last_error"),
            resume=bool(item.get("resume", True)),
            failure_count=_int(item, "failure_count"),
            failure_seq=_opt_int(item, "failure_seq"),
            failure_since_ms=_opt_int(item, "failure_since_ms"),
            unowned_since_ms=_opt_int(item, "unowned_since_ms"),
            upstream=UpstreamOptions.from_item(item.get("upstream")),
            resume_gaps=_int(item, "resume_gaps"),
            gap_frames=_int(item, "gap_frames"),
            rebalanced_at_ms=_opt_int(item, "rebalanced_at_ms"),
            sent_limit=_opt_int(item, "sent_limit"),
            replayed_takeovers=_int(item, "replayed_takeovers"),
            replayed_frames=_int(item, "replayed_frames"),
            replayed_from_seq=_opt_int(item, "replayed_from_seq"),
            replayed_to_seq=_opt_int(item, "replayed_to_seq"),
        )

    def to_item(self) -> dict[str, Any]:
        """A plain item for PutItem, index keys included; ``None`` fields and an empty owner
        are left out (an index key may not be empty, and a free item must not be in gsi_owner).
        The index keys decide: an owned or not STARTED record gets no ``unowned_since_ms``
        (a sort key without its partition key would be half an index entry).
        """
        item = asdict(self)
        item["desired_state"] = str(self.desired_state)
        item["upstream"] = None if self.upstream.is_default else self.upstream.to_item()
        for counter in ("resume_gaps", "gap_frames", "replayed_takeovers", "replayed_frames"):
            if not item[counter]:
                item[counter] = None  # absent until a gap is seen: items stay as they were
        keys, removed = index_keys(
            self.pk,
            self.desired_state,
            owned=bool(self.lease_owner),
            since_ms=self.unowned_since_ms or self.updated_at_ms,
        )
        item.update(keys)
        return {
            k: v
            for k, v in item.items()
            if k not in removed and ((v is not None and v != "") or k == "ws_url")
        }

    def with_changes(self, **changes: Any) -> ConnectionRecord:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class WorkerRecord:
    """A worker's liveness lease and where to reach it.

    ``expires_at_ms`` is renewed with its heartbeat; every connection it owns is alive until
    then. ``dead_at_ms`` is set once, by a peer that found the lease expired (the kill write)
    or by the worker itself when it retires; no heartbeat is accepted after it, so the
    incarnation can never come back (see :mod:`wsfleet.lease`).
    """

    worker_id: str
    control_queue_url: str
    started_at_ms: int
    heartbeat_at_ms: int
    expires_at_ms: int
    connection_count: int = 0
    capacity: int = 0
    dead_at_ms: int | None = None
    #: Of ``connection_count``, those rebalancing may move now (not moved within the dwell
    #: time), as the last heartbeat reported; None before one did, or without rebalancing.
    movable_count: int | None = None
    #: The reconciler's hint claim: the expiry it last hinted this worker's connections for.
    hinted_expiry_ms: int | None = None
    hinted_at_ms: int | None = None
    #: The ECS task this incarnation runs in and its container's runtime id (the metadata
    #: endpoint's ``DockerId``, an event's ``containers[].runtimeId``), set at register when
    #: known: the task exit event kills exactly the incarnations of that container
    #: (:mod:`wsfleet.task_exit`). None outside ECS.
    task_arn: str | None = None
    container_runtime_id: str | None = None

    @property
    def pk(self) -> str:
        return worker_pk(self.worker_id)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> WorkerRecord:
        return cls(
            worker_id=str(item["worker_id"]),
            control_queue_url=str(item.get("control_queue_url", "")),
            started_at_ms=_int(item, "started_at_ms"),
            heartbeat_at_ms=_int(item, "heartbeat_at_ms"),
            expires_at_ms=_int(item, "expires_at_ms"),
            connection_count=_int(item, "connection_count"),
            capacity=_int(item, "capacity"),
            dead_at_ms=_opt_int(item, "dead_at_ms"),
            movable_count=_opt_int(item, "movable_count"),
            hinted_expiry_ms=_opt_int(item, "hinted_expiry_ms"),
            hinted_at_ms=_opt_int(item, "hinted_at_ms"),
            task_arn=_opt_str(item, "task_arn"),
            container_runtime_id=_opt_str(item, "container_runtime_id"),
        )

    @property
    def dead(self) -> bool:
        return self.dead_at_ms is not None

    def to_item(self) -> dict[str, Any]:
        item = {"pk": self.pk, "worker_index": WORKER_INDEX_VALUE, **asdict(self)}
        return {k: v for k, v in item.items() if v is not None}
