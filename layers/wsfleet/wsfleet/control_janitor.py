"""The control-queue janitor: deletes dead workers' items with their control queues, and
control queues no worker item names.

Each worker creates a queue named by :func:`wsfleet.control.control_queue_name`; this module
reads such names back (:func:`wsfleet.control.worker_id_from_queue_name`, with the queue's
``wsfleet:worker_id`` tag first) and deletes what nobody owns any more. The rules of what may
go are pure (:mod:`wsfleet.reconcile`: :func:`~wsfleet.reconcile.judge_worker_item`,
:func:`~wsfleet.reconcile.plan_cleanup`); this is the shell that lists, looks up and deletes.
The reconciler runs one bounded :meth:`ControlQueueJanitor.sweep` at the end of every pass.

Logs go to the Powertools logger of the process's service (the reconciler's), as before the
janitor moved here from ``functions/reconciler/app.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import BotoCoreError, ClientError

from .clock import Clock, now_ms
from .control import WORKER_ID_TAG, queue_name_of, worker_id_from_queue_name
from .exceptions import StoreError
from .reconcile import (
    NEEDS_OWNER,
    CleanupAction,
    ControlQueue,
    WorkerVerdict,
    judge_worker_item,
    plan_cleanup,
    plan_worker_cleanup,
)
from .record import WorkerRecord
from .store import LeaseStore

__all__ = [
    "MAX_DELETIONS_PER_PASS",
    "MAX_QUEUE_LOOKUPS_PER_PASS",
    "CleanupReport",
    "ControlQueueJanitor",
]

#: Control queues whose tags/age are looked up per pass at most (results are cached).
MAX_QUEUE_LOOKUPS_PER_PASS = 50
#: Dead workers (and leftover queues) cleaned up per pass at most.
MAX_DELETIONS_PER_PASS = 10

# Same service as the reconciler's Logger(), so the same logger, handler and Lambda context.
logger = Logger()


@dataclass(frozen=True)
class CleanupReport:
    """What the dead-worker half of a pass found and did."""

    queues_seen: int = 0
    queues_deleted: int = 0
    workers_deleted: int = 0
    deferred: int = 0
    errors: int = 0

# ============================================================================ the janitor


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_missing_queue(exc: ClientError) -> bool:
    return _error_code(exc) in {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
    }


class ControlQueueJanitor:
    """Deletes dead workers' items with their control queues, and leftover control queues.

    A worker item goes once its lease ended more than ``grace_ms`` ago and gsi_owner shows no
    STARTED connection under it (:func:`wsfleet.reconcile.judge_worker_item`); its control
    queue goes first, so a failure leaves an item that the next pass finds again.

    A queue's worker id (its ``wsfleet:worker_id`` tag) and creation time never change, so
    both are cached per container: a warm pass costs one ListQueues page per 1,000 queues.
    New queues are looked up at most ``max_lookups`` per pass, and at most ``max_deletions``
    workers and as many leftover queues are deleted per pass.
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

    def sweep(
        self,
        workers: Mapping[str, WorkerRecord] | None = None,
        owned: Mapping[str, int] | None = None,
    ) -> CleanupReport:
        """One bounded cleanup round.

        :param workers: every worker item, as the pass read them (None: read them here).
        :param owned: STARTED connections per worker id, as gsi_owner showed them this pass
            (workers missing from it are asked when it matters).
        """
        now = self._clock()
        if workers is None:
            try:
                workers = self._store.get_workers(self._store.list_worker_ids())
            except StoreError as exc:
                logger.warning("reading worker items failed", extra={"error": str(exc)})
                return CleanupReport(errors=1)
        queues_deleted, workers_deleted, deferred, errors = self._sweep_workers(
            workers, owned or {}, now
        )
        report = self._sweep_queues(workers, now)
        return CleanupReport(
            report.queues_seen,
            report.queues_deleted + queues_deleted,
            workers_deleted,
            report.deferred + deferred,
            report.errors + errors,
        )

    def _sweep_workers(
        self, workers: Mapping[str, WorkerRecord], owned: Mapping[str, int], now: int
    ) -> tuple[int, int, int, int]:
        """Delete the items (and queues) of workers gone for good. Returns (queues deleted,
        workers deleted, deferred, errors)."""
        gone, deferred = plan_worker_cleanup(
            workers.values(), now_ms=now, grace_ms=self.grace_ms, max_deletions=self.max_deletions
        )
        queues = items = errors = 0
        for worker in gone:
            count = owned.get(worker.worker_id)
            try:
                owns = bool(count) if count is not None else self._owns_any(worker.worker_id)
            except StoreError as exc:
                logger.warning(
                    "reading a dead worker's connections failed",
                    extra={"worker_id": worker.worker_id, "error": str(exc)},
                )
                errors += 1
                continue
            verdict = judge_worker_item(
                worker, now_ms=now, grace_ms=self.grace_ms, owns_connections=owns
            )
            if verdict is not WorkerVerdict.DELETE:
                continue  # its connections are still being taken over
            queue_done, failed = self._delete_worker_queue(worker)
            queues += queue_done
            if failed:
                errors += 1
                continue
            try:
                deleted = self._store.delete_worker(
                    worker.worker_id, dead_before_ms=now - self.grace_ms
                )
            except StoreError as exc:
                logger.warning(
                    "deleting worker item failed",
                    extra={"worker_id": worker.worker_id, "error": str(exc)},
                )
                errors += 1
                continue
            items += deleted
            if deleted:
                logger.info(
                    "deleted a dead worker's item",
                    extra={"worker_id": worker.worker_id, "expired_at_ms": worker.expires_at_ms},
                )
        return queues, items, deferred, errors

    def _owns_any(self, worker_id: str) -> bool:
        """Whether gsi_owner shows a STARTED connection under ``worker_id`` (stops at the
        first one)."""
        return any(
            e.desired_state in NEEDS_OWNER for e in self._store.owned_by(worker_id, page_size=100)
        )

    def _delete_worker_queue(self, worker: WorkerRecord) -> tuple[int, bool]:
        """Delete the worker's own control queue (only one under our prefix). Returns
        (deleted, failed); a queue that is already gone is not a failure."""
        url = worker.control_queue_url
        if not url or not queue_name_of(url).startswith(self.prefix):
            return 0, False
        outcome = self._delete_queue(url)
        return int(bool(outcome)), outcome is None

    def _delete_queue(self, url: str) -> bool | None:
        """DeleteQueue. True: deleted; False: it was gone already; None: failed (logged)."""
        try:
            self._sqs.delete_queue(QueueUrl=url)
        except ClientError as exc:
            if _is_missing_queue(exc):
                return False
            logger.warning(
                "deleting control queue failed", extra={"queue_url": url, "error": str(exc)}
            )
            return None
        except BotoCoreError as exc:
            logger.warning("deleting control queue failed", extra={"error": str(exc)})
            return None
        return True

    def _sweep_queues(self, workers: Mapping[str, WorkerRecord], now: int) -> CleanupReport:
        """Delete control queues no worker item names, once older than the grace."""
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

        # The pass read every worker listed in gsi_workers; a queue naming another id is most
        # likely a leftover, but a worker registered a moment ago may not be listed yet.
        missing = {q.worker_id for q in queues if q.worker_id and q.worker_id not in workers}
        if missing:
            try:
                workers = {**workers, **self._store.get_workers(missing)}
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

        queues_deleted = 0
        for action in actions:
            done, failed = self._carry_out(action)
            queues_deleted += done
            errors += failed
        return CleanupReport(len(urls), queues_deleted, 0, deferred, errors)

    def _carry_out(self, action: CleanupAction) -> tuple[int, int]:
        """Delete a leftover queue (one already gone counts as deleted, as it always has).
        Returns (queues deleted, errors)."""
        if self._delete_queue(action.queue_url) is None:
            return 0, 1
        self._worker_ids.pop(action.queue_url, None)
        self._created_at_ms.pop(action.queue_url, None)
        logger.info(
            "deleted a leftover control queue",
            extra={"queue_url": action.queue_url, "verdict": str(action.verdict)},
        )
        return 1, 0
