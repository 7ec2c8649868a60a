"""wsfleet.reconcile dead-worker decisions: which control queues and worker items go.

Pure: queues as listed, worker items as read, and a clock reading in; verdicts out.
"""

from __future__ import annotations

import pytest

from wsfleet.reconcile import (
    CleanupAction,
    ControlQueue,
    QueueVerdict,
    dead_worker_grace_ms,
    judge_control_queue,
    plan_cleanup,
    queue_name_of,
    worker_id_from_queue_name,
)
from wsfleet.record import WorkerRecord

NOW = 10_000_000
LEASE_MS = 20_000
GRACE = dead_worker_grace_ms(LEASE_MS)
PREFIX = "app-ctl-"
BASE = "http://127.0.0.1:5000/123456789012/"


def queue(
    worker_id: str | None, *, created: int | None = None, name: str | None = None
) -> ControlQueue:
    return ControlQueue(BASE + (name or f"{PREFIX}{worker_id}"), worker_id, created)


def worker(worker_id: str, *, expires: int, queue_name: str | None = None) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        control_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/"
        + (queue_name or f"{PREFIX}{worker_id}"),
        started_at_ms=NOW - 3_600_000,
        heartbeat_at_ms=expires - LEASE_MS,
        expires_at_ms=expires,
    )


def test_grace_is_two_leases() -> None:
    assert dead_worker_grace_ms(20_000) == 40_000


# ---------------------------------------------------------------- one queue
@pytest.mark.parametrize(
    ("expires", "verdict"),
    [
        (NOW + 5_000, QueueVerdict.KEEP),  # alive
        (NOW - 1, QueueVerdict.KEEP),  # just missed a heartbeat: maybe paused, not dead
        (NOW - GRACE, QueueVerdict.KEEP),  # exactly at the grace boundary
        (NOW - GRACE - 1, QueueVerdict.DELETE_WORKER),  # expired for longer than the grace
    ],
)
def test_a_queue_with_its_worker_item_follows_the_item_expiry(
    expires: int, verdict: QueueVerdict
) -> None:
    # The worker item compares by queue *name*: endpoints spell the host differently.
    assert (
        judge_control_queue(queue("w1"), worker("w1", expires=expires), now_ms=NOW, grace_ms=GRACE)
        is verdict
    )


def test_a_queue_without_a_worker_item_needs_its_age_first() -> None:
    assert (
        judge_control_queue(queue("w1"), None, now_ms=NOW, grace_ms=GRACE) is QueueVerdict.NEED_AGE
    )


@pytest.mark.parametrize(
    ("created", "verdict"),
    [
        (NOW - 1_000, QueueVerdict.KEEP),  # worker is starting: queue made, item not yet
        (NOW - GRACE, QueueVerdict.KEEP),
        (NOW - GRACE - 1, QueueVerdict.DELETE_QUEUE),  # nobody registered it: a leftover
    ],
)
def test_a_queue_without_a_worker_item_is_judged_by_its_age(
    created: int, verdict: QueueVerdict
) -> None:
    assert (
        judge_control_queue(queue("w1", created=created), None, now_ms=NOW, grace_ms=GRACE)
        is verdict
    )


def test_a_queue_whose_worker_item_names_another_queue_is_a_leftover() -> None:
    # GIVEN a live worker item that points at a different control queue
    live_elsewhere = worker("w1", expires=NOW + 5_000, queue_name=f"{PREFIX}w1-new")
    # THEN this queue is judged like an unowned one (by age) and the live item is never touched
    young = queue("w1", created=NOW - 1_000)
    old = queue("w1", created=NOW - GRACE - 1)
    assert (
        judge_control_queue(young, live_elsewhere, now_ms=NOW, grace_ms=GRACE) is QueueVerdict.KEEP
    )
    assert (
        judge_control_queue(old, live_elsewhere, now_ms=NOW, grace_ms=GRACE)
        is QueueVerdict.DELETE_QUEUE
    )


# ---------------------------------------------------------------- a whole pass
def test_plan_deletes_dead_workers_with_their_items_and_leftovers_without() -> None:
    queues = [
        queue("alive"),
        queue("dead"),
        queue("orphan-queue", created=NOW - GRACE - 10),
        queue("starting", created=NOW - 10),
        queue("unknown"),  # no item, age not known yet
    ]
    workers = {
        "alive": worker("alive", expires=NOW + 1_000),
        "dead": worker("dead", expires=NOW - GRACE - 5_000),
    }
    plan = plan_cleanup(queues, workers, now_ms=NOW, grace_ms=GRACE, max_deletions=10)
    assert plan.actions == (
        CleanupAction(BASE + f"{PREFIX}dead", "dead", QueueVerdict.DELETE_WORKER),
        CleanupAction(BASE + f"{PREFIX}orphan-queue", None, QueueVerdict.DELETE_QUEUE),
    )
    assert [q.worker_id for q in plan.need_age] == ["unknown"]
    assert plan.kept == 2
    assert plan.deferred == 0


def test_plan_caps_deletions_per_pass() -> None:
    queues = [queue(f"dead{i}") for i in range(5)]
    workers = {f"dead{i}": worker(f"dead{i}", expires=NOW - GRACE - 1) for i in range(5)}
    plan = plan_cleanup(queues, workers, now_ms=NOW, grace_ms=GRACE, max_deletions=2)
    assert [a.worker_id for a in plan.actions] == ["dead0", "dead1"]
    assert plan.deferred == 3


def test_plan_with_no_queue_worker_id_judges_by_age_only() -> None:
    q = ControlQueue(BASE + "app-ctl-", None, NOW - GRACE - 1)
    plan = plan_cleanup([q], {}, now_ms=NOW, grace_ms=GRACE, max_deletions=1)
    assert plan.actions == (CleanupAction(q.url, None, QueueVerdict.DELETE_QUEUE),)


# ---------------------------------------------------------------- names
def test_queue_name_is_the_last_path_segment() -> None:
    assert queue_name_of("https://sqs.eu-west-1.amazonaws.com/1/app-ctl-w1") == "app-ctl-w1"
    assert queue_name_of("http://localhost:4566/000000000000/app-ctl-w1/") == "app-ctl-w1"


def test_worker_id_from_queue_name_strips_the_prefix() -> None:
    assert worker_id_from_queue_name(PREFIX, "app-ctl-host-12-ab") == "host-12-ab"
    assert worker_id_from_queue_name(PREFIX, "app-ctl-") is None
    assert worker_id_from_queue_name(PREFIX, "other-queue") is None
