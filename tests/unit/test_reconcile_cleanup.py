"""wsfleet.reconcile dead-worker decisions: which worker items and control queues go.

Pure: worker items as read, whether gsi_owner shows them owning anything, queues as listed,
and a clock reading in; verdicts out.
"""

from __future__ import annotations

import pytest

from wsfleet.control import queue_name_of, worker_id_from_queue_name
from wsfleet.reconcile import (
    CleanupAction,
    ControlQueue,
    QueueVerdict,
    WorkerVerdict,
    dead_worker_grace_ms,
    judge_control_queue,
    judge_worker_item,
    plan_cleanup,
    plan_worker_cleanup,
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


def worker(
    worker_id: str, *, expires: int, queue_name: str | None = None, dead_at: int | None = None
) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        control_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/"
        + (queue_name or f"{PREFIX}{worker_id}"),
        started_at_ms=NOW - 3_600_000,
        heartbeat_at_ms=expires - LEASE_MS,
        expires_at_ms=expires,
        dead_at_ms=dead_at,
    )


def test_grace_is_two_leases() -> None:
    assert dead_worker_grace_ms(20_000) == 40_000


# ---------------------------------------------------------------- worker items
@pytest.mark.parametrize(
    ("expires", "dead_at", "owns", "verdict"),
    [
        (NOW + 5_000, None, None, WorkerVerdict.KEEP),  # alive
        (NOW - 1, None, False, WorkerVerdict.KEEP),  # just missed a heartbeat: maybe paused
        (NOW - GRACE, None, False, WorkerVerdict.KEEP),  # exactly at the grace boundary
        (NOW - GRACE, NOW - 1, False, WorkerVerdict.KEEP),  # killed, but ended within the grace
        (NOW - GRACE - 1, None, None, WorkerVerdict.CHECK_OWNED),  # past it: ask gsi_owner
        (NOW - GRACE - 1, None, True, WorkerVerdict.KEEP),  # still owns connections
        (NOW - GRACE - 1, None, False, WorkerVerdict.DELETE),  # gone and owns nothing
        (NOW - GRACE - 1, NOW - 5, True, WorkerVerdict.KEEP),  # killed, not all taken yet
        (NOW - GRACE - 1, NOW - 5, False, WorkerVerdict.DELETE),
    ],
)
def test_a_worker_item_goes_only_past_the_grace_and_once_it_owns_nothing(
    expires: int, dead_at: int | None, owns: bool | None, verdict: WorkerVerdict
) -> None:
    item = worker("w1", expires=expires, dead_at=dead_at)
    assert judge_worker_item(item, now_ms=NOW, grace_ms=GRACE, owns_connections=owns) is verdict


def test_the_worker_cleanup_picks_the_longest_gone_first_and_caps_per_pass() -> None:
    workers = [
        worker("alive", expires=NOW + 1_000),
        worker("recent", expires=NOW - GRACE + 10),
        worker("gone-2", expires=NOW - GRACE - 2_000),
        worker("gone-1", expires=NOW - GRACE - 9_000, dead_at=NOW - GRACE),
        worker("gone-3", expires=NOW - GRACE - 1),
    ]
    picked, deferred = plan_worker_cleanup(workers, now_ms=NOW, grace_ms=GRACE, max_deletions=2)
    assert [w.worker_id for w in picked] == ["gone-1", "gone-2"]
    assert deferred == 1


# ---------------------------------------------------------------- one queue
@pytest.mark.parametrize(
    "expires",
    [NOW + 5_000, NOW - 1, NOW - GRACE - 1, NOW - 100 * GRACE],
)
def test_a_queue_named_by_its_worker_item_is_kept_whatever_the_item_says(expires: int) -> None:
    # It goes together with the item (judge_worker_item), never before: the item may have to
    # outlive its lease while its connections are taken over. The item compares by queue
    # *name*: endpoints spell the host differently.
    assert (
        judge_control_queue(queue("w1"), worker("w1", expires=expires), now_ms=NOW, grace_ms=GRACE)
        is QueueVerdict.KEEP
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
def test_plan_deletes_leftover_queues_only() -> None:
    queues = [
        queue("alive"),
        queue("dead"),  # its item goes first (with this queue): see the worker cleanup
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
        CleanupAction(BASE + f"{PREFIX}orphan-queue", QueueVerdict.DELETE_QUEUE),
    )
    assert [q.worker_id for q in plan.need_age] == ["unknown"]
    assert plan.kept == 3
    assert plan.deferred == 0


def test_plan_caps_deletions_per_pass() -> None:
    queues = [queue(f"left{i}", created=NOW - GRACE - 1) for i in range(5)]
    plan = plan_cleanup(queues, {}, now_ms=NOW, grace_ms=GRACE, max_deletions=2)
    assert [a.queue_url for a in plan.actions] == [BASE + f"{PREFIX}left{i}" for i in range(2)]
    assert plan.deferred == 3


def test_plan_with_no_queue_worker_id_judges_by_age_only() -> None:
    q = ControlQueue(BASE + "app-ctl-", None, NOW - GRACE - 1)
    plan = plan_cleanup([q], {}, now_ms=NOW, grace_ms=GRACE, max_deletions=1)
    assert plan.actions == (CleanupAction(q.url, QueueVerdict.DELETE_QUEUE),)


# ---------------------------------------------------------------- names
def test_queue_name_is_the_last_path_segment() -> None:
    assert queue_name_of("https://sqs.eu-west-1.amazonaws.com/1/app-ctl-w1") == "app-ctl-w1"
    assert queue_name_of("http://localhost:4566/000000000000/app-ctl-w1/") == "app-ctl-w1"


def test_worker_id_from_queue_name_strips_the_prefix() -> None:
    assert worker_id_from_queue_name(PREFIX, "app-ctl-host-12-ab") == "host-12-ab"
    assert worker_id_from_queue_name(PREFIX, "app-ctl-") is None
    assert worker_id_from_queue_name(PREFIX, "other-queue") is None
