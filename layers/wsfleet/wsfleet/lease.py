"""Lease rules (model v2): pure decisions over records, a worker lease and a clock reading.

Nothing here does I/O, reads a clock or imports boto3/asyncio; callers pass ``now_ms``. The
store turns the same rules into DynamoDB condition expressions, and :mod:`tests.unit.test_lease`
pins both to one truth table.

The model:

* A **worker lease** (the worker item's ``expires_at_ms``) is the only thing renewed on a
  heartbeat: one write per worker per heartbeat, whatever it holds.
* A **connection** names its owner (``lease_owner``) and an **epoch**; it is alive while its
  owner's worker lease is. Connection items are written only when ownership or the checkpoint
  changes, never to stay alive.
* The epoch is the fence: every holder write is conditional on owner *and* epoch, so a
  session that lost its connection can never write to it again, even after the same worker
  re-acquired it.
* **Takeover** of a connection whose owner's lease expired takes two plain conditional writes,
  no transaction: first the **kill** (``dead_at_ms`` on the owner's worker item, conditional on
  its lease having expired and not yet being dead); a worker's heartbeat is conditional on not
  being dead, so the killed worker can never renew again. Then the connection is taken with an
  update conditional on the owner and epoch seen. A hundred peers taking over one dead
  worker's connections contend on nothing but those connections: the first kill wins, the
  others read ``dead`` and go ahead.
* A worker **self-fences** when no renewal has succeeded by ``expires_at - margin``: it closes
  every socket before any peer may kill it, and its incarnation is over (it never renews again:
  its connections would otherwise stay owned by a live worker without a session).
* An **early hint** names a worker whose lease is about to lapse. SQS delays are whole
  seconds, so it is sent to land up to a second *before* the expiry, and the worker that
  receives it waits out the rest (:func:`takeover_verdict`): the takeover starts at the
  expiry, not up to a second after.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from .record import ConnectionRecord, DesiredState, WorkerRecord
from .upstream_options import HandoffMode

__all__ = [
    "EARLY_HINT_MAX_WAIT_MS",
    "MAX_HINT_DELAY_SECONDS",
    "BreakerVerdict",
    "GiverVerdict",
    "HandoffStep",
    "Lease",
    "LeaseState",
    "RefusalReason",
    "TakeoverVerdict",
    "TakerVerdict",
    "TimerAction",
    "WorkerLeaseTimer",
    "breaker_verdict",
    "checkpoint_due",
    "commit_confirmed",
    "giver_verdict",
    "handoff_mode",
    "hint_delay_seconds",
    "is_acquirable",
    "is_fenced",
    "is_free",
    "is_ours",
    "is_stale_checkpoint",
    "is_worker_alive",
    "lease_expires_in_ms",
    "lease_state",
    "overlap_ready",
    "prepare_confirmed",
    "prepared_resume_seq",
    "refusal_reason",
    "takeover_verdict",
    "taker_verdict",
]

#: SQS caps DelaySeconds at 15 minutes.
MAX_HINT_DELAY_SECONDS = 900
#: The longest a worker waits for a hinted owner's lease to lapse before it takes over: the
#: second an early hint may land ahead of the expiry, plus room for clock skew and jitter.
EARLY_HINT_MAX_WAIT_MS = 2_000


@dataclass(frozen=True)
class Lease:
    """What a holder knows about a connection it won: its key, the owner id and the epoch."""

    pk: str
    owner: str
    epoch: int

    @classmethod
    def of(cls, record: ConnectionRecord) -> Lease:
        """The lease described by a record the caller just acquired."""
        return cls(record.pk, record.lease_owner, record.lease_epoch)


class RefusalReason(StrEnum):
    """Why a holder's conditional write (checkpoint, release) was refused."""

    STOPPED = "stopped"  # still ours, but the API asked for the connection to stop
    LOST = "lost"  # owner or epoch changed: someone else may be streaming now
    GONE = "gone"  # the item no longer exists


def is_free(record: ConnectionRecord) -> bool:
    """Nobody holds it: never acquired, or released."""
    return record.lease_owner == ""


def is_acquirable(record: ConnectionRecord) -> bool:
    """STARTED and free: one conditional write takes it."""
    return record.desired_state is DesiredState.STARTED and is_free(record)


def is_worker_alive(worker: WorkerRecord | None, now_ms: int) -> bool:
    """A worker lease protects its connections until it expires or the worker is killed."""
    return worker is not None and not worker.dead and worker.expires_at_ms >= now_ms


class LeaseState(StrEnum):
    """How a connection's ownership looks at ``now``, as the API and the CLI show it."""

    FREE = "free"  # never held, or released
    HELD = "held"  # its owner's worker lease is live
    EXPIRED = "expired"  # its owner stopped renewing (or was killed): a peer may take it


def lease_state(
    record: ConnectionRecord, owner: WorkerRecord | None, now_ms: int
) -> LeaseState:
    """``free``, ``held`` (owner alive) or ``expired``; ``owner`` is the owner's worker item."""
    if is_free(record):
        return LeaseState.FREE
    return LeaseState.HELD if is_worker_alive(owner, now_ms) else LeaseState.EXPIRED


def lease_expires_in_ms(
    record: ConnectionRecord, owner: WorkerRecord | None, now_ms: int
) -> int | None:
    """Milliseconds until the owner's lease lapses (0 once it has); ``None`` while free."""
    if is_free(record):
        return None
    if owner is None or owner.dead:
        return 0
    return max(0, owner.expires_at_ms - now_ms)


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
    if current.desired_state is not DesiredState.STARTED:
        return RefusalReason.STOPPED
    # Ours and STARTED, yet refused: only possible if a stricter condition failed (e.g. the
    # item changed between our read and write). Treat as lost: the safe direction.
    return RefusalReason.LOST


# ============================================================================ takeover


class TakeoverVerdict(Enum):
    """What a worker may do about a connection owned by someone else (see takeover_verdict)."""

    TAKE = "take"  # the owner is dead (killed, retired, or its item is gone): take it
    KILL = "kill"  # the owner's lease expired: kill the worker first, then take it
    WAIT = "wait"  # the owner's lease lapses within the wait budget (an early hint)
    CONFLICT = "conflict"  # the owner is alive: leave it


def takeover_verdict(
    owner: WorkerRecord | None, now_ms: int, max_wait_ms: int
) -> tuple[TakeoverVerdict, int]:
    """Decide a takeover from the owner's worker item; returns the verdict and, for WAIT, how
    long to wait (the lease ends just before ``expires_at_ms + 1``).

    A missing item means the worker is long gone: items are deleted only after their worker
    died and owns nothing any more (or by an operator), and a worker that finds its item gone
    never renews again.

    >>> w = WorkerRecord(worker_id="w", control_queue_url="", started_at_ms=0,
    ...                  heartbeat_at_ms=0, expires_at_ms=10_000)
    >>> takeover_verdict(w, 9_000, 2_000), takeover_verdict(w, 10_001, 2_000)
    ((<TakeoverVerdict.WAIT: 'wait'>, 1001), (<TakeoverVerdict.KILL: 'kill'>, 0))
    """
    if owner is None or owner.dead:
        return TakeoverVerdict.TAKE, 0
    if owner.expires_at_ms < now_ms:
        return TakeoverVerdict.KILL, 0
    wait_ms = owner.expires_at_ms - now_ms + 1
    if wait_ms <= max_wait_ms:
        return TakeoverVerdict.WAIT, wait_ms
    return TakeoverVerdict.CONFLICT, 0


def hint_delay_seconds(expires_at_ms: int, now_ms: int) -> int:
    """Delay for an early hint: delivered in the last second before a lease expires.

    Rounded down: the receiving worker waits out the rest (:func:`takeover_verdict`). Rounded
    up, the hint would land up to a whole second after the expiry, all of it added to the
    failover time.

    >>> hint_delay_seconds(12_500, 10_000), hint_delay_seconds(9_000, 10_000)
    (2, 0)
    """
    remaining_ms = expires_at_ms - now_ms
    if remaining_ms < 0:
        return 0
    return min(MAX_HINT_DELAY_SECONDS, remaining_ms // 1000)


# ============================================================================ worker lease timing


class TimerAction(Enum):
    WAIT = "wait"
    RENEW = "renew"
    FENCE = "fence"


@dataclass(slots=True)
class WorkerLeaseTimer:
    """Renewal schedule and self-fence deadline of a worker's own lease (wall-clock epoch ms).

    * A renewal is due ``heartbeat_ms`` after the previous one *started* (the expiry it wrote
      was computed from that moment), and a failed one is retried after ``retry_ms``.
    * Self-fence: once ``expires_at_ms - margin_ms`` passes without a successful renewal the
      worker must close every socket and stop writing, before a peer may kill it. The same
      deadline gates every message write (:meth:`may_write`).

    >>> t = WorkerLeaseTimer.start(0, lease_ms=20_000, heartbeat_ms=5_000, margin_ms=2_000)
    >>> t.action(4_999), t.action(5_000), t.action(18_000)
    (<TimerAction.WAIT: 'wait'>, <TimerAction.RENEW: 'renew'>, <TimerAction.FENCE: 'fence'>)
    """

    expires_at_ms: int
    lease_ms: int
    heartbeat_ms: int
    margin_ms: int
    renew_due_ms: int
    retry_ms: int = 250
    renewing: bool = False

    @classmethod
    def start(
        cls, registered_at_ms: int, *, lease_ms: int, heartbeat_ms: int, margin_ms: int
    ) -> WorkerLeaseTimer:
        """A timer for a worker item written at ``registered_at_ms`` (expiry + lease)."""
        return cls(
            expires_at_ms=registered_at_ms + lease_ms,
            lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms,
            margin_ms=margin_ms,
            renew_due_ms=registered_at_ms + heartbeat_ms,
            retry_ms=max(50, min(heartbeat_ms // 4, 1000)),
        )

    @property
    def fence_at_ms(self) -> int:
        return self.expires_at_ms - self.margin_ms

    def action(self, now_ms: int) -> TimerAction:
        if now_ms >= self.fence_at_ms:
            return TimerAction.FENCE
        if not self.renewing and now_ms >= self.renew_due_ms:
            return TimerAction.RENEW
        return TimerAction.WAIT

    def next_wakeup_ms(self) -> int:
        """When :meth:`action` may next return something other than WAIT."""
        if self.renewing:
            return self.fence_at_ms
        return min(self.renew_due_ms, self.fence_at_ms)

    def may_write(self, now_ms: int) -> bool:
        """Writes under this worker's leases are allowed only before the self-fence deadline."""
        return now_ms < self.fence_at_ms

    def behind_ms(self, now_ms: int) -> int:
        """How overdue the renewal is (0 while on time): no new connections while it grows."""
        return max(0, now_ms - self.renew_due_ms) if self.renewing else 0

    def renew_started(self) -> None:
        """Mark a renewal in flight (it asks for an expiry one lease after its start)."""
        self.renewing = True

    def renew_succeeded(self, started_ms: int) -> None:
        """The renewal started at ``started_ms`` landed: the lease runs a lease from then."""
        self.renewing = False
        self.expires_at_ms = max(self.expires_at_ms, started_ms + self.lease_ms)
        self.renew_due_ms = started_ms + self.heartbeat_ms

    def renew_failed(self, now_ms: int) -> None:
        """A renewal failed for a reason that may pass (throttling, timeout): try again soon."""
        self.renewing = False
        self.renew_due_ms = now_ms + self.retry_ms


# ============================================================================ checkpoints


def checkpoint_due(
    *, durable: int, persisted: int, last_written_ms: int, now_ms: int, interval_ms: int
) -> bool:
    """Write the checkpoint now? Only when it advanced and ``interval_ms`` has passed since the
    last write: an idle connection writes nothing, a busy one once per interval.

    The interval is the replay window: after a crash the next owner resumes from the last
    written checkpoint, so the upstream must be able to replay that far back (the messages
    table is keyed by seq, so the replay duplicates nothing).

    >>> checkpoint_due(durable=5, persisted=5, last_written_ms=0, now_ms=10**9, interval_ms=1)
    False
    >>> checkpoint_due(durable=6, persisted=5, last_written_ms=0, now_ms=600, interval_ms=600)
    True
    """
    return durable > persisted and now_ms - last_written_ms >= interval_ms


@dataclass(frozen=True)
class BreakerVerdict:
    """The crash-loop breaker's answer for one more failure of a connection.

    ``count`` failures have now been counted, the last at checkpoint ``at_seq``, the first of
    them at ``since_ms``; ``trip`` means the connection must end FAILED instead of being handed
    to the next worker.
    """

    count: int
    at_seq: int
    trip: bool
    since_ms: int | None = None


def breaker_verdict(
    record: ConnectionRecord,
    checkpoint: int,
    max_failures: int,
    *,
    now_ms: int = 0,
    window_ms: int = 0,
) -> BreakerVerdict:
    """Count one more failure (a crash, a protocol close the worker sent, ...) at ``checkpoint``.

    Two ways to keep counting, so a loop ends whether or not it makes progress:

    * **at one position**: while the checkpoint stands still the same input keeps coming back
      from ``checkpoint + 1``; those failures count up however far apart they are;
    * **within a window**: a failure less than ``window_ms`` after the first one counted
      (``failure_since_ms``) counts up too, even at another position. An upstream that sends
      one new frame and then a poison frame on every connect moves the checkpoint each time;
      the window is what stops it.

    A failure at a new position after the window has passed starts a new count at 1: the
    stream got past whatever failed before and ran a while. ``max_failures <= 0`` turns the
    breaker off (it never trips); ``window_ms <= 0`` counts at one position only.

    >>> rec = ConnectionRecord.new("c", "wss://x", 0).with_changes(
    ...     failure_count=2, failure_seq=7, failure_since_ms=1_000)
    >>> breaker_verdict(rec, 7, 3, now_ms=10**9, window_ms=60_000)
    BreakerVerdict(count=3, at_seq=7, trip=True, since_ms=1000)
    >>> breaker_verdict(rec, 8, 3, now_ms=2_000, window_ms=60_000)
    BreakerVerdict(count=3, at_seq=8, trip=True, since_ms=1000)
    >>> breaker_verdict(rec, 8, 3, now_ms=61_000, window_ms=60_000)
    BreakerVerdict(count=1, at_seq=8, trip=False, since_ms=61000)
    """
    since = record.failure_since_ms
    counting = record.failure_count > 0
    same_position = counting and record.failure_seq == checkpoint
    in_window = (
        counting and since is not None and window_ms > 0 and now_ms - since < window_ms
    )
    if same_position or in_window:
        count = record.failure_count + 1
        since = since if since is not None else now_ms
    else:
        count, since = 1, now_ms
    return BreakerVerdict(count, checkpoint, max_failures > 0 and count >= max_failures, since)


# ============================================================================ planned hand-offs
# Make-before-break (docs/handoff.md sections 2-4): the giver G holds (G, e); the taker T
# opens its own session and buffers; one conditional write moves (G, e) to (T, e + 1).


def handoff_mode(option: HandoffMode | None, *, usable_seq: bool) -> HandoffMode:
    """The mode of one planned move: ``break`` when the connection asks for it, and whenever
    its frames carry no usable seq (two sessions' frames could not be matched and
    deduplicated); else ``overlap`` (the default).

    ``usable_seq``: the giver's session has received a numbered frame.

    >>> handoff_mode(None, usable_seq=True), handoff_mode(None, usable_seq=False)
    (<HandoffMode.OVERLAP: 'overlap'>, <HandoffMode.BREAK: 'break'>)
    >>> handoff_mode(HandoffMode.BREAK, usable_seq=True)
    <HandoffMode.BREAK: 'break'>
    """
    if option is HandoffMode.BREAK or not usable_seq:
        return HandoffMode.BREAK
    return HandoffMode.OVERLAP


def overlap_ready(durable: int, first_seq: int) -> bool:
    """Step 4: the taker's stream (every frame from ``first_seq`` on) overlaps what the giver
    stored (every seq up to ``durable``), so a transfer at ``last_seq = durable`` loses
    nothing: ``first_seq <= durable + 1``.

    >>> overlap_ready(40, 41), overlap_ready(40, 12), overlap_ready(40, 42)
    (True, True, False)
    """
    return first_seq <= durable + 1


def prepared_resume_seq(durable: int, checkpoint: int) -> int:
    """Step 2: the seq a taker's prepared session asks a replaying upstream to start from
    (``from_seq``), given the giver's stored seq in the PREPARE (``durable``) and the
    record's ``checkpoint``.

    The giver's last stored frame itself (``durable``), not the one after it: a replaying
    upstream sends it at once, so the taker's first numbered frame, and so its READY, comes
    with its connect rather than at the stream's next frame (up to a whole frame interval:
    a second at 1 frame/s). That frame overlaps by construction (``first_seq = durable <=
    durable + 1``) and is skipped at adoption (at or below the transferred checkpoint); it
    costs one frame over the wire per move. Never below ``checkpoint + 1`` (nothing stored
    by the giver: the record's resume point, as any session's).

    >>> prepared_resume_seq(40, 12), prepared_resume_seq(0, 12), prepared_resume_seq(13, 12)
    (40, 13, 13)
    """
    return max(checkpoint + 1, durable)


class HandoffStep(StrEnum):
    """What one side of a planned move does next."""

    WAIT = "wait"  # keep going (giver: streaming and storing; taker: buffering)
    TRANSFER = "transfer"  # giver: freeze, quiesce, the one conditional write
    BREAK = "break"  # giver: today's break-before-make (close, release, HANDOFF)
    DECLINE = "decline"  # taker: close what it opened, tell the giver
    ABANDON = "abandon"  # taker: the giver never committed: close, write nothing


@dataclass(frozen=True)
class GiverVerdict:
    step: HandoffStep
    reason: str = ""


def giver_verdict(
    *,
    durable: int,
    first_seq: int | None,
    declined: bool,
    session_live: bool,
    deadline_ms: int,
    now_ms: int,
) -> GiverVerdict:
    """The giver's decision after PREPARE, re-evaluated on every READY, DECLINE, stored
    frame and tick (section 3): ``deadline_ms`` is the prepare bound
    (``HANDOFF_PREPARE_SECONDS`` after PREPARE was sent).

    * DECLINE: break;
    * READY with ``first_seq`` the giver's stored frames reach (:func:`overlap_ready`):
      transfer, even if the giver's own session has ended meanwhile (an upstream that cuts
      the first session when a second opens): the taker holds everything above what the
      giver stored, so the move still loses nothing;
    * the giver's session ended without that (it does not reconnect: that would cut the
      taker, and it cannot catch up any more): break at once;
    * past the bound with no READY (the taker got no numbered frame, could not connect,
      died) or with the giver still below ``first_seq - 1``: break;
    * else wait.

    >>> giver_verdict(durable=9, first_seq=10, declined=False, session_live=True,
    ...               deadline_ms=5_000, now_ms=1_000)
    GiverVerdict(step=<HandoffStep.TRANSFER: 'transfer'>, reason='')
    >>> giver_verdict(durable=9, first_seq=None, declined=False, session_live=True,
    ...               deadline_ms=5_000, now_ms=5_000).reason
    'no_ready'
    """
    if declined:
        return GiverVerdict(HandoffStep.BREAK, "declined")
    if first_seq is not None and overlap_ready(durable, first_seq):
        return GiverVerdict(HandoffStep.TRANSFER)
    if not session_live:
        return GiverVerdict(HandoffStep.BREAK, "giver_session_ended")
    if now_ms >= deadline_ms:
        return GiverVerdict(HandoffStep.BREAK, "no_ready" if first_seq is None else "behind")
    return GiverVerdict(HandoffStep.WAIT)


@dataclass(frozen=True)
class TakerVerdict:
    step: HandoffStep
    reason: str = ""


def taker_verdict(
    *,
    buffered_frames: int,
    buffered_bytes: int,
    max_frames: int,
    max_bytes: int,
    deadline_ms: int,
    now_ms: int,
) -> TakerVerdict:
    """The taker's decision while it buffers, before COMMIT: the buffer is bounded in frames
    and bytes (over either: DECLINE, the giver breaks), and the wait for COMMIT by
    ``deadline_ms`` (past it: ABANDON; the taker never owned, so it closes and writes nothing;
    if a transfer named it after all, the move's delayed hint copy and its own sweep treat the
    connection as one it owns without a session).

    >>> taker_verdict(buffered_frames=5, buffered_bytes=100, max_frames=5, max_bytes=10**6,
    ...               deadline_ms=9, now_ms=0)
    TakerVerdict(step=<HandoffStep.DECLINE: 'decline'>, reason='budget')
    """
    if buffered_frames >= max_frames or buffered_bytes >= max_bytes:
        return TakerVerdict(HandoffStep.DECLINE, "budget")
    if now_ms >= deadline_ms:
        return TakerVerdict(HandoffStep.ABANDON, "no_commit")
    return TakerVerdict(HandoffStep.WAIT)


def prepare_confirmed(
    record: ConnectionRecord | None, pk: str, epoch: int, giver: str
) -> bool:
    """Step 2: a PREPARE is backed by the record (read consistently): STARTED, held by the
    giver it names under the epoch it names, and not set to ``break``. A stale or forged
    PREPARE fails here, and the taker opens nothing.

    >>> rec = ConnectionRecord(pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="",
    ...                        lease_owner="g", lease_epoch=3)
    >>> prepare_confirmed(rec, "CONN#a", 3, "g"), prepare_confirmed(rec, "CONN#a", 2, "g")
    (True, False)
    """
    return (
        record is not None
        and record.pk == pk
        and record.desired_state is DesiredState.STARTED
        and record.lease_owner == giver
        and record.lease_epoch == epoch
        and record.upstream.handoff is not HandoffMode.BREAK
    )


def commit_confirmed(record: ConnectionRecord | None, taker: str, epoch: int) -> bool:
    """Step 7: the transfer landed: the record (read consistently) names the taker under the
    epoch the COMMIT names, STARTED. A COMMIT alone proves nothing (queue bodies are hostile).

    >>> rec = ConnectionRecord(pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="",
    ...                        lease_owner="t", lease_epoch=4)
    >>> commit_confirmed(rec, "t", 4), commit_confirmed(rec, "t", 3), commit_confirmed(None, "t", 4)
    (True, False, False)
    """
    return (
        record is not None
        and record.desired_state is DesiredState.STARTED
        and record.lease_owner == taker
        and record.lease_epoch == epoch
    )
