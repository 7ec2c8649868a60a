"""Task exit Lambda: fail a crashed worker over in seconds, from ECS's task exit event.

An EventBridge rule sends this function the worker cluster's ``ECS Task State Change`` events
in which a container has stopped (template.yaml, ``TaskExitFunction``). A worker killed by
SIGKILL, the OOM killer or a lost host cannot retire its lease; without this its connections
stay dark until the lease expires (``LEASE_SECONDS``, 20 s). Per event (the rules are in
:mod:`wsfleet.task_exit`, this module only does the I/O):

1. Parse and check the event; act only once the worker container (``WORKER_CONTAINER_NAME``)
   has ``lastStatus`` STOPPED. A draining task (``desiredStatus`` STOPPED, container still
   running) is left to its drain.
2. Find the incarnations that ran in that container: the registered worker ids that name the
   task (``<task_id>.<...>``; else every id), their items (BatchGetItem), and
   :func:`~wsfleet.task_exit.ran_in` (task ARN, container runtime id or start time).
3. Kill each one (:meth:`~wsfleet.store.LeaseStore.kill_exited_worker`): one conditional write
   of ``dead_at_ms``, fenced by the task ARN and the runtime id, refused on a dead item. From
   then on any peer takes its connections over at once (a dead owner needs no waiting).
4. Hint all the connections each dead incarnation still owns (gsi_owner), without delay, so
   the peers polling the hint queue take them now rather than at the reconciler's next pass,
   and send each hint again ``COPY_DELAY_SECONDS`` later. The copy is for hints a dead worker
   swallows: a long poll the killed process had open stays open at SQS (up to its 20 s wait),
   takes the first hints that arrive and hides them for the queue's visibility timeout (30 s)
   from everyone. The copy arrives after that poll has returned (a receive ends with its first
   batch). A copy of a hint already acted on costs its taker one read, and nothing else.

Duplicates and late events (EventBridge delivers at least once, ECS out of order) are
harmless: a dead item refuses the kill, and a connection already taken over is no longer in
the dead worker's gsi_owner entries. A malformed event is logged and dropped (retrying it
would not help); a store or queue failure raises, so Lambda retries the asynchronous
invocation and then sends it to the dead-letter queue, which raises an alarm.

Requests per stopped task with W registered workers: ceil(W/1000) gsi_workers queries, one
BatchGetItem (ids naming the task; ceil(W/100) if ids do not name tasks), one write and one
gsi_owner query per incarnation, and two SendMessageBatch per 10 connections (hint and copy).

Metrics per invocation: TaskExitsFailedOver (incarnations killed), TaskExitHints,
TaskExitsIgnored (events that needed nothing).
"""

from __future__ import annotations

import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.exceptions import ConfigurationError
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.reconcile import NEEDS_OWNER
from wsfleet.settings import Settings
from wsfleet.store import LeaseStore
from wsfleet.task_exit import (
    ExitKill,
    InvalidTaskEvent,
    candidate_worker_ids,
    container_stop,
    parse_task_event,
    ran_in,
)

__all__ = ["ExitReport", "HintsNotSent", "TaskExitHandler", "handler", "lambda_handler",
           "reset_dependencies"]  # fmt: skip

#: Hints are sent one SendMessageBatch (10) per task, SEND_THREADS at a time: sending is the
#: longest phase (a worker with a thousand connections is 100 batches), bound by SQS latency,
#: not CPU, so in parallel the last peers hear of the crash sooner.
HINT_CHUNK = 10
SEND_THREADS = 8
#: Delay of each hint's copy (SQS counts whole seconds): long enough that a dead worker's open
#: long poll has taken its one batch of originals, short enough to keep failover near a second.
COPY_DELAY_SECONDS = 1

logger = Logger()
metrics = Metrics()
tracer = Tracer()


class HintsNotSent(Exception):
    """Some hints could not be sent: the invocation fails so Lambda retries it (the kill is
    done; the retry finds the workers dead and hints what they still own)."""


@dataclass
class ExitReport:
    """What one event led to (the handler's return value, and its log line)."""

    outcome: str  # "failed_over", "nothing_to_do", "not_stopped", "invalid"
    task_arn: str | None = None
    version: int | None = None
    exit_code: int | None = None
    killed: list[str] = field(default_factory=list)
    already_dead: list[str] = field(default_factory=list)
    spared: list[str] = field(default_factory=list)
    hints_sent: int = 0
    #: Delayed copies of the hints sent (see COPY_DELAY_SECONDS).
    copies_sent: int = 0
    error: str | None = None
    #: Where the time went: finding the incarnations, killing them, reading and hinting
    #: their connections (ms, monotonic).
    phases_ms: dict[str, int] = field(default_factory=dict)


class TaskExitHandler:
    """Turns a task exit event into kills and hints.

    :param store: the lease store (worker items, gsi_workers, gsi_owner).
    :param sender: puts hints on the hint queue.
    :param container_name: the worker container's name in the task definition.
    """

    def __init__(self, store: LeaseStore, sender: HintSender, *, container_name: str) -> None:
        self.store = store
        self.sender = sender
        self.container_name = container_name

    def handle(self, event: Any) -> ExitReport:
        try:
            change = parse_task_event(event)
        except InvalidTaskEvent as exc:
            return ExitReport("invalid", error=str(exc))
        stop = container_stop(change, self.container_name)
        if stop is None:
            return ExitReport("not_stopped", change.task_arn, change.version)
        report = ExitReport("nothing_to_do", stop.task_arn, stop.version, stop.exit_code)
        started = time.monotonic()

        def phase(name: str) -> None:
            nonlocal started
            now = time.monotonic()
            report.phases_ms[name] = round((now - started) * 1000)
            started = now

        ids, _ = candidate_worker_ids(self.store.list_worker_ids(), stop.task_arn)
        workers = self.store.get_workers(ids) if ids else {}
        phase("find")
        for worker in sorted(workers.values(), key=lambda w: w.worker_id):
            if not ran_in(worker, stop):
                continue
            outcome = self.store.kill_exited_worker(worker.worker_id, stop)
            if outcome is ExitKill.KILLED:
                report.killed.append(worker.worker_id)
            elif outcome is ExitKill.ALREADY_DEAD:
                report.already_dead.append(worker.worker_id)
            else:
                report.spared.append(worker.worker_id)
        phase("kill")
        hints = [
            Hint(entry.pk, entry.epoch)
            for worker_id in (*report.killed, *report.already_dead)
            for entry in self.store.owned_by(worker_id)
            if entry.desired_state in NEEDS_OWNER
        ]
        phase("owned")
        copies = [Hint(h.pk, h.epoch, delay_seconds=COPY_DELAY_SECONDS) for h in hints]
        failed = self._send(hints)
        report.hints_sent = len(hints) - len(failed)
        # A copy that does not go out is not worth a retry of the whole event: its original did.
        # It is never silent, though: a copy is what reaches a peer when a dead poll swallowed
        # the original.
        copies_failed = len(self._send(copies))
        report.copies_sent = len(copies) - copies_failed
        if copies_failed:
            logger.warning(
                "delayed hint copies not sent",
                extra={"failed": copies_failed, "of": len(copies), "task_arn": stop.task_arn},
            )
        phase("hint")
        if report.killed or report.hints_sent:
            report.outcome = "failed_over"
        if failed:
            raise HintsNotSent(f"{len(failed)} of {len(hints)} hints not sent for {stop.task_arn}")
        return report


    def _send(self, hints: list[Hint]) -> list[Hint]:
        """Send every hint, chunks in parallel; returns the ones that could not be sent."""
        chunks = [hints[i:i + HINT_CHUNK] for i in range(0, len(hints), HINT_CHUNK)]
        if len(chunks) <= 1:
            return self.sender.send_many(hints)
        with ThreadPoolExecutor(max_workers=SEND_THREADS) as pool:
            return [hint for failed in pool.map(self.sender.send_many, chunks) for hint in failed]


@functools.cache
def handler() -> TaskExitHandler:
    """The container's handler: settings and clients built on first use, then reused."""
    settings = Settings.from_env()
    hint_queue_url = settings.require_hint_queue_url()  # checked before any client is made
    return TaskExitHandler(
        LeaseStore.from_settings(settings, client=dynamodb_client()),
        HintSender(sqs_client(), hint_queue_url),
        container_name=settings.worker_container_name,
    )


def reset_dependencies() -> None:
    """Forget the cached clients (the next invocation behaves like a cold start)."""
    handler.cache_clear()


# Clients are built while the environment initialises, not when the first crash arrives: a
# task exit is rare, and the seconds it saves are the point of this function. Without the
# settings or a region (a test importing the module) they are built on first use instead.
with contextlib.suppress(ConfigurationError, BotoCoreError):
    handler()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(capture_cold_start_metric=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """EventBridge target: one ``ECS Task State Change`` event -> the report as a dict."""
    report = handler().handle(event)
    if report.outcome == "invalid":
        logger.warning("task exit event refused", extra={"error": report.error})
    else:
        logger.info("task exit event handled", extra=asdict(report))
    metrics.add_metric(name="TaskExitsFailedOver", unit=MetricUnit.Count, value=len(report.killed))
    metrics.add_metric(name="TaskExitHints", unit=MetricUnit.Count, value=report.hints_sent)
    metrics.add_metric(
        name="TaskExitsIgnored",
        unit=MetricUnit.Count,
        value=int(report.outcome in ("not_stopped", "nothing_to_do", "invalid")),
    )
    return asdict(report)
