"""Reconciler Lambda: hint every orphaned connection, early, once; clean up after dead workers.

EventBridge Scheduler invokes this once a minute (its finest rate). One invocation then runs a
reconcile pass every ``RECONCILE_PASS_SECONDS`` until the remaining time is too short for
another, so crash recovery costs about one lease, not a lease plus a minute.

A pass (the planning rules live in :mod:`wsfleet.reconcile`, this module only does the I/O):

1. Query ``gsi_desired_state_lease`` for STARTED connections whose lease ends before the next
   pass (all pages). Orphans get a hint now; leases about to lapse get a hint delayed to land
   in the last second before the expiry; the worker that receives it waits for the expiry
   and acquires (a worker that receives one for a lease renewed meanwhile just loses the
   conditional acquire).
2. Claim each hint in DynamoDB (once per lease expiry, see ``LeaseStore.claim_hint``) before
   sending it with SendMessageBatch, so the queue holds at most one pending hint per orphan.
3. Delete the control queue and worker item of workers dead for longer than two leases
   (bounded work per pass).

Metrics per pass: OrphansFound, HintsSent, OldestOrphanAgeMs, PassMs (plus ExpiringFound,
HintsFailed, HintsDeferred, ControlQueuesDeleted, WorkersDeleted).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import Clock, now_ms
from wsfleet.control import WORKER_ID_TAG
from wsfleet.exceptions import StoreError
from wsfleet.hints import Hint, HintSender
from wsfleet.lease import hint_delay_seconds
from wsfleet.reconcile import (
    CleanupAction,
    ControlQueue,
    HintCandidate,
    HintLedger,
    dead_worker_grace_ms,
    next_pass_at_ms,
    plan_cleanup,
    plan_hints,
    queue_name_of,
    rehint_after_ms,
    should_run_another_pass,
    worker_id_from_queue_name,
)
from wsfleet.settings import Settings
from wsfleet.store import LeaseStore

__all__ = [
    "CleanupReport",
    "ControlQueueJanitor",
    "HintReport",
    "PassReport",
    "Reconciler",
    "lambda_handler",
    "reconciler",
    "reset_dependencies",
    "run_passes",
]

#: The HintQueue's VisibilityTimeout in template.yaml; sets how long a hint counts as pending.
HINT_VISIBILITY_TIMEOUT_SECONDS = 30
#: Stop starting passes when fewer than this many ms would be left after the next one.
TIME_MARGIN_MS = 3_000
#: Parallel claim writes (DynamoDB latency, not CPU, bounds a pass over many orphans).
CLAIM_THREADS = 8
#: Hints claimed and sent per pass at most; the rest (newest orphans) wait one pass.
MAX_HINTS_PER_PASS = 10_000
#: Control queues whose tags/age are looked up per pass at most (results are cached).
MAX_QUEUE_LOOKUPS_PER_PASS = 50
#: Dead workers cleaned up per pass at most.
MAX_DELETIONS_PER_PASS = 10

logger = Logger()
metrics = Metrics()
tracer = Tracer()


# ============================================================================ reports


@dataclass(frozen=True)
class HintReport:
    """What the hint half of a pass found and did."""

    orphans_found: int = 0
    expiring_found: int = 0
    hints_sent: int = 0
    hints_failed: int = 0
    already_pending: int = 0
    claims_refused: int = 0
    claim_errors: int = 0
    deferred: int = 0
    oldest_orphan_age_ms: int = 0
    scan_ms: int = 0  # GSI query (all pages) and planning
    claim_ms: int = 0
    send_ms: int = 0


@dataclass(frozen=True)
class CleanupReport:
    """What the dead-worker half of a pass found and did."""

    queues_seen: int = 0
    queues_deleted: int = 0
    workers_deleted: int = 0
    deferred: int = 0
    errors: int = 0


@dataclass(frozen=True)
class PassReport:
    started_at_ms: int
    pass_ms: int
    hints: HintReport
    cleanup: CleanupReport

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ============================================================================ dead workers


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_missing_queue(exc: ClientError) -> bool:
    return _error_code(exc) in {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
    }


class ControlQueueJanitor:
    """Finds control queues of dead workers and deletes them with their worker items.

    A queue's worker id (its ``wsfleet:worker_id`` tag) and creation time never change, so
    both are cached per container: a warm pass costs one ListQueues page per 1,000 queues and
    one BatchGetItem per 100 workers. New queues are looked up at most ``max_lookups`` per
    pass and at most ``max_deletions`` queues are deleted per pass.
    """

    def __init__(
        self,
        sqs: Any,
        store: LeaseStore,
        *,
        prefix: str,
        grace_ms: int,
        clock: Clock = now_ms,
        max_lookups: int = MAX_QUEUE_LOOKUPS_PER_PASS,
        max_deletions: int = MAX_DELETIONS_PER_PASS,
    ) -> None:
        self._sqs = sqs
        self._store = store
        self.prefix = prefix
        self.grace_ms = grace_ms
        self._clock = clock
        self.max_lookups = max_lookups
        self.max_deletions = max_deletions
        self._worker_ids: dict[str, str | None] = {}
        self._created_at_ms: dict[str, int] = {}

    def list_queue_urls(self) -> list[str]:
        """Every queue URL with the control prefix (ListQueues, all pages)."""
        pages = self._sqs.get_paginator("list_queues").paginate(
            QueueNamePrefix=self.prefix, PaginationConfig={"PageSize": 1000}
        )
        return [url for page in pages for url in page.get("QueueUrls", [])]

    def _lookup_worker_id(self, url: str) -> str | None:
        """The worker id tag; the name-derived id for an untagged queue. Raises on errors."""
        tags = self._sqs.list_queue_tags(QueueUrl=url).get("Tags") or {}
        return tags.get(WORKER_ID_TAG) or worker_id_from_queue_name(self.prefix, queue_name_of(url))

    def _lookup_created_at_ms(self, url: str) -> int:
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["CreatedTimestamp"]
        )["Attributes"]
        return int(float(attributes["CreatedTimestamp"]) * 1000)

    def sweep(self) -> CleanupReport:
        """One bounded cleanup round."""
        try:
            urls = self.list_queue_urls()
        except (ClientError, BotoCoreError) as exc:
            logger.warning("listing control queues failed", extra={"error": str(exc)})
            return CleanupReport(errors=1)
        present = set(urls)
        for cache in (self._worker_ids, self._created_at_ms):
            for url in [u for u in cache if u not in present]:
                del cache[url]

        lookups, errors, deferred = self.max_lookups, 0, 0
        queues: list[ControlQueue] = []
        for url in urls:
            if url not in self._worker_ids:
                if lookups <= 0:
                    deferred += 1
                    continue
                lookups -= 1
                try:
                    self._worker_ids[url] = self._lookup_worker_id(url)
                except (ClientError, BotoCoreError) as exc:
                    # Unknown owner: keep the queue rather than guess (it may be a live one).
                    errors += not (isinstance(exc, ClientError) and _is_missing_queue(exc))
                    continue
            queues.append(ControlQueue(url, self._worker_ids[url], self._created_at_ms.get(url)))

        now = self._clock()
        worker_ids = {q.worker_id for q in queues if q.worker_id}
        try:
            workers = self._store.get_workers(worker_ids) if worker_ids else {}
        except StoreError as exc:
            logger.warning("reading worker items failed", extra={"error": str(exc)})
            return CleanupReport(queues_seen=len(urls), errors=errors + 1)
        plan = plan_cleanup(
            queues, workers, now_ms=now, grace_ms=self.grace_ms, max_deletions=self.max_deletions
        )
        actions = list(plan.actions)
        aged: list[ControlQueue] = []
        for queue in plan.need_age:
            if lookups <= 0:
                deferred += 1
                continue
            lookups -= 1
            try:
                created = self._created_at_ms[queue.url] = self._lookup_created_at_ms(queue.url)
            except (ClientError, BotoCoreError) as exc:
                errors += not (isinstance(exc, ClientError) and _is_missing_queue(exc))
                continue
            aged.append(ControlQueue(queue.url, queue.worker_id, created))
        if aged:
            second = plan_cleanup(
                aged,
                workers,
                now_ms=now,
                grace_ms=self.grace_ms,
                max_deletions=self.max_deletions - len(actions),
            )
            actions.extend(second.actions)
            deferred += second.deferred
        deferred += plan.deferred

        queues_deleted = workers_deleted = 0
        for action in actions:
            done_queue, done_worker, failed = self._carry_out(action)
            queues_deleted += done_queue
            workers_deleted += done_worker
            errors += failed
        return CleanupReport(len(urls), queues_deleted, workers_deleted, deferred, errors)

    def _carry_out(self, action: CleanupAction) -> tuple[int, int, int]:
        """Delete the queue, then the worker item. Returns (queues, workers, errors)."""
        try:
            self._sqs.delete_queue(QueueUrl=action.queue_url)
        except ClientError as exc:
            if not _is_missing_queue(exc):
                logger.warning(
                    "deleting control queue failed",
                    extra={"queue_url": action.queue_url, "error": str(exc)},
                )
                return 0, 0, 1
        except BotoCoreError as exc:
            logger.warning("deleting control queue failed", extra={"error": str(exc)})
            return 0, 0, 1
        self._worker_ids.pop(action.queue_url, None)
        self._created_at_ms.pop(action.queue_url, None)
        logger.info(
            "deleted control queue of a dead worker",
            extra={
                "queue_url": action.queue_url,
                "worker_id": action.worker_id,
                "verdict": str(action.verdict),
            },
        )
        if action.worker_id is None:
            return 1, 0, 0
        try:
            self._store.deregister_worker(action.worker_id)
        except StoreError as exc:
            logger.warning(
                "deleting worker item failed",
                extra={"worker_id": action.worker_id, "error": str(exc)},
            )
            return 1, 0, 1
        return 1, 1, 0


# ============================================================================ the pass


class Reconciler:
    """Runs reconcile passes: orphan hints, then dead-worker cleanup.

    :param store: the connections table.
    :param sender: where hints go.
    :param janitor: dead-worker cleanup, or None to skip it.
    :param pass_interval_ms: time to the next pass; leases ending before then are hinted now.
    :param ledger: claims this process already made (kept across passes and invocations).
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
    ) -> None:
        self.store = store
        self.sender = sender
        self.janitor = janitor
        self.pass_interval_ms = pass_interval_ms
        self.page_size = page_size
        self.ledger = ledger
        self._clock = clock
        self.max_hints_per_pass = max_hints_per_pass
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
        )

    def close(self) -> None:
        self._claim_pool.shutdown(wait=True)

    @tracer.capture_method
    def run_pass(self) -> PassReport:
        started = self._clock()
        clock_start = time.perf_counter()
        hints = self.hint_pass(started)
        cleanup = self.janitor.sweep() if self.janitor is not None else CleanupReport()
        elapsed_ms = round((time.perf_counter() - clock_start) * 1000)
        return PassReport(started, elapsed_ms, hints, cleanup)

    def hint_pass(self, now: int) -> HintReport:
        """Query, plan, claim, send."""
        started = time.perf_counter()
        records = self.store.query_orphans(now + self.pass_interval_ms, page_size=self.page_size)
        plan = plan_hints(
            records,
            now_ms=now,
            horizon_ms=now + self.pass_interval_ms,
            ledger=self.ledger,
            max_hints=self.max_hints_per_pass,
        )
        scanned = time.perf_counter()
        claimed, refused, errors = self._claim_all(plan.candidates, now)
        claimed_at = time.perf_counter()
        failed = self.sender.send_many(self._timed_hints(claimed)) if claimed else []
        sent = time.perf_counter()
        if failed:
            withdrawn = self._withdraw_claims(claimed, {h.pk for h in failed})
            logger.warning(
                "hints not sent; claims withdrawn so the next pass sends them",
                extra={"count": len(failed), "withdrawn": withdrawn,
                       "pks": [h.pk for h in failed[:10]]},
            )
        self.ledger.prune(now)
        return HintReport(
            orphans_found=plan.orphans_found,
            expiring_found=plan.expiring_found,
            hints_sent=len(claimed) - len(failed),
            hints_failed=len(failed),
            already_pending=plan.already_pending,
            claims_refused=refused,
            claim_errors=errors,
            deferred=plan.deferred,
            oldest_orphan_age_ms=plan.oldest_orphan_age_ms,
            scan_ms=round((scanned - started) * 1000),
            claim_ms=round((claimed_at - scanned) * 1000),
            send_ms=round((sent - claimed_at) * 1000),
        )

    def _withdraw_claims(self, claimed: list[HintCandidate], unsent: set[str]) -> int:
        """Withdraw the claims of hints that were not sent (best effort: a claim left behind
        only delays that hint until it goes stale)."""
        withdrawn = 0
        for candidate in claimed:
            if candidate.record.pk not in unsent:
                continue
            self.ledger.forget(candidate.record.pk)
            try:
                withdrawn += self.store.withdraw_hint_claim(candidate.record)
            except StoreError as exc:
                logger.warning(
                    "hint claim not withdrawn", extra={"pk": candidate.record.pk, "error": str(exc)}
                )
        return withdrawn

    def _timed_hints(self, claimed: list[HintCandidate]) -> list[Hint]:
        """The hints to send, early ones re-timed: claiming many can take a while."""
        sent_at = self._clock()
        return [
            c.hint
            if c.orphan
            else replace(c.hint, delay_seconds=hint_delay_seconds(c.record, sent_at))
            for c in claimed
        ]

    def _claim_all(
        self, candidates: tuple[HintCandidate, ...], now: int
    ) -> tuple[list[HintCandidate], int, int]:
        """Claim in parallel; returns (claimed, refused count, error count)."""

        def claim(candidate: HintCandidate) -> bool | None:
            try:
                return self.store.claim_hint(
                    candidate.record, rehint_after_ms=self.ledger.rehint_after_ms
                )
            except StoreError as exc:
                logger.warning(
                    "hint claim failed", extra={"pk": candidate.record.pk, "error": str(exc)}
                )
                return None

        claimed: list[HintCandidate] = []
        refused = errors = 0
        for candidate, outcome in zip(
            candidates, self._claim_pool.map(claim, candidates), strict=True
        ):
            if outcome is None:
                errors += 1
                continue
            # Refused means another pass already claimed this lease expiry (or the lease
            # moved on): either way nothing to send, and nothing to re-try next pass.
            self.ledger.remember(candidate.record, now)
            if outcome:
                claimed.append(candidate)
            else:
                refused += 1
        return claimed, refused, errors


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
    metrics.add_metric(name="OrphansFound", unit=count, value=hints.orphans_found)
    metrics.add_metric(name="ExpiringFound", unit=count, value=hints.expiring_found)
    metrics.add_metric(name="HintsSent", unit=count, value=hints.hints_sent)
    metrics.add_metric(name="HintsFailed", unit=count, value=hints.hints_failed)
    metrics.add_metric(name="HintsDeferred", unit=count, value=hints.deferred)
    metrics.add_metric(
        name="OldestOrphanAgeMs", unit=MetricUnit.Milliseconds, value=hints.oldest_orphan_age_ms
    )
    metrics.add_metric(name="PassMs", unit=MetricUnit.Milliseconds, value=report.pass_ms)
    metrics.add_metric(name="ControlQueuesDeleted", unit=count, value=cleanup.queues_deleted)
    metrics.add_metric(name="WorkersDeleted", unit=count, value=cleanup.workers_deleted)
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
        "orphans_found": reports[-1].hints.orphans_found,
        "hints_sent": sum(r.hints.hints_sent for r in reports),
        "hints_failed": sum(r.hints.hints_failed for r in reports),
        "control_queues_deleted": sum(r.cleanup.queues_deleted for r in reports),
        "workers_deleted": sum(r.cleanup.workers_deleted for r in reports),
        "pass_ms": [r.pass_ms for r in reports],
    }
