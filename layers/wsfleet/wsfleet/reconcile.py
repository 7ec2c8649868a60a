"""Reconcile pass planning (lease model v2): which workers' connections to hint and when, which
free connections lost their hint, which dead workers' items and queues may go.

This is the reconciler's functional core. It reads no clock and does no I/O: the Lambda
(``functions/reconciler/app.py``) reads the worker items and two cold indexes, feeds the
results in with ``now_ms``, and carries out the plan that comes back.

Why workers, not connections
    A connection is alive while its owner's worker lease is (:mod:`wsfleet.lease`), so the
    only thing that can expire is a worker. A pass reads every worker item (gsi_workers, then
    BatchGetItem) and asks the connection indexes only about the few workers that need it and
    about connections that have been free for a while; it never reads all connections, so its
    cost follows the number of workers and orphans, not the size of the fleet.

Worker hints (:func:`plan_worker_hints`)
    * a worker whose lease **expired** (``expires_at_ms < now``), or that is **dead**
      (``dead_at_ms`` set: killed by a peer, or retired) and still owns connections: every
      connection it owns gets a hint with no delay;
    * a worker whose lease ends **before the horizon** (``now + pass interval``, where the next
      pass looks again): its connections get hints delayed to land in the last second before
      the expiry (:func:`wsfleet.lease.hint_delay_seconds`; the receiving worker waits out the
      rest, :func:`wsfleet.lease.takeover_verdict`), so a crashed worker's connections are
      taken one lease (+ 1 s) after its last renewal, not a lease plus a pass.

    No flooding: the hints of one worker are claimed with one conditional write per lease
    expiry (:meth:`wsfleet.store.LeaseStore.claim_worker_hints`) and sent again only after
    :func:`rehint_after_ms`.

Free connections (:func:`plan_unowned`)
    A STARTED connection without an owner sits in gsi_unowned since it became free. Whoever
    freed it sent a hint (the router at START, the releaser at a hand-off), so the reconciler
    hints only connections free for longer than :func:`unowned_grace_ms`: their hint was most
    likely lost. Each is claimed once per free spell (:meth:`LeaseStore.claim_hint`).

The ledger
    :class:`HintLedger` remembers what this process claimed, so a warm reconciler does not
    repeat the claim write for every pending worker or free connection on every pass;
    DynamoDB's claim stays the arbiter between concurrent or cold reconcilers.

Orphan age
    ``OldestOrphanAgeMs`` is how long a connection has gone without a live owner: for a free
    one ``now - unowned_since_ms``; for one owned by an expired or dead worker
    ``now - worker.expires_at_ms`` (:func:`worker_ended_at_ms`).

Dead workers (:func:`judge_worker_item`, :func:`judge_control_queue`)
    A worker item goes only when its lease ended more than :func:`dead_worker_grace_ms` ago
    *and* gsi_owner shows it owns nothing: a missing owner item reads as "take it" to a peer,
    but the reconciler finds a dead worker's connections through that item, so it must outlive
    them. Its control queue goes with it. A control queue whose worker item is gone (or names
    another queue) is deleted once it is older than the grace (a worker creates its queue
    before it writes its item).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from .control import queue_name_of
from .lease import hint_delay_seconds
from .record import DesiredState, WorkerRecord

__all__ = [
    "DEFAULT_REHINT_FLOOR_MS",
    "NEEDS_OWNER",
    "CleanupAction",
    "CleanupPlan",
    "ControlQueue",
    "FreeEntry",
    "HintLedger",
    "QueueVerdict",
    "UnownedPlan",
    "WorkerHint",
    "WorkerHintKind",
    "WorkerHintPlan",
    "WorkerVerdict",
    "dead_worker_grace_ms",
    "judge_control_queue",
    "judge_worker_item",
    "next_pass_at_ms",
    "plan_cleanup",
    "plan_unowned",
    "plan_worker_cleanup",
    "plan_worker_hints",
    "rehint_after_ms",
    "should_run_another_pass",
    "unowned_grace_ms",
    "worker_ended_at_ms",
]

#: A hint that found nobody is re-sent after at least this long.
DEFAULT_REHINT_FLOOR_MS = 60_000
#: Desired states that still need an owner. A STOPPED or FAILED connection a dead worker still
#: names cannot be acquired by anyone, so it is neither hinted nor keeps its owner's item.
NEEDS_OWNER = (DesiredState.STARTED, None)


# ============================================================================ timing rules


def rehint_after_ms(
    visibility_timeout_seconds: float, *, floor_ms: int = DEFAULT_REHINT_FLOOR_MS
) -> int:
    """How long a claimed hint counts as pending before the reconciler may hint again.

    A delivered hint is invisible to other consumers for the queue's visibility timeout while
    a worker tries to acquire; a worker that dies mid-acquire makes it visible again after
    that. Twice the visibility timeout (at least ``floor_ms``) leaves room for one redelivery
    before a fresh hint is added, so a hint that *is* being worked on is never doubled, while a
    lost hint (never sent, or dropped) still gets a successor.

    >>> rehint_after_ms(30)
    60000
    >>> rehint_after_ms(45)
    90000
    """
    return max(floor_ms, int(2 * visibility_timeout_seconds * 1000))


def unowned_grace_ms(pass_interval_ms: int) -> int:
    """How long a STARTED connection may be free before the reconciler hints it: one pass.

    Its first hint came from whoever freed it (the router right after START, the releaser right
    after a release) and is normally acted on within a second. A connection still free a whole
    pass later has most likely lost that hint (a failed send, a releaser that crashed in
    between), so a lost hint costs at most two pass intervals (20 s by default, about the
    crash failover time). Longer graces delay that; shorter ones double hints that are merely
    queued. Being wrong costs one extra hint per connection and free spell (the claim).

    >>> unowned_grace_ms(10_000)
    10000
    """
    return pass_interval_ms


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


# ============================================================================ the ledger


class HintLedger:
    """The hint claims this process made, so a pass does not re-claim them every time.

    Keyed by item key (``WORKER#<id>`` for a worker's hints, ``CONN#<id>`` for a free
    connection) and a *version*: the worker's ``expires_at_ms``, or the connection's
    ``unowned_since_ms``. A worker that renewed, or a connection freed again, is a new version
    and is not suppressed. An entry stops counting ``rehint_after_ms`` after the claim, like
    the claim in DynamoDB. It is an optimisation only: forgetting (a cold start) costs one
    refused claim write, never a duplicate hint.

    A claim whose hints could not all be sent is remembered as *owed* (``sent=False``): the
    claim in DynamoDB is still ours, so the next pass sends that worker's hints again without
    a new claim (which DynamoDB would refuse until the claim is stale). A cold container does
    not know it owes them; they then go out once that claim is stale (``rehint_after_ms``).

    :param rehint_after_ms: age at which an entry stops counting (see :func:`rehint_after_ms`).
    :param max_entries: memory bound; the oldest entries are dropped beyond it.
    """

    def __init__(self, rehint_after_ms: int, *, max_entries: int = 200_000) -> None:
        if rehint_after_ms <= 0:
            raise ValueError("rehint_after_ms must be positive")
        self.rehint_after_ms = rehint_after_ms
        self.max_entries = max_entries
        self._claims: dict[str, tuple[int, int, bool]] = {}  # key -> (version, at, sent)

    def __len__(self) -> int:
        return len(self._claims)

    def _fresh(self, key: str, version: int, now_ms: int) -> tuple[int, int, bool] | None:
        entry = self._claims.get(key)
        if entry is None or entry[0] != version or now_ms - entry[1] >= self.rehint_after_ms:
            return None
        return entry

    def is_pending(self, key: str, version: int, now_ms: int) -> bool:
        """Hints for exactly this version were claimed and sent recently enough to count."""
        entry = self._fresh(key, version, now_ms)
        return entry is not None and entry[2]

    def is_owed(self, key: str, version: int, now_ms: int) -> bool:
        """We hold a fresh claim for this version whose hints were not all sent."""
        entry = self._fresh(key, version, now_ms)
        return entry is not None and not entry[2]

    def remember(self, key: str, version: int, now_ms: int, *, sent: bool = True) -> None:
        """Note a claim (ours, or one DynamoDB says someone else made: ``sent`` then)."""
        previous = self._claims.pop(key, None)  # re-insert at the end: dict order = claim order
        claimed_at = now_ms
        if previous is not None and previous[0] == version and not previous[2]:
            claimed_at = previous[1]  # settling an owed claim: it still dates from the claim
        self._claims[key] = (version, claimed_at, sent)
        if len(self._claims) > self.max_entries:
            for stale in list(self._claims)[: len(self._claims) - self.max_entries]:
                del self._claims[stale]

    def forget(self, key: str) -> None:
        self._claims.pop(key, None)

    def prune(self, now_ms: int) -> int:
        """Drop entries too old to suppress anything; returns how many were dropped."""
        stale = [
            key
            for key, (_, claimed_at, _) in self._claims.items()
            if now_ms - claimed_at >= self.rehint_after_ms
        ]
        for key in stale:
            del self._claims[key]
        return len(stale)


# ============================================================================ worker hints


def worker_ended_at_ms(worker: WorkerRecord) -> int:
    """When a worker's lease ended (or ends): its expiry, or its death if that came first.

    A peer kills only an expired worker, and a retiring worker and the task exit kill set both
    to the same moment, so this is ``expires_at_ms`` in practice, the attribute the store's
    delete condition checks.
    """
    if worker.dead_at_ms is not None:
        return min(worker.expires_at_ms, worker.dead_at_ms)
    return worker.expires_at_ms


class WorkerHintKind(StrEnum):
    """Why a worker's connections are hinted."""

    EXPIRED = "expired"  # lease lapsed, not (yet) killed: hint now
    DEAD = "dead"  # killed or retired: whatever it still owns is hinted now
    EXPIRING = "expiring"  # lease ends before the next pass: early hint


@dataclass(frozen=True)
class WorkerHint:
    """A worker whose connections a pass should look at.

    ``pending``: this process claimed and sent this expiry's hints recently (the pass still
    reads an orphaned worker's connections for OrphansFound and the janitor, but sends
    nothing). ``owed``: we hold the claim, the sending failed: send without a new claim.
    """

    worker: WorkerRecord
    kind: WorkerHintKind
    pending: bool = False
    owed: bool = False

    @property
    def orphaned(self) -> bool:
        """Its connections have no live owner already (not merely about to lose it)."""
        return self.kind is not WorkerHintKind.EXPIRING

    def delay_seconds(self, now_ms: int) -> int:
        """The hint delay at the moment of sending: 0 for orphans, else the last second."""
        if self.orphaned:
            return 0
        return hint_delay_seconds(self.worker.expires_at_ms, now_ms)

    def orphan_age_ms(self, now_ms: int) -> int:
        """How long its connections have been without a live owner (0 while it lives)."""
        if not self.orphaned:
            return 0
        return max(0, now_ms - worker_ended_at_ms(self.worker))


@dataclass(frozen=True)
class WorkerHintPlan:
    """The workers of one pass to look at, most urgent first: orphaned ones by how long ago
    their lease ended, then the expiring ones by how soon."""

    hints: tuple[WorkerHint, ...] = ()
    workers_seen: int = 0
    expired: int = 0
    dead: int = 0
    expiring: int = 0


def _hint_kind(worker: WorkerRecord, now_ms: int, horizon_ms: int) -> WorkerHintKind | None:
    if worker.dead:
        return WorkerHintKind.DEAD
    if worker.expires_at_ms < now_ms:
        return WorkerHintKind.EXPIRED
    if worker.expires_at_ms < horizon_ms:
        return WorkerHintKind.EXPIRING
    return None


def plan_worker_hints(
    workers: Iterable[WorkerRecord],
    *,
    now_ms: int,
    horizon_ms: int,
    ledger: HintLedger | None = None,
) -> WorkerHintPlan:
    """Pick the workers whose connections need hints (see the module docstring).

    A worker whose lease ends exactly at the horizon is left to the next pass, which starts
    then. A live worker renewing every heartbeat never shows up here: its lease always ends
    more than ``lease - heartbeat`` ahead, and the pass interval is shorter than that
    (:meth:`wsfleet.settings.Settings.check_reconcile_pass`).

    >>> w = WorkerRecord(worker_id="w", control_queue_url="", started_at_ms=0,
    ...                  heartbeat_at_ms=0, expires_at_ms=12_500)
    >>> (hint,) = plan_worker_hints([w], now_ms=10_000, horizon_ms=20_000).hints
    >>> hint.kind.value, hint.delay_seconds(10_000)
    ('expiring', 2)
    """
    hints: list[WorkerHint] = []
    seen = 0
    counts = dict.fromkeys(WorkerHintKind, 0)
    for worker in workers:
        seen += 1
        kind = _hint_kind(worker, now_ms, horizon_ms)
        if kind is None:
            continue
        counts[kind] += 1
        version = worker.expires_at_ms
        pending = ledger is not None and ledger.is_pending(worker.pk, version, now_ms)
        owed = ledger is not None and ledger.is_owed(worker.pk, version, now_ms)
        hints.append(WorkerHint(worker, kind, pending, owed))
    hints.sort(key=lambda h: (not h.orphaned, worker_ended_at_ms(h.worker), h.worker.worker_id))
    return WorkerHintPlan(
        tuple(hints),
        seen,
        counts[WorkerHintKind.EXPIRED],
        counts[WorkerHintKind.DEAD],
        counts[WorkerHintKind.EXPIRING],
    )


# ============================================================================ free connections


class FreeEntry(Protocol):
    """A connection as gsi_unowned shows it (:class:`wsfleet.store.IndexEntry` is one)."""

    @property
    def pk(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def unowned_since_ms(self) -> int | None: ...


E = TypeVar("E", bound=FreeEntry)


@dataclass(frozen=True)
class UnownedPlan(Generic[E]):
    """What the free-connection half of a pass should claim (in query order, cut at the
    budget; the rest are counted in ``deferred`` and picked up by the next pass)."""

    candidates: tuple[E, ...] = ()
    found: int = 0
    already_pending: int = 0
    deferred: int = 0
    oldest_age_ms: int = 0


def plan_unowned(
    entries: Iterable[E],
    *,
    now_ms: int,
    grace_ms: int,
    ledger: HintLedger | None = None,
    max_hints: int | None = None,
) -> UnownedPlan[E]:
    """Turn gsi_unowned entries into hint candidates: free for longer than ``grace_ms`` and
    not claimed by this process recently. (The query already asks for ``since < now - grace``;
    the check here keeps the plan right whatever it is given.)
    """
    candidates: list[E] = []
    found = pending = deferred = oldest = 0
    for entry in entries:
        since = entry.unowned_since_ms
        if since is None or now_ms - since <= grace_ms:
            continue
        found += 1
        oldest = max(oldest, now_ms - since)
        if ledger is not None and ledger.is_pending(entry.pk, since, now_ms):
            pending += 1
            continue
        if max_hints is not None and len(candidates) >= max_hints:
            deferred += 1
            continue
        candidates.append(entry)
    return UnownedPlan(tuple(candidates), found, pending, deferred, oldest)


# ============================================================================ dead workers


def dead_worker_grace_ms(lease_ms: int) -> int:
    """How long past its lease's end (or its queue's creation) a worker counts as gone.

    Two leases: by then every peer has seen the lease lapse and, with the self-fence, its
    sockets are long closed, so deleting its control queue cannot lose a STOP that mattered,
    and a paused worker that comes back finds itself dead rather than deleted.
    """
    return 2 * lease_ms


class WorkerVerdict(StrEnum):
    """What to do with one worker item."""

    KEEP = "keep"  # alive, or ended less than the grace ago
    CHECK_OWNED = "check_owned"  # past the grace: ask gsi_owner whether it owns anything
    DELETE = "delete"  # past the grace and owns nothing: delete it (and its control queue)


def judge_worker_item(
    worker: WorkerRecord, *, now_ms: int, grace_ms: int, owns_connections: bool | None = None
) -> WorkerVerdict:
    """A worker item is deleted only when its lease ended more than ``grace_ms`` ago AND it
    owns no connection (``owns_connections``; None: not known yet -> CHECK_OWNED).

    Its connections are found through it (the reconciler lists them by owner once it sees the
    lease has lapsed), so the item must outlive them.

    >>> w = WorkerRecord(worker_id="w", control_queue_url="", started_at_ms=0,
    ...                  heartbeat_at_ms=0, expires_at_ms=1_000)
    >>> [judge_worker_item(w, now_ms=n, grace_ms=500, owns_connections=o).value
    ...  for n, o in ((1_500, False), (1_501, None), (1_501, True), (1_501, False))]
    ['keep', 'check_owned', 'keep', 'delete']
    """
    if worker_ended_at_ms(worker) + grace_ms >= now_ms:
        return WorkerVerdict.KEEP
    if owns_connections is None:
        return WorkerVerdict.CHECK_OWNED
    return WorkerVerdict.KEEP if owns_connections else WorkerVerdict.DELETE


def plan_worker_cleanup(
    workers: Iterable[WorkerRecord], *, now_ms: int, grace_ms: int, max_deletions: int
) -> tuple[tuple[WorkerRecord, ...], int]:
    """The worker items past the grace, longest gone first, at most ``max_deletions`` (the
    rest wait a pass); returns them and how many were deferred."""
    gone = sorted(
        (
            w
            for w in workers
            if judge_worker_item(w, now_ms=now_ms, grace_ms=grace_ms) is not WorkerVerdict.KEEP
        ),
        key=lambda w: (worker_ended_at_ms(w), w.worker_id),
    )
    return tuple(gone[:max_deletions]), max(0, len(gone) - max_deletions)


@dataclass(frozen=True)
class ControlQueue:
    """A control queue as the reconciler sees it.

    :param worker_id: from the queue's worker-id tag (or the name, see
        :func:`wsfleet.control.worker_id_from_queue_name`); None when it cannot be told.
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

    KEEP = "keep"  # its worker item names it (it goes with the item), or it may be starting
    NEED_AGE = "need_age"  # no worker item names it: decide once the queue's age is known
    DELETE_QUEUE = "delete_queue"  # nobody owns it and it is older than the grace


@dataclass(frozen=True)
class CleanupAction:
    """Delete the leftover control queue ``queue_url``."""

    queue_url: str
    verdict: QueueVerdict


def judge_control_queue(
    queue: ControlQueue,
    worker: WorkerRecord | None,
    *,
    now_ms: int,
    grace_ms: int,
) -> QueueVerdict:
    """Decide one control queue's fate from its worker item.

    * Worker item present and its queue is this one: KEEP. The queue is deleted together with
      the item (:func:`judge_worker_item`), never before: the item may have to outlive its
      lease while its connections are taken over.
    * Worker item present but naming another queue, or no worker item (or no worker id): the
      worker may be between creating its queue and writing its item, so the queue is deleted
      only once it is older than ``grace_ms``; NEED_AGE asks the caller to look up the
      creation time first.
    """
    if worker is not None and queue_name_of(worker.control_queue_url) == queue.name:
        return QueueVerdict.KEEP
    if queue.created_at_ms is None:
        return QueueVerdict.NEED_AGE
    if queue.created_at_ms + grace_ms < now_ms:
        return QueueVerdict.DELETE_QUEUE
    return QueueVerdict.KEEP


@dataclass(frozen=True)
class CleanupPlan:
    """The queue deletions of one pass and the queues whose age must be looked up first."""

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
            actions.append(CleanupAction(queue.url, verdict))
    return CleanupPlan(tuple(actions), tuple(need_age), kept, deferred)
