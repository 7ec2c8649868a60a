"""Reconciler Lambda (lease model v2): hint the connections of lapsed workers, early, once;
re-hint free connections whose hint was lost; clean up after dead workers.

EventBridge Scheduler invokes this once a minute (its finest rate). One invocation then runs a
reconcile pass every ``RECONCILE_PASS_SECONDS`` until the remaining time is too short for
another, so crash recovery costs about one lease, not a lease plus a minute.

A pass (the planning rules live in :mod:`wsfleet.reconcile`, this module only does the I/O).
With W workers, of which X expired, died or lapse before the next pass, and O orphaned
connections (owned by those X, or free for longer than the grace):

1. **Workers.** ``list_worker_ids`` (gsi_workers, keys only: W/1000 queries) and
   ``get_workers`` (BatchGetItem: W/100 requests). Live workers cost nothing more: their
   connections are never read.
2. **Their connections.** For each of the X workers: ``owned_by`` (gsi_owner: one query per
   1,000 connections it owns). If it still owns STARTED connections, one conditional write
   claims this lease expiry's hints (``claim_worker_hints``; again only after the re-hint
   interval), then SendMessageBatch (one per 10 hints): no delay for an expired or dead worker,
   a delay landing in the lease's last second for one about to lapse (the receiving worker
   waits out the rest and takes over at the expiry).
3. **Free connections.** For each of the 16 shards, ``unowned(shard, now - grace)``
   (gsi_unowned: 16 queries, plus one per 500 entries); each entry is claimed
   (``claim_hint``, one conditional write per free spell) and hinted. A failed send withdraws
   its claim so the next pass tries again.
4. **Dead workers.** A worker item whose lease ended more than two leases ago and that owns
   no STARTED connection (per step 2, or one gsi_owner query) is deleted with its control
   queue; control queues nobody registered are deleted once older than the grace. ListQueues
   (one per 1,000 queues), tags and age looked up once per queue and cached
   (:class:`wsfleet.control_janitor.ControlQueueJanitor`).

5. **Fleet view** (REBALANCE on): the previous ``FLEET#view`` item (one GetItem) and this
   pass's (one PutItem): the live workers' total load, the best free capacity, and the
   rebalancing plan (:func:`wsfleet.rebalance.make_view`; a new plan only once the previous
   one has settled). Every worker reads this one item instead of every worker item.

Requests per pass: ceil(W/1000) + ceil(W/100) + 16 reads, plus about X + O/1000 reads, one
claim write per lapsed worker and per free orphan (once per expiry or free spell) and O/10
sends, whatever the number of connections. A steady fleet (nothing lapsed, no lost hint, up
to 100 workers) makes 18 DynamoDB requests and one ListQueues per pass.

Metrics per pass: WorkersExpired (workers without a live lease that still own connections),
WorkersExpiring (lapsing before the next pass), OrphansFound, HintsSent, HintsFailed,
HintsDeferred, OldestOrphanAgeMs, PassMs, ControlQueuesDeleted, WorkersDeleted,
RebalanceMoves.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import Clock, now_ms
from wsfleet.control_janitor import CleanupReport, ControlQueueJanitor
from wsfleet.exceptions import StoreError
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.lease import is_worker_alive
from wsfleet.rebalance import FleetView, WorkerLoad, make_view
from wsfleet.reconcile import (
    NEEDS_OWNER,
    HintLedger,
    WorkerHint,
    dead_worker_grace_ms,
    next_pass_at_ms,
    plan_unowned,
    plan_worker_hints,
    rehint_after_ms,
    should_run_another_pass,
    unowned_grace_ms as default_unowned_grace_ms,
)
from wsfleet.record import INDEX_SHARDS, WorkerRecord
from wsfleet.settings import Settings
from wsfleet.store import IndexEntry, LeaseStore

__all__ = [
    "HintReport",
    "PassReport",
    "RebalancePolicy",
    "Reconciler",
    "lambda_handler",
    "reconciler",
    "reset_dependencies",
    "run_passes",
    "write_fleet_view",
]

#: The HintQueue's VisibilityTimeout in template.yaml; sets how long a hint counts as pending.
HINT_VISIBILITY_TIMEOUT_SECONDS = 30
#: Stop starting passes when fewer than this many ms would be left after the next one.
TIME_MARGIN_MS = 3_000
#: Parallel claim writes for free connections (DynamoDB latency, not CPU, bounds them).
CLAIM_THREADS = 8
#: Hints claimed and sent per pass at most. A worker's hints are all sent under one claim, so
#: the last worker of a pass may go over; the rest (newest orphans) wait one pass.
MAX_HINTS_PER_PASS = 10_000

logger = Logger()
metrics = Metrics()
tracer = Tracer()


# ============================================================================ reports


@dataclass(frozen=True)
class HintReport:
    """What the hint half of a pass found and did.

    ``orphans_found``: STARTED connections owned by a worker without a live lease, plus free
    ones past the grace. ``deferred``: workers and free connections left to the next pass by
    the per-pass bound.
    """

    workers_seen: int = 0
    workers_expired: int = 0
    workers_expiring: int = 0
    orphans_found: int = 0
    hints_sent: int = 0
    hints_failed: int = 0
    already_pending: int = 0
    claims_refused: int = 0
    claim_errors: int = 0
    read_errors: int = 0  # index queries that failed (that worker or shard waits a pass)
    deferred: int = 0
    oldest_orphan_age_ms: int = 0
    scan_ms: int = 0  # worker items, index queries and planning
    claim_ms: int = 0
    send_ms: int = 0


@dataclass(frozen=True)
class PassReport:
    started_at_ms: int
    pass_ms: int
    hints: HintReport
    cleanup: CleanupReport
    #: Connections the fleet view written this pass asks to move (0: balanced, or off).
    rebalance_moves: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ============================================================================ rebalancing


@dataclass(frozen=True)
class RebalancePolicy:
    """How the reconciler plans rebalancing (REBALANCE_* settings; None: off).

    ``act_ms``: how long after a plan its moves are carried out at the latest (a worker acts
    on a plan within REBALANCE_SECONDS of it, and a hand-off takes well under the margin).
    """

    max_moves: int
    band_percent: float
    act_ms: int

    #: Added to REBALANCE_SECONDS for the hand-offs themselves (release, hint, acquire), done
    #: a few at a time (wsfleet_worker.rebalancing.HANDOFF_WAVE).
    HANDOFF_MARGIN_MS = 5_000

    @classmethod
    def from_settings(cls, settings: Settings) -> RebalancePolicy | None:
        if not settings.rebalance:
            return None
        return cls(
            max_moves=settings.rebalance_max_moves,
            band_percent=settings.rebalance_band_percent,
            act_ms=int(settings.rebalance_seconds * 1000) + cls.HANDOFF_MARGIN_MS,
        )


def write_fleet_view(
    store: LeaseStore, policy: RebalancePolicy, workers: Mapping[str, WorkerRecord], now: int
) -> FleetView:
    """One read (the previous view) and one write (this pass's): the live workers' loads and
    the plan (:func:`wsfleet.rebalance.make_view`)."""
    live = [w for w in workers.values() if is_worker_alive(w, now)]
    view = make_view(
        [
            WorkerLoad(
                w.worker_id, w.connection_count, w.capacity, w.started_at_ms, w.movable_count
            )
            for w in live
        ],
        now_ms=now,
        queues={w.worker_id: w.control_queue_url for w in live},
        heartbeats={w.worker_id: w.heartbeat_at_ms for w in live},
        previous=store.get_fleet_view(consistent=True),
        band_percent=policy.band_percent,
        max_moves=policy.max_moves,
        act_ms=policy.act_ms,
    )
    store.put_fleet_view(view)
    return view


# ============================================================================ the pass


@dataclass
class _Tally:
    """Counters of one hint pass, filled in by its two halves."""

    workers_expired: int = 0
    orphans: int = 0
    oldest_ms: int = 0
    sent: int = 0
    failed: int = 0
    pending: int = 0
    refused: int = 0
    claim_errors: int = 0
    read_errors: int = 0
    deferred: int = 0
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("scan", "claim", "send"), 0.0)
    )

    def timed(self, phase: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[phase] += now - started
        return now

    def orphans_seen(self, count: int, age_ms: int) -> None:
        self.orphans += count
        if count:
            self.oldest_ms = max(self.oldest_ms, age_ms)


class Reconciler:
    """Runs reconcile passes: worker hints, free-connection hints, then dead-worker cleanup.

    :param store: the connections table.
    :param sender: where hints go.
    :param janitor: dead-worker cleanup, or None to skip it.
    :param pass_interval_ms: time to the next pass; leases ending before then are hinted now.
    :param page_size: page size of the gsi_unowned queries.
    :param ledger: claims this process already made (kept across passes and invocations).
    :param unowned_grace_ms: free connections younger than this are left to the hint whoever
        freed them sent (default :func:`wsfleet.reconcile.unowned_grace_ms`: one pass).
    :param rebalance: write the fleet view each pass (:func:`write_fleet_view`); None: off.
    """

    def __init__(
        self,
        store: LeaseStore,
        sender: HintSender,
        janitor: ControlQueueJanitor | None,
        *,
        pass_interval_ms: int,
        page_size: int,
        ledger: HintLedger,
        clock: Clock = now_ms,
        claim_threads: int = CLAIM_THREADS,
        max_hints_per_pass: int = MAX_HINTS_PER_PASS,
        unowned_grace_ms: int | None = None,
        rebalance: RebalancePolicy | None = None,
    ) -> None:
        self.store = store
        self.rebalance = rebalance
        self.sender = sender
        self.janitor = janitor
        self.pass_interval_ms = pass_interval_ms
        self.page_size = page_size
        self.ledger = ledger
        self._clock = clock
        self.max_hints_per_pass = max_hints_per_pass
        self.unowned_grace_ms = (
            default_unowned_grace_ms(pass_interval_ms) if unowned_grace_ms is None
            else unowned_grace_ms
        )
        self._claim_pool = ThreadPoolExecutor(claim_threads, thread_name_prefix="claim")

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock = now_ms) -> Reconciler:
        """Build with fresh clients; refuses a pass interval that would hint live leases."""
        settings.check_reconcile_pass()
        queue_url = settings.require_hint_queue_url()
        sqs = sqs_client()
        store = LeaseStore.from_settings(settings, client=dynamodb_client())
        janitor = ControlQueueJanitor(
            sqs,
            store,
            prefix=settings.control_queue_prefix,
            grace_ms=dead_worker_grace_ms(settings.lease_ms),
            clock=clock,
        )
        return cls(
            store,
            HintSender(sqs, queue_url),
            janitor,
            pass_interval_ms=int(settings.reconcile_pass_seconds * 1000),
            page_size=settings.reconcile_page_size,
            ledger=HintLedger(rehint_after_ms(HINT_VISIBILITY_TIMEOUT_SECONDS)),
            clock=clock,
            rebalance=RebalancePolicy.from_settings(settings),
        )

    def close(self) -> None:
        self._claim_pool.shutdown(wait=True)

    @tracer.capture_method
    def run_pass(self) -> PassReport:
        started = self._clock()
        clock_start = time.perf_counter()
        hints, workers, owned = self._hint_pass(started)
        moves = self._write_view(workers)
        cleanup = CleanupReport()
        if self.janitor is not None:
            cleanup = self.janitor.sweep(workers, owned)
        elapsed_ms = round((time.perf_counter() - clock_start) * 1000)
        return PassReport(started, elapsed_ms, hints, cleanup, moves)

    def _write_view(self, workers: Mapping[str, WorkerRecord]) -> int:
        """The fleet view for the workers' rebalancing; a failure costs this pass's view only
        (workers act on a plan once, and a stale one not at all)."""
        if self.rebalance is None:
            return 0
        try:
            view = write_fleet_view(self.store, self.rebalance, workers, self._clock())
        except StoreError as exc:
            logger.warning("fleet view not written", extra={"error": str(exc)})
            return 0
        moves = sum(m.count for m in view.moves)
        if moves and view.plan_at_ms == view.at_ms:
            logger.info(
                "rebalancing planned",
                extra={"moves": [asdict(m) for m in view.moves[:20]], "connections": moves,
                       "workers": view.workers, "held": view.held},
            )
        return moves

    def hint_pass(self, now: int) -> HintReport:
        """Read the workers, hint the connections of lapsed ones and lost free ones."""
        return self._hint_pass(now)[0]

    def _hint_pass(self, now: int) -> tuple[HintReport, dict[str, WorkerRecord], dict[str, int]]:
        tally = _Tally()
        started = time.perf_counter()
        worker_ids = self.store.list_worker_ids()
        workers = self.store.get_workers(worker_ids) if worker_ids else {}
        plan = plan_worker_hints(
            workers.values(),
            now_ms=now,
            horizon_ms=now + self.pass_interval_ms,
            ledger=self.ledger,
        )
        tally.timed("scan", started)
        owned: dict[str, int] = {}
        budget = self.max_hints_per_pass
        for hint in plan.hints:
            if budget <= 0 and not hint.pending:
                tally.deferred += 1
                continue
            budget -= self._hint_worker(hint, now, tally, owned)
        self._hint_unowned(now, max(0, budget), tally)
        self.ledger.prune(now)
        report = HintReport(
            workers_seen=plan.workers_seen,
            workers_expired=tally.workers_expired,
            workers_expiring=plan.expiring,
            orphans_found=tally.orphans,
            hints_sent=tally.sent,
            hints_failed=tally.failed,
            already_pending=tally.pending,
            claims_refused=tally.refused,
            claim_errors=tally.claim_errors,
            read_errors=tally.read_errors,
            deferred=tally.deferred,
            oldest_orphan_age_ms=tally.oldest_ms,
            scan_ms=round(tally.seconds["scan"] * 1000),
            claim_ms=round(tally.seconds["claim"] * 1000),
            send_ms=round(tally.seconds["send"] * 1000),
        )
        return report, workers, owned

    def _hint_worker(
        self, hint: WorkerHint, now: int, tally: _Tally, owned: dict[str, int]
    ) -> int:
        """Read one lapsing worker's connections, claim its hints and send them; returns how
        many hints it tried to send.

        The connections are read before the claim: a worker that owns nothing (it retired
        cleanly, or every connection was taken over already) costs no write. An orphaned
        worker whose hints are pending is still read, so OrphansFound and the janitor see
        what it still owns.
        """
        worker = hint.worker
        if hint.pending and not hint.orphaned:
            tally.pending += 1
            return 0
        started = time.perf_counter()
        try:
            entries = [
                e for e in self.store.owned_by(worker.worker_id) if e.desired_state in NEEDS_OWNER
            ]
        except StoreError as exc:
            logger.warning(
                "reading a lapsed worker's connections failed",
                extra={"worker_id": worker.worker_id, "error": str(exc)},
            )
            tally.read_errors += 1
            return 0
        finally:
            started = tally.timed("scan", started)
        owned[worker.worker_id] = len(entries)
        if not entries:
            return 0
        if hint.orphaned:
            tally.workers_expired += 1
            tally.orphans_seen(len(entries), hint.orphan_age_ms(now))
        if hint.pending:
            tally.pending += 1
            # This expiry's hints went out already. A connection the worker took on after the
            # claim (a new epoch: e.g. acquired from hints it held through a pause, just before
            # it fenced) was not among them: hint those now, without another claim. A
            # connection already hinted under its epoch waits for the rehint interval.
            entries = [
                e for e in entries
                if hint.orphaned and not self.ledger.is_pending(e.pk, e.epoch, now)
            ]
            if not entries:
                return 0
        elif not hint.owed:
            try:
                claimed = self.store.claim_worker_hints(
                    worker, rehint_after_ms=self.ledger.rehint_after_ms
                )
            except StoreError as exc:
                logger.warning(
                    "worker hint claim failed",
                    extra={"worker_id": worker.worker_id, "error": str(exc)},
                )
                tally.claim_errors += 1
                return 0
            finally:
                started = tally.timed("claim", started)
            if not claimed:
                # Another pass claimed this expiry, or the worker renewed: nothing to send.
                tally.refused += 1
                self.ledger.remember(worker.pk, worker.expires_at_ms, now)
                for entry in entries:  # whoever claimed it hinted these
                    self.ledger.remember(entry.pk, entry.epoch, now)
                return 0
        delay = hint.delay_seconds(self._clock())  # claiming may have taken a while
        failed = self.sender.send_many(Hint(e.pk, e.epoch, delay) for e in entries)
        tally.timed("send", started)
        # Unsent hints stay owed under our claim: the next pass sends them without one.
        if not hint.pending:
            self.ledger.remember(worker.pk, worker.expires_at_ms, now, sent=not failed)
        unsent = {h.pk for h in failed}
        for entry in entries:
            if entry.pk not in unsent:
                self.ledger.remember(entry.pk, entry.epoch, now)
        tally.sent += len(entries) - len(failed)
        tally.failed += len(failed)
        if failed:
            logger.warning(
                "hints not sent; the next pass sends them again",
                extra={"worker_id": worker.worker_id, "count": len(failed)},
            )
        else:
            logger.info(
                "hinted a lapsing worker's connections",
                extra={
                    "worker_id": worker.worker_id,
                    "kind": str(hint.kind),
                    "connections": len(entries),
                    "delay_seconds": delay,
                },
            )
        return len(entries)

    def _hint_unowned(self, now: int, budget: int, tally: _Tally) -> None:
        """Hint free connections whose own hint was most likely lost (free past the grace)."""
        started = time.perf_counter()
        before = now - self.unowned_grace_ms

        def read(shard: int) -> list[IndexEntry] | StoreError:
            try:
                return list(self.store.unowned(shard, before, page_size=self.page_size))
            except StoreError as exc:
                return exc

        # The shards in parallel: a pass costs one query's latency, not sixteen.
        entries: list[IndexEntry] = []
        for shard, found in enumerate(self._claim_pool.map(read, range(INDEX_SHARDS))):
            if isinstance(found, StoreError):
                logger.warning(
                    "reading free connections failed", extra={"shard": shard, "error": str(found)}
                )
                tally.read_errors += 1
            else:
                entries.extend(found)
        plan = plan_unowned(
            entries,
            now_ms=now,
            grace_ms=self.unowned_grace_ms,
            ledger=self.ledger,
            max_hints=budget,
        )
        started = tally.timed("scan", started)
        tally.orphans_seen(plan.found, plan.oldest_age_ms)
        tally.pending += plan.already_pending
        tally.deferred += plan.deferred
        claimed = self._claim_all(plan.candidates, now, tally)
        started = tally.timed("claim", started)
        failed = self.sender.send_many(Hint(e.pk, e.epoch, 0) for e in claimed) if claimed else []
        tally.timed("send", started)
        tally.sent += len(claimed) - len(failed)
        tally.failed += len(failed)
        if failed:
            withdrawn = self._withdraw_claims(claimed, {h.pk for h in failed})
            logger.warning(
                "hints not sent; claims withdrawn so the next pass sends them",
                extra={"count": len(failed), "withdrawn": withdrawn,
                       "pks": [h.pk for h in failed[:10]]},
            )

    def _withdraw_claims(self, claimed: list[IndexEntry], unsent: set[str]) -> int:
        """Withdraw the claims of hints that were not sent (best effort: a claim left behind
        only delays that hint until it goes stale)."""
        withdrawn = 0
        for entry in claimed:
            if entry.pk not in unsent:
                continue
            self.ledger.forget(entry.pk)
            try:
                withdrawn += self.store.withdraw_hint_claim(entry)
            except StoreError as exc:
                logger.warning(
                    "hint claim not withdrawn", extra={"pk": entry.pk, "error": str(exc)}
                )
        return withdrawn

    def _claim_all(
        self, candidates: tuple[IndexEntry, ...], now: int, tally: _Tally
    ) -> list[IndexEntry]:
        """Claim in parallel; returns the entries claimed (refusals and errors are tallied)."""

        def claim(entry: IndexEntry) -> bool | None:
            try:
                return self.store.claim_hint(entry, rehint_after_ms=self.ledger.rehint_after_ms)
            except StoreError as exc:
                logger.warning("hint claim failed", extra={"pk": entry.pk, "error": str(exc)})
                return None

        claimed: list[IndexEntry] = []
        for entry, outcome in zip(candidates, self._claim_pool.map(claim, candidates), strict=True):
            if outcome is None:
                tally.claim_errors += 1
                continue
            # Refused means another pass already claimed this free spell (or the connection
            # was taken meanwhile): either way nothing to send, and nothing to re-try.
            self.ledger.remember(entry.pk, entry.unowned_since_ms or 0, now)
            if outcome:
                claimed.append(entry)
            else:
                tally.refused += 1
        return claimed



# ============================================================================ the invocation


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def run_passes(
    reconciler: Reconciler,
    remaining_ms: Callable[[], int],
    *,
    on_pass: Callable[[PassReport], None] = lambda report: None,
    margin_ms: int = TIME_MARGIN_MS,
    sleep: Callable[[float], None] = time.sleep,
    monotonic_ms: Callable[[], int] = _monotonic_ms,
) -> Iterator[PassReport]:
    """Run passes on a fixed grid until the next one would end too close to the timeout.

    The first pass always runs. ``remaining_ms`` is the Lambda context's
    ``get_remaining_time_in_millis``; the longest pass so far estimates the next one.
    """
    first = monotonic_ms()
    longest = 0
    while True:
        report = reconciler.run_pass()
        on_pass(report)
        yield report
        longest = max(longest, report.pass_ms)
        now = monotonic_ms()
        wait_ms = next_pass_at_ms(first, reconciler.pass_interval_ms, now) - now
        if not should_run_another_pass(
            remaining_ms=remaining_ms(),
            wait_ms=wait_ms,
            expected_pass_ms=longest,
            margin_ms=margin_ms,
        ):
            return
        sleep(wait_ms / 1000)


def publish_pass_metrics(report: PassReport) -> None:
    """One EMF document per pass, so each pass is its own data point."""
    hints, cleanup = report.hints, report.cleanup
    count = MetricUnit.Count
    metrics.add_metric(name="WorkersExpired", unit=count, value=hints.workers_expired)
    metrics.add_metric(name="WorkersExpiring", unit=count, value=hints.workers_expiring)
    metrics.add_metric(name="OrphansFound", unit=count, value=hints.orphans_found)
    metrics.add_metric(name="HintsSent", unit=count, value=hints.hints_sent)
    metrics.add_metric(name="HintsFailed", unit=count, value=hints.hints_failed)
    metrics.add_metric(name="HintsDeferred", unit=count, value=hints.deferred)
    metrics.add_metric(
        name="OldestOrphanAgeMs", unit=MetricUnit.Milliseconds, value=hints.oldest_orphan_age_ms
    )
    metrics.add_metric(name="PassMs", unit=MetricUnit.Milliseconds, value=report.pass_ms)
    metrics.add_metric(name="ControlQueuesDeleted", unit=count, value=cleanup.queues_deleted)
    metrics.add_metric(name="WorkersDeleted", unit=count, value=cleanup.workers_deleted)
    metrics.add_metric(name="RebalanceMoves", unit=count, value=report.rebalance_moves)
    metrics.flush_metrics()
    logger.info("reconcile pass", extra={"pass": report.as_dict()})


@functools.cache
def reconciler() -> Reconciler:
    """The container's reconciler, built on first use and kept (with its hint ledger and
    queue caches) for the container's life.

    This is where the settings are checked: a pass interval that would put live leases in the
    early-hint window, or a missing HINT_QUEUE_URL, fails the first invocation with a
    ConfigurationError naming the variables.
    """
    return Reconciler.from_settings(Settings.from_env())


def reset_dependencies() -> None:
    """Drop the cached reconciler (the next invocation behaves like a cold start)."""
    if reconciler.cache_info().currsize:
        reconciler().close()
    reconciler.cache_clear()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(capture_cold_start_metric=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """EventBridge Scheduler target. The event only carries schedule metadata (logged)."""
    event = event or {}
    logger.append_keys(scheduled_time=event.get("time"), schedule=event.get("resources"))
    reports = list(
        run_passes(reconciler(), context.get_remaining_time_in_millis, on_pass=publish_pass_metrics)
    )
    metrics.add_metric(name="ReconcilePasses", unit=MetricUnit.Count, value=len(reports))
    return {
        "passes": len(reports),
        "workers_expired": reports[-1].hints.workers_expired,
        "orphans_found": reports[-1].hints.orphans_found,
        "hints_sent": sum(r.hints.hints_sent for r in reports),
        "hints_failed": sum(r.hints.hints_failed for r in reports),
        "control_queues_deleted": sum(r.cleanup.queues_deleted for r in reports),
        "workers_deleted": sum(r.cleanup.workers_deleted for r in reports),
        "pass_ms": [r.pass_ms for r in reports],
    }
