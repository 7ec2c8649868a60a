"""Lease stores: the interface the worker, the Lambdas and the tests use, and its DynamoDB
implementation (the only place that speaks DynamoDB for the connections table).

:class:`LeaseStore` holds the logic that is the same whatever the backend (the takeover
sequence of :meth:`LeaseStore.acquire`, settling refusals into domain errors) and declares
the primitive reads and conditional writes a backend provides, as Powertools' idempotency
utility splits ``BasePersistenceLayer`` from ``DynamoDBPersistenceLayer``.
:class:`DynamoDBLeaseStore` implements them with one request each;
:class:`wsfleet.memstore.InMemoryLeaseStore` implements them over a dict for the unit tests of
the session and the worker.

Writes that can be refused ask for ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` so a
refusal arrives with the item that caused it (a backend that ignores it, such as dynalite,
costs one consistent read instead).

The store is synchronous (boto3). The worker calls it from a bounded thread pool so the event
loop never blocks; Lambdas call it directly.

Example::

    store = LeaseStore.from_settings(settings)
    store.register_worker(worker)                 # the worker's one liveness lease
    record = store.acquire("CONN#abc", owner=worker.worker_id)
    lease = Lease.of(record)
    store.checkpoint(lease, 42)                   # only when the checkpoint is due
    store.renew_worker(worker.worker_id, ...)     # every heartbeat, one write per worker
    store.release(lease, last_seq=57)             # graceful hand-off
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from .aws import is_ambiguous
from .backoff import backoff
from .clock import Clock, now_ms
from .exceptions import (
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseLost,
    StoreError,
    WorkerDead,
)
from .lease import (
    EARLY_HINT_MAX_WAIT_MS,
    Lease,
    RefusalReason,
    TakeoverVerdict,
    is_stale_checkpoint,
    refusal_reason,
    takeover_verdict,
)
from .rebalance import FLEET_VIEW_PK, FleetView
from .record import (
    INDEX_SHARDS,
    WINDOW_FIELDS,
    WORKER_INDEX_VALUE,
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
    index_keys,
    worker_pk,
)
from .task_exit import ContainerStop, ExitKill, exit_kill_outcome
from .upstream_options import DEFAULT_OPTIONS, UpstreamOptions

__all__ = [
    "OWNER_INDEX",
    "STATE_INDEX",
    "UNOWNED_INDEX",
    "WORKERS_INDEX",
    "ConnectionPage",
    "DynamoDBLeaseStore",
    "IndexEntry",
    "LeaseStore",
    "StartResult",
    "StopResult",
]

OWNER_INDEX = "gsi_owner"
UNOWNED_INDEX = "gsi_unowned"
STATE_INDEX = "gsi_state"
WORKERS_INDEX = "gsi_workers"
_MAX_ERROR_CHARS = 1024
#: Dead worker ids an acquiring worker remembers (oldest forgotten first).
_DEAD_OWNERS_REMEMBERED = 1024
_BATCH_GET_LIMIT = 100
#: Checkpoints only move forward (see DynamoDBLeaseStore._holder_write).
_MONOTONIC_SEQ = "(attribute_not_exists(last_seq) OR last_seq <= :seq)"
_INDEX_ATTRIBUTES = ("unowned_shard", "unowned_since_ms")
_HINT_CLAIM = ("hinted_since_ms", "hinted_at_ms")


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _dump(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in item.items()}


def _load(item: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not item:
        return None
    return {k: _deserializer.deserialize(v) for k, v in item.items()}


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": _serializer.serialize(v) for k, v in values.items()}


@dataclass(frozen=True)
class StartResult:
    """Outcome of :meth:`LeaseStore.start`: the record as it now stands and what happened."""

    record: ConnectionRecord
    created: bool = False
    restarted: bool = False


def _same_stream(current: ConnectionRecord, ws_url: str, upstream: UpstreamOptions) -> bool:
    """A restart resumes from ``last_seq`` only if it means the same stream: the same URL and
    the same place of the seq in a frame (another pointer numbers frames differently). The
    options come from :func:`~wsfleet.upstream_options.parse_upstream_options`, which drops a
    pointer that spells out the default, so ``"/seq"`` and no pointer compare equal here."""
    return current.ws_url == ws_url and current.upstream.seq_pointer == upstream.seq_pointer


def _restart_changes(
    current: ConnectionRecord,
    ws_url: str,
    resume: bool,
    upstream: UpstreamOptions,
    now: int,
    *,
    owned: bool,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What a restart (STOPPED/FAILED -> STARTED) sets and removes: the START's URL and
    options, the index keys (``owned``: the owner stays until it releases; else it is removed
    and the connection is free now), the stop's traces and the breaker's count. The checkpoint
    and the gap history survive only for the same stream (:func:`_same_stream`)."""
    same = _same_stream(current, ws_url, upstream)
    keys, removed = index_keys(current.pk, DesiredState.STARTED, owned=owned, since_ms=now)
    values: dict[str, Any] = {
        "desired_state": DesiredState.STARTED.value,
        "ws_url": ws_url,
        "updated_at_ms": now,
        "resume": resume,
        "last_seq": current.last_seq if same else 0,
        **keys,
    }
    removals = [
        "stop_reason", "last_error", "expires_at", "failure_count", "failure_seq",
        "failure_since_ms",
    ]
    removals += removed
    if upstream.is_default:
        removals.append("upstream")
    else:
        values["upstream"] = upstream.to_item()
    if not same:  # another stream: its seqs say nothing about the old one's
        removals += ["resume_gaps", "gap_frames", *WINDOW_FIELDS]
    if current.lease_owner and not owned:
        removals.append("lease_owner")
    return values, tuple(removals)


@dataclass(frozen=True)
class StopResult:
    """Outcome of :meth:`LeaseStore.stop`: the record and whether this call stopped it."""

    record: ConnectionRecord
    stopped: bool


@dataclass(frozen=True)
class ConnectionPage:
    """One page of :meth:`LeaseStore.list_connections`; ``next_key`` is None on the last."""

    records: list[ConnectionRecord]
    next_key: dict[str, Any] | None


@dataclass(frozen=True)
class IndexEntry:
    """A connection as an index shows it (eventually consistent): key, epoch, state and, in
    gsi_unowned, since when it has been free."""

    pk: str
    epoch: int
    desired_state: DesiredState | None = None
    unowned_since_ms: int | None = None

    @classmethod
    def from_owner_index(cls, item: Mapping[str, Any]) -> IndexEntry:
        """The entry of a gsi_owner item."""
        state = item.get("desired_state")
        return cls(
            str(item["pk"]), int(item.get("lease_epoch", 0)), DesiredState(state) if state else None
        )

    @classmethod
    def from_unowned_index(cls, item: Mapping[str, Any]) -> IndexEntry:
        """The entry of a gsi_unowned item (only STARTED connections are in that index)."""
        return cls(
            str(item["pk"]),
            int(item.get("lease_epoch", 0)),
            DesiredState.STARTED,
            int(item["unowned_since_ms"]),
        )


class LeaseStore(ABC):
    """Connection and worker items: what a backend provides and the logic built on it.

    :param lease_ms: how far ahead a worker's heartbeat pushes its lease.
    :param stopped_retention_ms: TTL given to STOPPED items (``expires_at``); 0 keeps them.
    :param clock: wall clock in epoch ms, injectable for tests.
    """

    def __init__(
        self, *, lease_ms: int = 20_000, stopped_retention_ms: int = 0, clock: Clock = now_ms
    ) -> None:
        self.lease_ms = lease_ms
        self.stopped_retention_ms = stopped_retention_ms
        self._clock = clock
        self._dead_owners: dict[str, None] = {}  # insertion-ordered set (see _owner_verdict)
        self._dead_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, client: Any = None) -> LeaseStore:
        """The DynamoDB store for :class:`wsfleet.settings.Settings` (a client is made if none
        is given)."""
        if client is None:
            from .aws import dynamodb_client

            client = dynamodb_client()
        return DynamoDBLeaseStore(
            client,
            settings.connections_table,
            lease_ms=settings.lease_ms,
            stopped_retention_ms=int(settings.stopped_retention_days * 86_400_000),
        )

    def _end_changes(
        self, pk: str, state: DesiredState, reason: str, now: int
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """What ending a connection (STOPPED or FAILED) sets and removes, ownership aside:
        state, reason, index keys and, for STOPPED, the TTL."""
        keys, removed = index_keys(pk, state, owned=True, since_ms=now)
        values = {"desired_state": state.value, "stop_reason": reason, "updated_at_ms": now, **keys}
        if state is DesiredState.STOPPED and self.stopped_retention_ms > 0:
            values["expires_at"] = (now + self.stopped_retention_ms) // 1000
        return values, removed

    # ------------------------------------------------------------------ acquire (shared logic)
    def acquire(
        self, pk: str, owner: str, *, max_wait_ms: int = EARLY_HINT_MAX_WAIT_MS
    ) -> ConnectionRecord:
        """Take the connection if it is STARTED and free, or owned by a dead worker.

        Bumps ``lease_epoch``, so every later write of a previous holder is fenced. Takeover
        of an owned connection reads the owner's worker item (:func:`takeover_verdict`):

        * dead or gone: take it (conditional on the owner and epoch seen);
        * expired: kill that worker first (:meth:`kill_worker`), then take it;
        * lapsing within ``max_wait_ms``: LeaseConflict with ``retry_in_ms`` (early hint);
        * alive: LeaseConflict.

        A connection that already names ``owner`` is our own earlier attempt that landed
        (botocore retried a request whose answer was lost), or one whose session ended without
        its release: it is re-taken under a new epoch, so whatever that attempt or session
        still has in flight is fenced. Raises ConnectionStopped, ConnectionNotFound.
        """
        try:
            return self._take_write(pk, owner, "", 0)
        except _Refused as refused:
            current = _startable(pk, refused.current)
        if current.lease_owner and current.lease_owner != owner:
            verdict, wait_ms = self._owner_verdict(current.lease_owner, max_wait_ms)
            if verdict in (TakeoverVerdict.WAIT, TakeoverVerdict.CONFLICT):
                raise LeaseConflict(
                    f"{pk} is held by {current.lease_owner!r}",
                    current,
                    retry_in_ms=wait_ms if verdict is TakeoverVerdict.WAIT else None,
                )
        try:
            return self._take_write(pk, owner, current.lease_owner, current.lease_epoch)
        except _Refused as refused:
            latest = _startable(pk, refused.current)
        raise LeaseConflict(f"{pk} was taken by {latest.lease_owner!r} meanwhile", latest)

    def _owner_is_over(self, owner: str) -> bool:
        """The owner of a STOPPED connection being restarted can no longer release it: dead,
        gone, or expired (then killed here, so it can never wake up and stream it again).

        A session still ending owns a restarted connection until it releases it, and it joins
        gsi_unowned then; an owner that is over never releases (its item may even be deleted,
        so no reconcile pass would list it), so the restart drops it instead.
        """
        verdict, _ = self._owner_verdict(owner, 0)
        return verdict is TakeoverVerdict.TAKE

    def _owner_verdict(self, owner: str, max_wait_ms: int) -> tuple[TakeoverVerdict, int]:
        """:func:`takeover_verdict` for ``owner``, with the kill carried out: TAKE once the
        owner is dead (by our kill or before), CONFLICT if it renewed just in time.

        Death is permanent (no heartbeat is accepted after ``dead_at_ms``; a deleted item is
        never re-created under its id), so a dead owner is remembered: the peers taking over a
        dead worker's thousand connections read its item once each, not once per connection.
        """
        if owner in self._dead_owners:
            return TakeoverVerdict.TAKE, 0
        worker = self.get_worker(owner, consistent=True)
        verdict, wait_ms = takeover_verdict(worker, self._clock(), max_wait_ms)
        if verdict is TakeoverVerdict.KILL:
            verdict = TakeoverVerdict.TAKE if self.kill_worker(owner) else TakeoverVerdict.CONFLICT
        if verdict is TakeoverVerdict.TAKE:
            with self._dead_lock:
                self._dead_owners[owner] = None
                while len(self._dead_owners) > _DEAD_OWNERS_REMEMBERED:
                    del self._dead_owners[next(iter(self._dead_owners))]
        return verdict, wait_ms

    # ------------------------------------------------------------------ primitives
    @abstractmethod
    def _take_write(
        self, pk: str, owner: str, expected_owner: str, expected_epoch: int
    ) -> ConnectionRecord:
        """Set ``owner`` and bump the epoch, conditional on STARTED and on the current owner
        being ``expected_owner`` ("" = free) with ``expected_epoch`` (ignored when free).
        Raises :class:`_Refused` carrying the current item."""

    @abstractmethod
    def get(self, pk: str, *, consistent: bool = True) -> ConnectionRecord | None:
        """The connection item for ``pk``, or None."""

    @abstractmethod
    def batch_get(
        self, pks: Iterable[str], *, consistent: bool = False
    ) -> dict[str, ConnectionRecord]:
        """Many connection items (missing ones are absent from the result)."""

    def start(
        self,
        connection_id: str,
        ws_url: str,
        *,
        resume: bool = True,
        upstream: UpstreamOptions = DEFAULT_OPTIONS,
    ) -> StartResult:
        """Create a STARTED connection, or leave a live one exactly as it is.

        * New id: the item is created free (``created=True``).
        * Already STARTED: nothing is written. Re-sending START must never move a healthy
          stream to another worker.
        * STOPPED or FAILED: flipped back to STARTED (``restarted=True``) with the START's URL
          and ``upstream`` options. ``last_seq`` (and the gap counters) are kept when the URL
          and the seq pointer are unchanged, so the stream resumes where it stopped; another
          stream starts from 0. The crash-loop breaker's count is reset.
        """
        now = self._clock()
        record = ConnectionRecord.new(connection_id, ws_url, now).with_changes(
            resume=resume, upstream=upstream
        )
        try:
            self._create(record)
            return StartResult(record, created=True)
        except _Refused as refused:
            current = refused.current
        if current is None:  # only if it was deleted between our write and our read
            raise StoreError(f"start of {record.pk} refused, but the item is gone; retry")
        if current.desired_state is DesiredState.STARTED:
            return StartResult(current)
        keep_owner = bool(current.lease_owner) and not self._owner_is_over(current.lease_owner)
        set_values, remove = _restart_changes(
            current, ws_url, resume, upstream, now, owned=keep_owner
        )
        try:
            return StartResult(self._restart_write(current, set_values, remove), restarted=True)
        except _Refused as refused:  # a concurrent START or the owner's release came first
            winner = refused.current
            if winner is None:
                raise ConnectionNotFound(current.pk) from refused
        if winner.desired_state is DesiredState.STARTED:
            return StartResult(winner)
        return self.start(connection_id, ws_url, resume=resume, upstream=upstream)

    @abstractmethod
    def _create(self, record: ConnectionRecord) -> None:
        """Put a new connection item, conditional on its key being free. Raises
        :class:`_Refused` carrying the item that holds the key."""

    @abstractmethod
    def _restart_write(
        self, current: ConnectionRecord, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        """Apply a restart's changes, conditional on the item still being STOPPED or FAILED
        under the owner ``current`` shows (the index keys depend on it). Raises
        :class:`_Refused` carrying the current item."""

    def stop(self, pk: str, *, reason: str = "stopped") -> StopResult:
        """Set desired_state to STOPPED (idempotent; ``stopped`` is False if it already was).
        Raises ConnectionNotFound for an unknown pk. The owner is left alone: it learns of the
        STOP from its control channel (or its sweep), closes, and releases."""
        values, removed = self._end_changes(pk, DesiredState.STOPPED, reason, self._clock())
        try:
            return StopResult(self._stop_write(pk, values, removed), stopped=True)
        except _Refused as refused:
            if refused.current is None:
                raise ConnectionNotFound(pk) from refused
            return StopResult(refused.current, stopped=False)

    @abstractmethod
    def _stop_write(
        self, pk: str, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        """Apply a stop's changes, conditional on the item existing and not being STOPPED.
        Raises :class:`_Refused` carrying the current item (None: absent)."""

    @abstractmethod
    def list_connections(
        self, state: DesiredState, *, limit: int = 50, start_key: Mapping[str, Any] | None = None
    ) -> ConnectionPage:
        """One page of connections in ``state`` (gsi_state, shard by shard)."""

    # ------------------------------------------------------------------ holder writes
    # (shared: every one is a conditional update through the backend's _holder_update)
    def _holder_write(
        self,
        lease: Lease,
        set_values: Mapping[str, Any],
        *,
        remove: Iterable[str] = (),
        last_seq: int | None = None,
        started_only: bool = False,
    ) -> ConnectionRecord:
        """Set ``set_values`` and remove ``remove``, only while owner and epoch are ours (and,
        with ``started_only``, while STARTED). A refusal raises ConnectionStopped (ours, not
        STARTED) or LeaseLost.

        ``last_seq``, when given, is written only if it does not move the checkpoint back: two
        writes of one holder can land out of order (a retried request, a paused process), and
        the checkpoint must never regress. If a later checkpoint of ours already landed, the
        write goes ahead without the stale one.
        """
        removed = tuple(remove)
        try:
            return self._holder_update(lease, set_values, removed, last_seq, started_only)
        except _Refused as refused:
            current = refused.current
            if last_seq is not None and is_stale_checkpoint(current, lease, last_seq):
                # The send bound and replay totals of a stale write are older, hence lower,
                # than what landed: never written back (a bound must not shrink under frames
                # already sent).
                fresh = {k: v for k, v in set_values.items() if k not in WINDOW_FIELDS}
                return self._holder_write(lease, fresh, remove=removed, started_only=started_only)
            _raise_refusal(lease, current, refused.__cause__ or refused)

    @abstractmethod
    def _holder_update(
        self,
        lease: Lease,
        set_values: Mapping[str, Any],
        remove: tuple[str, ...],
        last_seq: int | None,
        started_only: bool,
    ) -> ConnectionRecord:
        """The conditional write of :meth:`_holder_write`: owner and epoch are ``lease``'s,
        STARTED if ``started_only``, and ``last_seq`` (set with the rest) is not below the
        item's. Raises :class:`_Refused` carrying the current item."""

    def checkpoint(
        self, lease: Lease, last_seq: int, *, window: Mapping[str, int] | None = None
    ) -> None:
        """Record ``last_seq`` as durable (never backwards), fenced by owner and epoch and
        allowed only while STARTED: ConnectionStopped tells the holder of a STOP it missed,
        LeaseLost that it is fenced. ``window``: an at-least-once sink's send bound and replay
        totals (:data:`WINDOW_FIELDS`), stored in the same write."""
        self._holder_write(
            lease,
            {"updated_at_ms": self._clock(), **(window or {})},
            last_seq=last_seq,
            started_only=True,
        )

    def release(
        self,
        lease: Lease,
        *,
        last_seq: int | None = None,
        stopped: bool = False,
        moved: bool = False,
        window: Mapping[str, int] | None = None,
    ) -> ConnectionRecord:
        """Give the connection up now (owner removed, epoch kept so it keeps counting), with
        the final checkpoint. ``stopped``: the holder knows it is no longer STARTED (so it does
        not belong in gsi_unowned). ``moved``: a rebalancing hand-off, remembered on the item
        (``rebalanced_at_ms``, in the same write) so no owner moves it again within the dwell
        time. ``window``: as for :meth:`checkpoint`. Raises LeaseLost if it was not ours any
        more."""
        now = self._clock()
        bound = dict(window or {})
        if not stopped:
            keys, _ = index_keys(lease.pk, DesiredState.STARTED, owned=False, since_ms=now)
            moved_at = {"rebalanced_at_ms": now} if moved else {}
            try:
                return self._holder_write(
                    lease,
                    {"updated_at_ms": now, **keys, **moved_at, **bound},
                    remove=("lease_owner",),
                    last_seq=last_seq,
                    started_only=True,
                )
            except ConnectionStopped:
                pass  # stopped meanwhile: released below without joining gsi_unowned
        try:
            return self._holder_write(
                lease, {"updated_at_ms": now, **bound}, remove=("lease_owner",), last_seq=last_seq
            )
        except ConnectionStopped as exc:
            raise LeaseLost(str(exc), exc.current) from exc

    def transfer(
        self,
        lease: Lease,
        to_owner: str,
        *,
        last_seq: int,
        moved: bool = True,
        window: Mapping[str, int] | None = None,
    ) -> ConnectionRecord:
        """Make-before-break's one ownership write (docs/handoff.md, step 5): the connection
        moves from ``lease`` (G, e) to ``(to_owner, e + 1)`` with the final checkpoint
        ``last_seq``, on condition that it is still G's under e and STARTED. No state names
        both owners; a takeover racing it makes exactly one of the two land.

        ``moved``: a rebalancing move, stamped ``rebalanced_at_ms`` (the dwell time), as a
        move's release is. ``window``: as for :meth:`release` (with nothing in flight the
        taker inherits no replay window). Raises ConnectionStopped (STOPPED meanwhile: nothing
        moved; the giver ends it as a STOP) or LeaseLost (not ours any more).

        >>> from wsfleet.memstore import InMemoryLeaseStore
        >>> store = InMemoryLeaseStore()
        >>> _ = store.start("a", "wss://x")
        >>> g = Lease.of(store.acquire("CONN#a", "g"))
        >>> moved = store.transfer(g, "t", last_seq=7)
        >>> moved.lease_owner, moved.lease_epoch - g.epoch, moved.last_seq
        ('t', 1, 7)
        """
        if not to_owner or to_owner == lease.owner:
            raise ValueError("a transfer names another owner")
        now = self._clock()
        values: dict[str, Any] = {
            "lease_owner": to_owner,
            "lease_epoch": lease.epoch + 1,
            "updated_at_ms": now,
            **(window or {}),
        }
        if moved:
            values["rebalanced_at_ms"] = now
        return self._holder_write(
            lease,
            values,
            remove=(*_INDEX_ATTRIBUTES, *_HINT_CLAIM),
            last_seq=last_seq,
            started_only=True,
        )

    def _end(
        self,
        lease: Lease,
        state: DesiredState,
        reason: str,
        extra: Mapping[str, Any],
        last_seq: int | None,
    ) -> ConnectionRecord:
        values, removed = self._end_changes(lease.pk, state, reason, self._clock())
        return self._fenced(
            lease, {**values, **extra}, remove=("lease_owner", *removed), last_seq=last_seq
        )

    def _fenced(
        self,
        lease: Lease,
        set_values: Mapping[str, Any],
        *,
        remove: Iterable[str] = (),
        last_seq: int | None = None,
    ) -> ConnectionRecord:
        """A holder write whose every refusal is LeaseLost (STOPPED does not stop it)."""
        try:
            return self._holder_write(lease, set_values, remove=remove, last_seq=last_seq)
        except ConnectionStopped as exc:
            raise LeaseLost(str(exc), exc.current) from exc

    def mark_stopped(
        self,
        lease: Lease,
        reason: str,
        *,
        last_seq: int | None = None,
        window: Mapping[str, int] | None = None,
    ) -> ConnectionRecord:
        """STOPPED + stop_reason + release in one write fenced by owner and epoch
        (``window``: as for :meth:`checkpoint`)."""
        return self._end(lease, DesiredState.STOPPED, reason, dict(window or {}), last_seq)

    def mark_failed(
        self,
        lease: Lease,
        reason: str,
        *,
        count: int,
        at_seq: int,
        since_ms: int | None = None,
        last_seq: int | None = None,
        window: Mapping[str, int] | None = None,
    ) -> ConnectionRecord:
        """The breaker tripped: FAILED + reason + release, fenced. FAILED is terminal until a
        new START and gets no TTL (an operator must be able to find it). ``window``: as for
        :meth:`checkpoint`."""
        reason = reason[:_MAX_ERROR_CHARS]
        extra: dict[str, Any] = {
            "last_error": reason, "failure_count": count, "failure_seq": at_seq, **(window or {})
        }
        if since_ms is not None:
            extra["failure_since_ms"] = since_ms
        return self._end(lease, DesiredState.FAILED, reason, extra, last_seq)

    def record_error(self, lease: Lease, message: str) -> None:
        """Note the latest upstream trouble on the record (truncated), fenced by owner+epoch."""
        self._fenced(
            lease, {"last_error": message[:_MAX_ERROR_CHARS], "updated_at_ms": self._clock()}
        )

    def note_failure(
        self, lease: Lease, error: str, *, count: int, at_seq: int, since_ms: int | None = None
    ) -> None:
        """Count a crash-loop failure on the item (survives hand-overs), fenced. One write
        holds the count, its position, the window's start and ``last_error``."""
        values: dict[str, Any] = {
            "failure_count": count,
            "failure_seq": at_seq,
            "last_error": error[:_MAX_ERROR_CHARS],
            "updated_at_ms": self._clock(),
        }
        if since_ms is not None:
            values["failure_since_ms"] = since_ms
        self._fenced(lease, values)

    def note_gap(self, lease: Lease, *, resumes: int, frames: int) -> None:
        """Store the connection's resume-gap totals (survive hand-overs), fenced.

        Totals, not increments: the holder is the only writer under its epoch, so it adds its
        own gaps to the counts it acquired with and writes the sums (an ADD retried after an
        ambiguous timeout would count one gap twice).
        """
        self._fenced(
            lease, {"resume_gaps": resumes, "gap_frames": frames, "updated_at_ms": self._clock()}
        )

    # workers
    @abstractmethod
    def register_worker(self, worker: WorkerRecord) -> None:
        """Create this worker's item (its lease); refused (StoreError) if the id exists with
        another record. The same record again is this registration landing twice (a retried
        write whose first attempt landed), and succeeds."""

    @abstractmethod
    def renew_worker(
        self,
        worker_id: str,
        *,
        expires_at_ms: int,
        connection_count: int,
        movable_count: int | None = None,
    ) -> None:
        """Extend the worker lease. WorkerDead if it was killed, retired or deleted.

        ``movable_count``: of the connections held, those rebalancing may move now (none moved
        within the dwell time); the reconciler plans with it. None: not written."""

    @abstractmethod
    def retire_worker(self, worker_id: str) -> None:
        """A worker that released everything ends its lease now (dead, expired)."""

    @abstractmethod
    def kill_worker(self, worker_id: str) -> bool:
        """Make an expired worker lease dead for good; True if it is dead now (by this call or
        before, or its item is gone), False if it is alive (it renewed meanwhile)."""

    @abstractmethod
    def kill_exited_worker(self, worker_id: str, stop: ContainerStop) -> ExitKill:
        """Make an incarnation whose container has stopped dead at once, lease or not.

        One conditional write, fenced by :func:`wsfleet.task_exit.ran_in` (the item names the
        stopped task, and that container's runtime id or a start no later than the stop) and
        by ``attribute_not_exists(dead_at_ms)``. Like a retirement it ends the lease now
        (``dead_at_ms = expires_at_ms = now``), and it claims the reconciler's hinting of that
        expiry (``hinted_expiry_ms``/``hinted_at_ms``), since the caller hints the worker's
        connections itself. A refusal says why (:class:`~wsfleet.task_exit.ExitKill`).
        """

    @abstractmethod
    def get_worker(self, worker_id: str, *, consistent: bool = False) -> WorkerRecord | None:
        """The worker item, or None."""

    @abstractmethod
    def get_workers(self, worker_ids: Iterable[str]) -> dict[str, WorkerRecord]:
        """Worker items by id (absent ids are missing from the result)."""

    @abstractmethod
    def list_worker_ids(self) -> list[str]:
        """Every registered worker id (gsi_workers: written at register only)."""

    @abstractmethod
    def delete_worker(self, worker_id: str, *, dead_before_ms: int) -> bool:
        """Delete a worker item whose lease ended before ``dead_before_ms``; False if not."""

    # the fleet view (rebalancing)
    @abstractmethod
    def put_fleet_view(self, view: FleetView) -> None:
        """Write the one ``FLEET#view`` item (unconditional: the latest pass wins)."""

    @abstractmethod
    def get_fleet_view(self, *, consistent: bool = False) -> FleetView | None:
        """The fleet view, or None if there is none or it is not well formed."""

    # indexes
    @abstractmethod
    def owned_by(self, owner: str, *, page_size: int = 1000) -> Iterator[IndexEntry]:
        """The connections ``owner`` holds, as gsi_owner shows them (eventually consistent)."""

    @abstractmethod
    def unowned(self, shard: int, before_ms: int, *, page_size: int = 500) -> Iterator[IndexEntry]:
        """STARTED connections of ``shard`` free since before ``before_ms`` (gsi_unowned)."""

    @abstractmethod
    def claim_worker_hints(self, worker: WorkerRecord, *, rehint_after_ms: int) -> bool:
        """Claim the hinting of a lapsing worker's connections, once per expiry it showed
        (again after ``rehint_after_ms``); False if someone already did or it renewed."""

    @abstractmethod
    def claim_hint(self, entry: IndexEntry, *, rehint_after_ms: int) -> bool:
        """Claim the hint for a free connection, once per free spell (again after
        ``rehint_after_ms``); False if already claimed or no longer free since then."""

    @abstractmethod
    def withdraw_hint_claim(self, entry: IndexEntry) -> bool:
        """Undo :meth:`claim_hint` for a hint that could not be sent."""


def _startable(pk: str, current: ConnectionRecord | None) -> ConnectionRecord:
    """The refused record, if an acquire may still go on: else the error that ends it."""
    if current is None:
        raise ConnectionNotFound(pk)
    if current.desired_state is not DesiredState.STARTED:
        raise ConnectionStopped(f"{pk} is {current.desired_state.value}", current)
    return current


class _Refused(Exception):
    """A conditional write was refused; ``current`` is the item as it stood (None: absent)."""

    def __init__(self, current: ConnectionRecord | None) -> None:
        super().__init__("refused")
        self.current = current


def _raise_refusal(
    lease: Lease, current: ConnectionRecord | None, cause: BaseException
) -> NoReturn:
    reason = refusal_reason(current, lease)
    if reason is RefusalReason.STOPPED:
        raise ConnectionStopped(f"{lease.pk} was stopped", current) from cause
    raise LeaseLost(
        f"{lease.pk} epoch {lease.epoch} of {lease.owner!r} is no longer held ({reason})", current
    ) from cause


def _may_have_landed(exc: StoreError) -> bool:
    """The failed write may have been applied anyway (a timeout, a 5xx): only a read tells."""
    return exc.__cause__ is not None and is_ambiguous(exc.__cause__)


def _is_condition_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _set_clause(values: Mapping[str, Any]) -> str:
    """``a = :a, b = :b`` for the attributes in ``values`` (names via ``#a`` placeholders)."""
    return ", ".join(f"#{name} = :{name}" for name in values)


class DynamoDBLeaseStore(LeaseStore):
    """:class:`LeaseStore` on the connections table: one request per primitive.

    :param client: a boto3 DynamoDB client (see :func:`wsfleet.aws.dynamodb_client`).
    :param table_name: the connections table.
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        lease_ms: int = 20_000,
        stopped_retention_ms: int = 0,
        clock: Clock = now_ms,
    ) -> None:
        super().__init__(lease_ms=lease_ms, stopped_retention_ms=stopped_retention_ms, clock=clock)
        self._client = client
        self.table_name = table_name

    # ------------------------------------------------------------------ low level
    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response: dict[str, Any] = getattr(self._client, operation)(
                TableName=self.table_name, **kwargs
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise
            raise StoreError(f"{operation} on {self.table_name} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"{operation} on {self.table_name} failed: {exc}") from exc
        return response

    def _query(
        self, index: str, key_condition: str, *, page_size: int, **values: Any
    ) -> Iterator[dict[str, Any]]:
        """Every item an index query returns, page by page (a boto3 paginator), fetched
        lazily."""
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table_name,
            IndexName=index,
            KeyConditionExpression=key_condition,
            ExpressionAttributeValues=_values(**values),
            PaginationConfig={"PageSize": page_size},
        )
        try:
            for page in pages:
                for raw in page.get("Items", []):
                    yield _load(raw) or {}
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"query on {self.table_name} failed: {exc}") from exc

    def _succeeds(self, operation: str, pk: str, condition: str, **kwargs: Any) -> bool:
        """A conditional write whose refusal is an answer (False), not an error."""
        try:
            self._call(operation, Key=_dump({"pk": pk}), ConditionExpression=condition, **kwargs)
        except ClientError:
            return False
        return True

    def _update(
        self,
        pk: str,
        *,
        set_values: Mapping[str, Any],
        remove: Iterable[str] = (),
        add: Mapping[str, Any] | None = None,
        condition: str,
        values: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One conditional UpdateItem returning ALL_NEW. Attribute names go through ``#name``
        placeholders, condition values are ``:name`` (``values``); assignment values are
        ``:name`` of the attribute. A refusal raises ClientError with ``Item`` = ALL_OLD."""
        expression = "SET " + _set_clause(set_values)
        names = {f"#{name}": name for name in set_values}
        removed = list(dict.fromkeys(remove))
        if removed:
            expression += " REMOVE " + ", ".join(f"#{name}" for name in removed)
            names.update({f"#{name}": name for name in removed})
        if add:
            expression += " ADD " + ", ".join(f"#{name} :{name}" for name in add)
            names.update({f"#{name}": name for name in add})
        for token in condition.replace("(", " ").replace(")", " ").replace(",", " ").split():
            if token.startswith("#"):
                names[token] = token[1:]
        response = self._call(
            "update_item",
            Key=_dump({"pk": pk}),
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=_values(**{**set_values, **(add or {}), **(values or {})}),
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return _load(response.get("Attributes")) or {}

    def _refusing_item(self, exc: ClientError, pk: str) -> dict[str, Any] | None:
        """The item that made a conditional write fail: the ALL_OLD copy the refusal carries,
        or a strongly consistent read when it carried none (the item is gone, or a backend
        that ignores ReturnValuesOnConditionCheckFailure)."""
        old_item = exc.response.get("Item")
        item = _load(old_item) if isinstance(old_item, Mapping) else None
        if item:
            return item
        response = self._call("get_item", Key=_dump({"pk": pk}), ConsistentRead=True)
        return _load(response.get("Item"))

    @contextlib.contextmanager
    def _refused_connection(self, pk: str) -> Iterator[None]:
        """A refused conditional write of connection ``pk`` raised as the backends' primitives
        raise it: :class:`_Refused` carrying the item as it stood (:meth:`_refusing_item`)."""
        try:
            yield
        except ClientError as exc:
            item = self._refusing_item(exc, pk)
            raise _Refused(ConnectionRecord.from_item(item) if item else None) from exc

    # ------------------------------------------------------------------ reads
    def get(self, pk: str, *, consistent: bool = True) -> ConnectionRecord | None:
        response = self._call("get_item", Key=_dump({"pk": pk}), ConsistentRead=consistent)
        item = _load(response.get("Item"))
        return ConnectionRecord.from_item(item) if item else None

    def batch_get(
        self, pks: Iterable[str], *, consistent: bool = False
    ) -> dict[str, ConnectionRecord]:
        return {
            pk: ConnectionRecord.from_item(item)
            for pk, item in self._batch_get_items(pks, consistent=consistent).items()
        }

    def _batch_get_items(
        self, pks: Iterable[str], *, consistent: bool
    ) -> dict[str, dict[str, Any]]:
        """BatchGetItem, 100 keys per call; unprocessed keys retried with jittered backoff."""
        unique = list(dict.fromkeys(pks))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(unique), _BATCH_GET_LIMIT):
            request: dict[str, Any] = {
                self.table_name: {
                    "Keys": [_dump({"pk": pk}) for pk in unique[start:start + _BATCH_GET_LIMIT]],
                    "ConsistentRead": consistent,
                }
            }
            delays = backoff()
            while request:
                try:
                    response = self._client.batch_get_item(RequestItems=request)
                except (ClientError, BotoCoreError) as exc:
                    raise StoreError(f"batch_get_item on {self.table_name} failed: {exc}") from exc
                for raw in response.get("Responses", {}).get(self.table_name, []):
                    item = _load(raw)
                    assert item is not None
                    found[str(item["pk"])] = item
                request = response.get("UnprocessedKeys") or {}
                if request:
                    time.sleep(next(delays))
        return found

    # ------------------------------------------------------------------ API-side writes
    def _create(self, record: ConnectionRecord) -> None:
        with self._refused_connection(record.pk):
            self._call(
                "put_item",
                Item=_dump(record.to_item()),
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )

    def _restart_write(
        self, current: ConnectionRecord, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        with self._refused_connection(current.pk):
            item = self._update(
                current.pk,
                set_values=set_values,
                remove=remove,
                # The owner condition keeps the index keys right.
                condition="#desired_state IN (:stopped, :failed) AND "
                + ("#lease_owner = :seen_owner" if current.lease_owner
                   else "attribute_not_exists(#lease_owner)"),
                values={
                    "stopped": DesiredState.STOPPED.value,
                    "failed": DesiredState.FAILED.value,
                    **({"seen_owner": current.lease_owner} if current.lease_owner else {}),
                },
            )
        return ConnectionRecord.from_item(item)

    def _stop_write(
        self, pk: str, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        with self._refused_connection(pk):
            item = self._update(
                pk,
                set_values=set_values,
                remove=remove,
                condition="attribute_exists(pk) AND #desired_state <> :stopped_state",
                values={"stopped_state": DesiredState.STOPPED.value},
            )
        return ConnectionRecord.from_item(item)

    def list_connections(
        self,
        state: DesiredState,
        *,
        limit: int = 50,
        start_key: Mapping[str, Any] | None = None,
    ) -> ConnectionPage:
        """Shard by shard through gsi_state (keys only), then the items in one BatchGetItem.

        ``start_key`` is what the previous page returned: the shard it stopped in and that
        shard's LastEvaluatedKey.
        """
        shard = int((start_key or {}).get("shard", 0))
        exclusive = (start_key or {}).get("key")
        pks: list[str] = []
        next_key: dict[str, Any] | None = None
        while shard < INDEX_SHARDS and len(pks) < limit:
            kwargs: dict[str, Any] = {}
            if exclusive:
                kwargs["ExclusiveStartKey"] = _dump(exclusive)
            response = self._call(
                "query",
                IndexName=STATE_INDEX,
                KeyConditionExpression="state_shard = :shard",
                ExpressionAttributeValues=_values(shard=f"{state.value}#{shard:02d}"),
                Limit=limit - len(pks),
                **kwargs,
            )
            pks.extend(str((_load(raw) or {})["pk"]) for raw in response.get("Items", []))
            exclusive = _load(response.get("LastEvaluatedKey"))
            if exclusive:
                next_key = {"shard": shard, "key": exclusive}
                if len(pks) >= limit:
                    break
                continue
            shard += 1
            next_key = {"shard": shard, "key": None} if shard < INDEX_SHARDS else None
        if len(pks) < limit:
            next_key = None
        items = self.batch_get(pks)
        records = [items[pk] for pk in pks if pk in items and items[pk].desired_state is state]
        return ConnectionPage(records, next_key)

    # ------------------------------------------------------------------ holder writes
    def _take_write(
        self, pk: str, owner: str, expected_owner: str, expected_epoch: int
    ) -> ConnectionRecord:
        now = self._clock()
        condition = "attribute_exists(pk) AND #desired_state = :started_state AND "
        values: dict[str, Any] = {"started_state": DesiredState.STARTED.value}
        if expected_owner:
            condition += "#lease_owner = :expected_owner AND #lease_epoch = :expected_epoch"
            values.update(expected_owner=expected_owner, expected_epoch=expected_epoch)
        else:
            condition += "attribute_not_exists(#lease_owner)"
        # The refusal's read stays outside the ambiguous-failure handling: a refused write
        # did not land, whatever that read meets.
        with self._refused_connection(pk):
            try:
                item = self._update(
                    pk,
                    set_values={"lease_owner": owner, "updated_at_ms": now},
                    remove=(*_INDEX_ATTRIBUTES, *_HINT_CLAIM),
                    add={"lease_epoch": 1},
                    condition=condition,
                    values=values,
                )
            except StoreError as exc:
                if not _may_have_landed(exc):
                    raise
                try:
                    current = self.get(pk, consistent=True)
                except StoreError:
                    raise exc from None
                if current is not None and current.lease_owner == owner:
                    # Our write landed; take it once more so its epoch is one nobody else saw.
                    return self._take_write(pk, owner, owner, current.lease_epoch)
                raise
        return ConnectionRecord.from_item(item)

    def _holder_update(
        self,
        lease: Lease,
        set_values: Mapping[str, Any],
        remove: tuple[str, ...],
        last_seq: int | None,
        started_only: bool,
    ) -> ConnectionRecord:
        condition = "#lease_owner = :owner AND #lease_epoch = :epoch"
        values: dict[str, Any] = {"owner": lease.owner, "epoch": lease.epoch}
        assignments = dict(set_values)
        if started_only:
            condition += " AND #desired_state = :started_state"
            values["started_state"] = DesiredState.STARTED.value
        if last_seq is not None:
            assignments["last_seq"] = last_seq
            condition += " AND (attribute_not_exists(#last_seq) OR #last_seq <= :last_seq)"
        with self._refused_connection(lease.pk):
            item = self._update(
                lease.pk, set_values=assignments, remove=remove, condition=condition, values=values
            )
        return ConnectionRecord.from_item(item)

    # ------------------------------------------------------------------ worker items
    def register_worker(self, worker: WorkerRecord) -> None:
        try:
            self._call(
                "put_item",
                Item=_dump(worker.to_item()),
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            # An attempt answered 5xx may have landed, and botocore's retry then meets our own
            # item: that is a registration, not a clash (no heartbeat has touched it yet).
            if self._worker_refusing(exc, worker.worker_id) == worker:
                return
            raise StoreError(f"worker id {worker.worker_id!r} is already registered") from exc

    def renew_worker(
        self,
        worker_id: str,
        *,
        expires_at_ms: int,
        connection_count: int,
        movable_count: int | None = None,
    ) -> None:
        # the movable count rides on the heartbeat: a few bytes more, no request more
        movable = {} if movable_count is None else {"movable": movable_count}
        try:
            self._call(
                "update_item",
                Key=_dump({"pk": worker_pk(worker_id)}),
                UpdateExpression=(
                    "SET heartbeat_at_ms = :now, expires_at_ms = :expires, connection_count = :n"
                    + (", movable_count = :movable" if movable else "")
                ),
                ConditionExpression="attribute_exists(pk) AND attribute_not_exists(dead_at_ms)",
                ExpressionAttributeValues=_values(
                    now=self._clock(), expires=expires_at_ms, n=connection_count, **movable
                ),
            )
        except ClientError as exc:
            raise WorkerDead(f"worker {worker_id!r} was killed or deleted") from exc

    def retire_worker(self, worker_id: str) -> None:
        now = self._clock()
        self._succeeds(  # refused: already dead or gone, nothing left to end
            "update_item",
            worker_pk(worker_id),
            "attribute_exists(pk) AND attribute_not_exists(dead_at_ms)",
            UpdateExpression="SET dead_at_ms = :now, expires_at_ms = :now",
            ExpressionAttributeValues=_values(now=now),
        )

    def kill_worker(self, worker_id: str) -> bool:
        now = self._clock()
        try:
            self._call(
                "update_item",
                Key=_dump({"pk": worker_pk(worker_id)}),
                UpdateExpression="SET dead_at_ms = :now",
                ConditionExpression=(
                    "attribute_exists(pk) AND attribute_not_exists(dead_at_ms) "
                    "AND expires_at_ms < :now"
                ),
                ExpressionAttributeValues=_values(now=now),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            worker = self._worker_refusing(exc, worker_id)
            return worker is None or worker.dead
        return True

    def kill_exited_worker(self, worker_id: str, stop: ContainerStop) -> ExitKill:
        now = self._clock()
        values: dict[str, Any] = {"now": now, "task_arn": stop.task_arn}
        fences: list[str] = []
        if stop.runtime_id:
            fences.append("container_runtime_id = :runtime_id")
            values["runtime_id"] = stop.runtime_id
        if stop.stopped_at_ms is not None:
            condition = "started_at_ms <= :stopped_at"
            if stop.runtime_id:  # only an item without a runtime id is judged by its start
                condition = f"(attribute_not_exists(container_runtime_id) AND {condition})"
            fences.append(condition)
            values["stopped_at"] = stop.stopped_at_ms
        if not fences:  # nothing tells this container's incarnations from a newer one's
            return ExitKill.NOT_THIS_CONTAINER
        try:
            self._call(
                "update_item",
                Key=_dump({"pk": worker_pk(worker_id)}),
                UpdateExpression=(
                    "SET dead_at_ms = :now, expires_at_ms = :now, hinted_expiry_ms = :now, "
                    "hinted_at_ms = :now"
                ),
                ConditionExpression=(
                    "attribute_exists(pk) AND attribute_not_exists(dead_at_ms) "
                    f"AND task_arn = :task_arn AND ({' OR '.join(fences)})"
                ),
                ExpressionAttributeValues=_values(**values),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            return exit_kill_outcome(self._worker_refusing(exc, worker_id), stop)
        return ExitKill.KILLED

    def _worker_refusing(self, exc: ClientError, worker_id: str) -> WorkerRecord | None:
        """The worker item that refused a conditional write (:meth:`_refusing_item`)."""
        item = self._refusing_item(exc, worker_pk(worker_id))
        return WorkerRecord.from_item(item) if item else None

    def get_worker(self, worker_id: str, *, consistent: bool = False) -> WorkerRecord | None:
        response = self._call(
            "get_item", Key=_dump({"pk": worker_pk(worker_id)}), ConsistentRead=consistent
        )
        item = _load(response.get("Item"))
        return WorkerRecord.from_item(item) if item else None

    def get_workers(self, worker_ids: Iterable[str]) -> dict[str, WorkerRecord]:
        items = self._batch_get_items((worker_pk(w) for w in worker_ids), consistent=False)
        return {str(item["worker_id"]): WorkerRecord.from_item(item) for item in items.values()}

    def list_worker_ids(self) -> list[str]:
        items = self._query(
            WORKERS_INDEX, "worker_index = :workers", page_size=1000, workers=WORKER_INDEX_VALUE
        )
        prefix = worker_pk("")
        return [str(item["pk"])[len(prefix):] for item in items]

    def delete_worker(self, worker_id: str, *, dead_before_ms: int) -> bool:
        return self._succeeds(
            "delete_item",
            worker_pk(worker_id),
            "expires_at_ms < :before",
            ExpressionAttributeValues=_values(before=dead_before_ms),
        )

    # ------------------------------------------------------------------ the fleet view
    def put_fleet_view(self, view: FleetView) -> None:
        self._call("put_item", Item=_dump(view.to_item()))

    def get_fleet_view(self, *, consistent: bool = False) -> FleetView | None:
        response = self._call(
            "get_item", Key=_dump({"pk": FLEET_VIEW_PK}), ConsistentRead=consistent
        )
        return FleetView.parse(_load(response.get("Item")))

    # ------------------------------------------------------------------ indexes
    def owned_by(self, owner: str, *, page_size: int = 1000) -> Iterator[IndexEntry]:
        items = self._query(OWNER_INDEX, "lease_owner = :owner", page_size=page_size, owner=owner)
        return map(IndexEntry.from_owner_index, items)

    def unowned(self, shard: int, before_ms: int, *, page_size: int = 500) -> Iterator[IndexEntry]:
        items = self._query(
            UNOWNED_INDEX,
            "unowned_shard = :shard AND unowned_since_ms < :before",
            page_size=page_size,
            shard=f"{shard:02d}",
            before=before_ms,
        )
        return map(IndexEntry.from_unowned_index, items)

    def claim_worker_hints(self, worker: WorkerRecord, *, rehint_after_ms: int) -> bool:
        now = self._clock()
        return self._succeeds(
            "update_item",
            worker.pk,
            "expires_at_ms = :expiry AND (attribute_not_exists(hinted_at_ms) "
            "OR hinted_expiry_ms <> :expiry OR hinted_at_ms < :stale)",
            UpdateExpression="SET hinted_expiry_ms = :expiry, hinted_at_ms = :now",
            ExpressionAttributeValues=_values(
                expiry=worker.expires_at_ms, now=now, stale=now - rehint_after_ms
            ),
        )

    def claim_hint(self, entry: IndexEntry, *, rehint_after_ms: int) -> bool:
        now = self._clock()
        return self._succeeds(
            "update_item",
            entry.pk,
            "unowned_since_ms = :since AND attribute_not_exists(lease_owner) AND "
            "(attribute_not_exists(hinted_at_ms) OR hinted_since_ms <> :since "
            "OR hinted_at_ms < :stale)",
            UpdateExpression="SET hinted_since_ms = :since, hinted_at_ms = :now",
            ExpressionAttributeValues=_values(
                since=entry.unowned_since_ms, now=now, stale=now - rehint_after_ms
            ),
        )

    def withdraw_hint_claim(self, entry: IndexEntry) -> bool:
        return self._succeeds(
            "update_item",
            entry.pk,
            "hinted_since_ms = :since",
            UpdateExpression="REMOVE hinted_since_ms, hinted_at_ms",
            ExpressionAttributeValues=_values(since=entry.unowned_since_ms),
        )
