"""Reconcile pass planning: which connections get a hint and when, which workers are dead.

This is the reconciler's functional core. It reads no clock and does no I/O: the Lambda
(``functions/reconciler/app.py``) queries DynamoDB and lists SQS queues, feeds the results in
with ``now_ms``, and carries out the plan that comes back.

Hints
    A pass reads every STARTED connection whose lease expires before the *horizon*
    (``now + pass interval``, the moment the next pass will look again):

    * **orphans** (``lease_expires_at_ms < now``) get a hint with no delay;
    * leases **expiring before the horizon** get a hint delayed to land in the last second
      before the expiry (:func:`wsfleet.lease.hint_delay_seconds`; the receiving worker waits
      out the rest), so a crashed worker's connections are picked up one lease after the
      crash rather than one lease plus one pass.

    No flooding: a hint is *claimed* in DynamoDB once per ``(pk, lease expiry)``
    (:meth:`wsfleet.store.LeaseStore.claim_hint`) before it is sent, and is sent again only
    after :func:`rehint_after_ms`. The :class:`HintLedger` remembers what this process already
    claimed, so a warm reconciler does not repeat the claim write for every pending orphan on
    every pass; DynamoDB stays the arbiter between concurrent reconcilers.

Orphan age
    ``OldestOrphanAgeMs`` measures how long a connection has gone without an owner. For an
    expired lease that is ``now - lease_expires_at_ms``. A free lease (never acquired, or
    released) has expiry 0, which would read as "orphaned since 1970"; its age is measured from
    ``updated_at_ms`` instead (set by START, restart and release, i.e. the moment it became
    free), falling back to ``created_at_ms``.

Dead workers
    Every worker owns a control queue ``<prefix><worker id>`` tagged with its worker id and a
    worker item with a heartbeat-renewed ``expires_at_ms``. A worker that crashed leaves both
    behind. :func:`judge_control_queue` decides, per queue, whether to keep it or delete it
    (and the worker item), with a grace period so a worker that is still starting up (queue
    created, item not yet written) or briefly paused is never cleaned up under its feet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .hints import Hint
from .lease import hint_delay_seconds, is_expired, is_worker_alive, will_expire_before
from .record import ConnectionRecord, WorkerRecord

__all__ = [
    "DEFAULT_REHINT_FLOOR_MS",
    "CleanupAction",
    "CleanupPlan",
    "ControlQueue",
    "HintCandidate",
    "HintLedger",
    "HintPlan",
    "QueueVerdict",
    "dead_worker_grace_ms",
    "judge_control_queue",
    "next_pass_at_ms",
    "orphan_age_ms",
    "orphan_since_ms",
    "plan_cleanup",
    "plan_hints",
    "queue_name_of",
    "rehint_after_ms",
    "should_run_another_pass",
    "worker_id_from_queue_name",
]

#: A hint that found nobody is re-sent after at least this long.
DEFAULT_REHINT_FLOOR_MS = 60_000


# ============================================================================ hint planning


def rehint_after_ms(
    visibility_timeout_seconds: float, *, floor_ms: int = DEFAULT_REHINT_FLOOR_MS
) -> int:
    """How long a claimed hint counts as pending before the reconciler may hint again.

    A delivered hint is invisible to other consumers for the queue's visibility timeout while
    a worker tries to acquire; a worker that dies mid-acquire makes it visible again after
    that. Twice the visibility timeout (at least ``floor_ms``) leaves room for one redelivery
    before a fresh hint is added, so a hint that *is* being worked on is never doubled, while a
    lost hint (dropped by a worker that got it too early, or never sent) still gets a successor.

    >>> rehint_after_ms(30)
    60000
    >>> rehint_after_ms(45)
    90000
    """
    return max(floor_ms, int(2 * visibility_timeout_seconds * 1000))


def orphan_since_ms(record: ConnectionRecord) -> int:
    """When the connection lost (or never had) an owner; see the module docstring."""
    if record.lease_expires_at_ms > 0:
        return record.lease_expires_at_ms
    return record.updated_at_ms or record.created_at_ms


def orphan_age_ms(record: ConnectionRecord, now_ms: int) -> int:
    """How long an orphan has been without an owner (0 for a lease that is still live)."""
    if not is_expired(record, now_ms):
        return 0
    return max(0, now_ms - orphan_since_ms(record))


class HintLedger:
    """The hints this process already claimed, so a pass does not re-claim them every time.

    Keyed by pk; an entry matches while the connection still shows the same lease expiry and
    epoch it had when claimed and the claim is younger than ``rehint_after_ms``. It is an
    optimisation only: forgetting (a cold start) costs one refused claim write per pending
    orphan, never a duplicate hint, because :meth:`LeaseStore.claim_hint` decides.

    :param rehint_after_ms: age at which an entry stops counting (see :func:`rehint_after_ms`).
    :param max_entries: memory bound; the oldest entries are dropped beyond it.
    """

    def __init__(self, rehint_after_ms: int, *, max_entries: int = 200_000) -> None:
        if rehint_after_ms <= 0:
            raise ValueError("rehint_after_ms must be positive")
        self.rehint_after_ms = rehint_after_ms
        self.max_entries = max_entries
        self._claims: dict[str, tuple[int, int, int]] = {}  # pk -> (expiry, epoch, claimed_at)

    def __len__(self) -> int:
        return len(self._claims)

    def is_pending(self, record: ConnectionRecord, now_ms: int) -> bool:
        """A hint for exactly this lease was claimed recently enough to still be pending."""
        entry = self._claims.get(record.pk)
        if entry is None:
            return False
        expiry, epoch, claimed_at = entry
        return (
            expiry == record.lease_expires_at_ms
            and epoch == record.lease_epoch
            and now_ms - claimed_at < self.rehint_after_ms
        )

    def remember(self, record: ConnectionRecord, now_ms: int) -> None:
        """Note a claim for this lease (ours, or one DynamoDB says someone else made)."""
        self._claims.pop(record.pk, None)  # re-insert at the end: dict order = claim order
        self._claims[record.pk] = (record.lease_expires_at_ms, record.lease_epoch, now_ms)
        if len(self._claims) > self.max_entries:
            for pk in list(self._claims)[: len(self._claims) - self.max_entries]:
                del self._claims[pk]

    def forget(self, pk: str) -> None:
        self._claims.pop(pk, None)

    def prune(self, now_ms: int) -> int:
        """Drop entries too old to suppress anything; returns how many were dropped."""
        stale = [
            pk
            for pk, (_, _, claimed_at) in self._claims.items()
            if now_ms - claimed_at >= self.rehint_after_ms
        ]
        for pk in stale:
            del self._claims[pk]
        return len(stale)


@dataclass(frozen=True)
class HintCandidate:
    """A connection a pass wants to hint: claim it, then send ``hint``."""

    record: ConnectionRecord
    hint: Hint
    orphan: bool  # expired now (delay 0) rather than expiring before the horizon


@dataclass(frozen=True)
class HintPlan:
    """What one pass found and what it should claim and send.

    ``candidates`` are in query order (oldest expiry first) and cut at ``max_hints``; the rest
    are counted in ``deferred`` and picked up by the next pass.
    """

    candidates: tuple[HintCandidate, ...] = ()
    orphans_found: int = 0
    expiring_found: int = 0
    already_pending: int = 0
    deferred: int = 0
    oldest_orphan_age_ms: int = 0


def plan_hints(
    records: Iterable[ConnectionRecord],
    *,
    now_ms: int,
    horizon_ms: int,
    ledger: HintLedger | None = None,
    max_hints: int | None = None,
) -> HintPlan:
    """Turn the records of an orphan query into hint candidates.

    Records that are not STARTED or whose lease outlives ``horizon_ms`` are ignored (the GSI
    query should not return them; this keeps the plan right whatever it is given). Orphans
    get ``delay_seconds=0``; leases expiring before the horizon get a delay that lands just
    after their expiry. The hint carries the epoch the pass saw, so a worker can tell a hint
    for a lease that has since been re-acquired.

    >>> from wsfleet.record import ConnectionRecord
    >>> r = ConnectionRecord.new("a", "wss://x", 0).with_changes(lease_expires_at_ms=12_500)
    >>> plan_hints([r], now_ms=10_000, horizon_ms=20_000).candidates[0].hint.delay_seconds
    3
    """
    candidates: list[HintCandidate] = []
    orphans = expiring = pending = deferred = oldest = 0
    for record in records:
        if not will_expire_before(record, horizon_ms):
            continue
        orphan = is_expired(record, now_ms)
        if orphan:
            orphans += 1
            oldest = max(oldest, orphan_age_ms(record, now_ms))
        else:
            expiring += 1
        if ledger is not None and ledger.is_pending(record, now_ms):
            pending += 1
            continue
        if max_hints is not None and len(candidates) >= max_hints:
            deferred += 1
            continue
        delay = 0 if orphan else hint_delay_seconds(record, now_ms)
        candidates.append(HintCandidate(record, Hint(record.pk, record.lease_epoch, delay), orphan))
    return HintPlan(tuple(candidates), orphans, expiring, pending, deferred, oldest)


# ============================================================================ pass timing


def next_pass_at_ms(first_pass_at_ms: int, interval_ms: int, now_ms: int) -> int:
    """The next slot on the pass grid strictly after ``now_ms``.

    Passes run on a fixed grid (first, first + interval, ...) rather than "interval after the
    previous pass ended", so the early-hint horizon of one pass (``now + interval``) is where
    the next pass really starts. A pass that overran skips the slots it missed.

    >>> next_pass_at_ms(0, 10_000, 3_000), next_pass_at_ms(0, 10_000, 25_000)
    (10000, 30000)
    """
    if interval_ms <= 0:
        raise ValueError("interval_ms must be positive")
    elapsed = max(0, now_ms - first_pass_at_ms)
    return first_pass_at_ms + (elapsed // interval_ms + 1) * interval_ms


def should_run_another_pass(
    *, remaining_ms: int, wait_ms: int, expected_pass_ms: int, margin_ms: int
) -> bool:
    """Whether a pass starting in ``wait_ms`` would finish ``margin_ms`` before the timeout.

    >>> should_run_another_pass(remaining_ms=15_000, wait_ms=9_000, expected_pass_ms=500,
    ...                         margin_ms=3_000)
    True
    >>> should_run_another_pass(remaining_ms=11_000, wait_ms=9_000, expected_pass_ms=500,
    ...                         margin_ms=3_000)
    False
    """
    return remaining_ms - wait_ms - expected_pass_ms >= margin_ms


# ============================================================================ dead workers


def dead_worker_grace_ms(lease_ms: int) -> int:
    """How long past its item's expiry (or its queue's creation) a worker counts as dead.

    Two leases: by then every lease the worker held has expired and, with the self-fence,
    its sockets are closed, so deleting its control queue can no longer lose a STOP that
    mattered.
    """
    return 2 * lease_ms


def queue_name_of(queue_url: str) -> str:
    """The queue name, i.e. the last path segment of its URL (hosts differ across endpoints).

    >>> queue_name_of("https://sqs.eu-west-1.amazonaws.com/123456789012/app-ctl-w1")
    'app-ctl-w1'
    """
    return queue_url.rstrip("/").rsplit("/", 1)[-1]


def worker_id_from_queue_name(prefix: str, queue_name: str) -> str | None:
    """Best-effort worker id for a control queue without the worker-id tag.

    Exact for ids made only of ``[A-Za-z0-9_-]`` (``control_queue_name`` rewrites other
    characters), which is why the tag is the primary source.
    """
    if not queue_name.startswith(prefix) or len(queue_name) == len(prefix):
        return None
    return queue_name[len(prefix) :]


@dataclass(frozen=True)
class ControlQueue:
    """A control queue as the reconciler sees it.

    :param worker_id: from the queue's worker-id tag (or the name, see
        :func:`worker_id_from_queue_name`); None when it cannot be told.
    :param created_at_ms: the queue's CreatedTimestamp, None when not (yet) known.
    """

    url: str
    worker_id: str | None
    created_at_ms: int | None = None

    @property
    def name(self) -> str:
        return queue_name_of(self.url)


class QueueVerdict(StrEnum):
    """What to do with one control queue."""

    KEEP = "keep"  # its worker is alive, or may still be starting
    NEED_AGE = "need_age"  # no live owner found: decide once the queue's age is known
    DELETE_WORKER = "delete_worker"  # worker expired long ago: delete its queue and its item
    DELETE_QUEUE = "delete_queue"  # nobody owns it any more: delete the queue only


@dataclass(frozen=True)
class CleanupAction:
    """Delete ``queue_url``; also delete the item of ``worker_id`` when it is set."""

    queue_url: str
    worker_id: str | None
    verdict: QueueVerdict


def judge_control_queue(
    queue: ControlQueue,
    worker: WorkerRecord | None,
    *,
    now_ms: int,
    grace_ms: int,
) -> QueueVerdict:
    """Decide one control queue's fate from its worker item.

    * Worker item present and its queue is this one: alive (or expired less than
      ``grace_ms`` ago) -> KEEP; expired longer -> DELETE_WORKER.
    * Worker item present but naming another queue: this queue is a leftover -> judged by
      age like an unowned queue (the item belongs to whatever that other queue is).
    * No worker item (or no worker id): the worker may be between creating its queue and
      writing its item, so the queue is deleted only once it is older than ``grace_ms``;
      NEED_AGE asks the caller to look up the creation time first.
    """
    owns_queue = worker is not None and queue_name_of(worker.control_queue_url) == queue.name
    if worker is not None and owns_queue:
        if is_worker_alive(worker, now_ms - grace_ms):
            return QueueVerdict.KEEP
        return QueueVerdict.DELETE_WORKER
    if queue.created_at_ms is None:
        return QueueVerdict.NEED_AGE
    if queue.created_at_ms + grace_ms < now_ms:
        return QueueVerdict.DELETE_QUEUE
    return QueueVerdict.KEEP


@dataclass(frozen=True)
class CleanupPlan:
    """The deletions of one pass and the queues whose age must be looked up first."""

    actions: tuple[CleanupAction, ...] = ()
    need_age: tuple[ControlQueue, ...] = ()
    kept: int = 0
    deferred: int = 0


def plan_cleanup(
    queues: Sequence[ControlQueue],
    workers: Mapping[str, WorkerRecord],
    *,
    now_ms: int,
    grace_ms: int,
    max_deletions: int,
) -> CleanupPlan:
    """Judge every queue; keep at most ``max_deletions`` deletions (the rest wait a pass)."""
    actions: list[CleanupAction] = []
    need_age: list[ControlQueue] = []
    kept = deferred = 0
    for queue in queues:
        worker = workers.get(queue.worker_id) if queue.worker_id else None
        verdict = judge_control_queue(queue, worker, now_ms=now_ms, grace_ms=grace_ms)
        if verdict is QueueVerdict.KEEP:
            kept += 1
        elif verdict is QueueVerdict.NEED_AGE:
            need_age.append(queue)
        elif len(actions) >= max_deletions:
            deferred += 1
        else:
            item_owner = queue.worker_id if verdict is QueueVerdict.DELETE_WORKER else None
            actions.append(CleanupAction(queue.url, item_owner, verdict))
    return CleanupPlan(tuple(actions), tuple(need_age), kept, deferred)
