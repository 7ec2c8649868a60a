"""Lease rules: pure decisions over a record, a lease and a clock reading.

Nothing here does I/O or reads a clock; callers pass ``now_ms``. The store turns the same rules
into DynamoDB condition expressions, and :mod:`tests.unit.test_lease` pins both to one truth
table.

Vocabulary:

* A record is **expired** when ``lease_expires_at_ms < now``. A free record (never acquired,
  or released with expiry 0) is expired by definition, which is why released connections are
  found by the orphan query at once.
* A connection is **acquirable** when it is STARTED and expired.
* A :class:`Lease` is what a holder remembers after acquiring: pk, owner, epoch and expiry.
  The record is **ours** while owner *and* epoch still match. Checking the epoch, not only the
  owner, fences a worker that lost a lease and then re-acquired it: its old session still holds
  the old epoch and can no longer write.
* A holder **self-fences** when no renewal has succeeded by ``expires_at - margin``: it closes the
  socket before any peer may legally acquire.
* An **early hint** names a lease about to lapse. SQS delays are whole seconds, so it is sent
  to land up to a second *before* the expiry, and the worker that receives it waits out the
  rest (:func:`acquire_wait_ms`): the takeover starts at the expiry, not up to a second after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TypeGuard

from .record import ConnectionRecord, DesiredState, WorkerRecord

__all__ = [
    "EARLY_HINT_MAX_WAIT_MS",
    "MAX_HINT_DELAY_SECONDS",
    "BreakerVerdict",
    "Lease",
    "LeaseState",
    "RefusalReason",
    "acquire_wait_ms",
    "breaker_verdict",
    "hint_delay_seconds",
    "is_acquirable",
    "is_expired",
    "is_fenced",
    "is_free",
    "is_orphan",
    "is_ours",
    "is_own_acquire",
    "is_stale_checkpoint",
    "is_worker_alive",
    "lease_expires_in_ms",
    "lease_state",
    "refusal_reason",
    "self_fence_at_ms",
    "should_self_fence",
    "will_expire_before",
]

#: SQS caps DelaySeconds at 15 minutes.
MAX_HINT_DELAY_SECONDS = 900
#: The longest a worker waits for a hinted lease to lapse before it acquires: the second an
#: early hint may land ahead of the expiry, plus room for clock skew and delivery jitter.
EARLY_HINT_MAX_WAIT_MS = 2_000


@dataclass(frozen=True)
class Lease:
    """What a holder knows about the lease it won. Immutable; renewals return a new one."""

    pk: str
    owner: str
    epoch: int
    expires_at_ms: int

    @classmethod
    def of(cls, record: ConnectionRecord) -> Lease:
        """The lease described by a record the caller just acquired or renewed."""
        return cls(record.pk, record.lease_owner, record.lease_epoch, record.lease_expires_at_ms)

    def extended_to(self, expires_at_ms: int) -> Lease:
        return replace(self, expires_at_ms=expires_at_ms)


class RefusalReason(StrEnum):
    """Why a holder's conditional write (renew, checkpoint, release) was refused."""

    STOPPED = "stopped"  # still ours, but the API asked for the connection to stop
    LOST = "lost"  # owner or epoch changed: someone else may be streaming now
    GONE = "gone"  # the item no longer exists


def is_free(record: ConnectionRecord) -> bool:
    """Nobody has held the lease since it was created or released."""
    return record.lease_owner == "" or record.lease_expires_at_ms == 0


def is_expired(record: ConnectionRecord, now_ms: int) -> bool:
    """The lease no longer protects its holder (free leases count as expired)."""
    return record.lease_expires_at_ms < now_ms


def is_acquirable(record: ConnectionRecord, now_ms: int) -> bool:
    """A worker may take this connection now: it should run and nobody holds a live lease."""
    return record.desired_state is DesiredState.STARTED and is_expired(record, now_ms)


def is_orphan(record: ConnectionRecord, now_ms: int) -> bool:
    """Should be streaming, but no live lease: the reconciler's target."""
    return is_acquirable(record, now_ms)


class LeaseState(StrEnum):
    """How a connection's lease looks at ``now``, as the API and the CLI show it."""

    FREE = "free"  # never held, or released
    HELD = "held"  # a holder is renewing it
    EXPIRED = "expired"  # the holder stopped renewing


def lease_state(record: ConnectionRecord, now_ms: int) -> LeaseState:
    """``free`` (never held or released), ``expired`` (holder stopped renewing) or ``held``."""
    if is_free(record):
        return LeaseState.FREE
    return LeaseState.EXPIRED if is_expired(record, now_ms) else LeaseState.HELD


def lease_expires_in_ms(record: ConnectionRecord, now_ms: int) -> int | None:
    """Milliseconds until the lease lapses (0 once it has); ``None`` for a free lease."""
    if is_free(record):
        return None
    return max(0, record.lease_expires_at_ms - now_ms)


def will_expire_before(record: ConnectionRecord, deadline_ms: int) -> bool:
    """STARTED and its lease ends before ``deadline_ms`` (early-hint window of a pass)."""
    return record.desired_state is DesiredState.STARTED and record.lease_expires_at_ms < deadline_ms


def is_ours(record: ConnectionRecord, lease: Lease) -> bool:
    """The record still names our owner id and our epoch."""
    return record.lease_owner == lease.owner and record.lease_epoch == lease.epoch


def is_fenced(record: ConnectionRecord | None, lease: Lease) -> bool:
    """Someone else acquired since we did (or the item is gone): we must not write again."""
    return record is None or not is_ours(record, lease)


def is_stale_checkpoint(current: ConnectionRecord | None, lease: Lease, seq: int) -> bool:
    """Still ours, but a later checkpoint already landed: ``seq`` would move it backwards."""
    return current is not None and is_ours(current, lease) and current.last_seq > seq


def refusal_reason(current: ConnectionRecord | None, lease: Lease) -> RefusalReason:
    """Classify a refused holder write from the item DynamoDB returned with the failure."""
    if current is None:
        return RefusalReason.GONE
    if not is_ours(current, lease):
        return RefusalReason.LOST
    if current.desired_state is DesiredState.STOPPED:
        return RefusalReason.STOPPED
    # Ours and STARTED, yet refused: only possible if a stricter condition failed (e.g. the
    # item changed between our read and write). Treat as lost: the safe direction.
    return RefusalReason.LOST


def self_fence_at_ms(lease: Lease, margin_ms: int) -> int:
    """The moment a holder without a fresh renewal must have closed its socket."""
    return lease.expires_at_ms - margin_ms


def should_self_fence(lease: Lease, now_ms: int, margin_ms: int) -> bool:
    return now_ms >= self_fence_at_ms(lease, margin_ms)


def hint_delay_seconds(record: ConnectionRecord, now_ms: int) -> int:
    """Delay for an early hint: delivered in the last second before the lease expires.

    Rounded down: the receiving worker waits out the rest (:func:`acquire_wait_ms`). Rounded
    up, the hint would land up to a whole second after the expiry, all of it added to the
    failover time.
    """
    remaining_ms = record.lease_expires_at_ms - now_ms
    if remaining_ms < 0:
        return 0
    return min(MAX_HINT_DELAY_SECONDS, remaining_ms // 1000)


def acquire_wait_ms(
    current: ConnectionRecord | None, owner: str, now_ms: int, max_wait_ms: int
) -> int | None:
    """After a refused acquire: how long to wait before trying once more, or None to give up.

    Worth waiting for only a STARTED lease held by someone else that lapses within
    ``max_wait_ms``: the early hint arrived ahead of the expiry. The wait ends just past the
    expiry (``lease_expires_at_ms < now`` is what the acquire requires); zero if it has
    passed since the refusal, which is common: a hint landing a few milliseconds early. A
    holder still alive will have renewed by then, and the second attempt is refused for good.
    """
    if current is None or current.desired_state is not DesiredState.STARTED:
        return None
    if not current.lease_owner or current.lease_owner == owner:
        return None
    wait_ms = current.lease_expires_at_ms - now_ms + 1
    return max(0, wait_ms) if wait_ms <= max_wait_ms else None


def is_own_acquire(
    current: ConnectionRecord | None, owner: str, expires_at_ms: int
) -> TypeGuard[ConnectionRecord]:
    """A refused acquire that had in fact landed: botocore retried an attempt whose answer was
    lost (a 5xx or a timeout after the write), and the retry met the lease it had just taken.

    The expiry the call wrote identifies its own write; the item then names us as owner with
    that exact expiry, and the epoch the write gave it.
    """
    return (
        current is not None
        and current.desired_state is DesiredState.STARTED
        and current.lease_owner == owner
        and current.lease_expires_at_ms == expires_at_ms
    )


def is_worker_alive(worker: WorkerRecord | None, now_ms: int) -> bool:
    """A worker item counts as live until its own heartbeat-renewed expiry passes."""
    return worker is not None and worker.expires_at_ms >= now_ms


@dataclass(frozen=True)
class BreakerVerdict:
    """The crash-loop breaker's answer for one more failure of a connection.

    ``count`` failures have now happened at checkpoint ``at_seq``; ``trip`` means the
    connection must end FAILED instead of being handed to the next worker.
    """

    count: int
    at_seq: int
    trip: bool


def breaker_verdict(record: ConnectionRecord, checkpoint: int, max_failures: int) -> BreakerVerdict:
    """Count one more poison failure (a crash, a protocol close the worker sent) at ``checkpoint``.

    Failures are consecutive only while the checkpoint stands still: the same input keeps
    coming back from ``checkpoint + 1``. A checkpoint that advanced means the stream got past
    whatever failed before, so the count starts again at 1. ``max_failures <= 0`` turns the
    breaker off (it never trips).

    >>> rec = ConnectionRecord.new("c", "wss://x", 0).with_changes(failure_count=2, failure_seq=7)
    >>> breaker_verdict(rec, 7, 3)
    BreakerVerdict(count=3, at_seq=7, trip=True)
    >>> breaker_verdict(rec, 8, 3)
    BreakerVerdict(count=1, at_seq=8, trip=False)
    """
    count = record.failure_count + 1 if record.failure_seq == checkpoint else 1
    return BreakerVerdict(count, checkpoint, max_failures > 0 and count >= max_failures)
