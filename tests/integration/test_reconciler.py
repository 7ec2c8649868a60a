"""The reconciler handler against the embedded moto server: hints, no duplicates, dead workers.

Leases are short (10 s, heartbeat 2 s, a pass every 2 s) and the lease states are written with
a LeaseStore whose clock is set in the past, so nothing waits for a lease to run out except the
one test that checks a delayed hint really lands after its lease expired. That test also pins
the reconciler's clock, so a slow machine cannot turn its "expiring" lease into an orphan
before the pass looks at it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.control import WORKER_ID_TAG, control_queue_name
from wsfleet.exceptions import ConfigurationError, LeaseConflict
from wsfleet.hints import Hint, HintSender
from wsfleet.lease import EARLY_HINT_MAX_WAIT_MS, acquire_wait_ms
from wsfleet.record import WorkerRecord
from wsfleet.settings import Settings
from wsfleet.store import DynamoDBLeaseStore, LeaseStore
from wsfleet_local.functions import lambda_context, load_function

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
LEASE_MS = 10_000
HEARTBEAT_SECONDS = 2
PASS_MS = 2_000

reconciler_app = load_function("reconciler")


@dataclass(frozen=True)
class Env:
    """The test's resources plus its control queue prefix."""

    aws: Any
    control_prefix: str

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aws, name)


@pytest.fixture
def env(aws, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """Short lease settings and a per-test control queue prefix; a cold reconciler each test."""
    prefix = f"r{uuid.uuid4().hex[:8]}-ctl-"
    monkeypatch.setenv("LEASE_SECONDS", str(LEASE_MS / 1000))
    monkeypatch.setenv("HEARTBEAT_EVERY", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("RECONCILE_PASS_SECONDS", str(PASS_MS / 1000))
    monkeypatch.setenv("CONTROL_QUEUE_PREFIX", prefix)
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "wsfleet-reconciler")
    reconciler_app.reset_dependencies()
    yield Env(aws, prefix)
    reconciler_app.reset_dependencies()
    sqs = boto3.client("sqs")
    for url in sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)


def store_at(aws: Any, at_ms: int | None = None) -> LeaseStore:
    """A LeaseStore whose clock reads ``at_ms`` (None: the real clock)."""
    clock = (lambda: at_ms) if at_ms is not None else now_ms
    return DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock)


def scheduler_event() -> dict[str, Any]:
    return json.loads((EVENTS / "scheduler_reconcile.json").read_text())


def invoke_one_pass() -> dict[str, Any]:
    """One invocation that has time for exactly one pass (the first always runs)."""
    return reconciler_app.lambda_handler(
        scheduler_event(), lambda_context("reconciler", timeout_ms=1_000)
    )


def queue_depth(queue_url: str) -> int:
    """Every message the queue holds: visible, in flight and delayed."""
    attributes = boto3.client("sqs").get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(value) for value in attributes.values())


def receive_hints(queue_url: str, *, expect: int = 0, wait_seconds: float = 0) -> list[Hint]:
    """Receive (and delete) hints: everything visible now, or long-poll until ``expect`` came.

    Gives up ``wait_seconds`` after the call (a hint that never comes fails the caller's
    assertion, it does not hang the test).
    """
    sqs = boto3.client("sqs")
    deadline = time.monotonic() + wait_seconds
    hints: list[Hint] = []
    while True:
        remaining = deadline - time.monotonic()
        wait = 0 if len(hints) >= expect else max(0, min(20, round(remaining)))
        messages = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait
        ).get("Messages", [])
        for message in messages:
            hints.append(Hint.parse(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        if not messages and (len(hints) >= expect or time.monotonic() >= deadline):
            return hints


def emf_documents(stdout: str) -> list[dict[str, Any]]:
    """The CloudWatch EMF documents Powertools printed (one per pass, plus the final one)."""
    documents = []
    for line in stdout.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            document = json.loads(line)
            for name, value in document.items():  # Powertools writes each value as a list
                if isinstance(value, list) and len(value) == 1:
                    document[name] = value[0]
            documents.append(document)
    return documents


@pytest.fixture
def pinned_now(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The handler's reconciler reads a clock stopped at the returned moment; passes of 6 s."""
    monkeypatch.setenv("RECONCILE_PASS_SECONDS", "6")
    pinned = now_ms()
    instance = reconciler_app.Reconciler.from_settings(Settings.from_env(), clock=lambda: pinned)
    cached = reconciler_app.reconciler
    reconciler_app.reconciler = lambda: instance
    yield pinned
    reconciler_app.reconciler = cached
    instance.close()


# ---------------------------------------------------------------- hints
def test_a_pass_hints_orphans_now_and_expiring_leases_to_land_in_their_last_second(
    env, pinned_now: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN connections in every lease state (the pass will run "at" pinned_now, horizon +6 s)
    now = pinned_now
    store_at(env).start("free", "wss://up.example/free")  # never acquired: expiry 0
    for cid in ("crashed", "expiring", "live"):
        store_at(env).start(cid, f"wss://up.example/{cid}")
    store_at(env, now - 16_000).acquire("CONN#crashed", "dead-worker")  # expired 6 s ago
    expiring = store_at(env, now - 5_500).acquire("CONN#expiring", "dying-worker")  # 4.5 s left
    store_at(env).acquire("CONN#live", "healthy-worker")  # 10 s left: beyond the horizon
    store_at(env).start("stopped", "wss://up.example/stopped")
    store_at(env).stop("CONN#stopped")

    # WHEN the scheduler invokes the reconciler (sample event) for one pass
    result = invoke_one_pass()

    # THEN both orphans and the expiring lease were hinted, nothing else
    assert result["passes"] == 1
    assert result["orphans_found"] == 2
    assert result["hints_sent"] == 3
    # ... the orphans' hints are visible at once, the early one is still delayed
    immediate = receive_hints(env.hint_queue_url)
    assert sorted(h.pk for h in immediate) == ["CONN#crashed", "CONN#free"]
    assert queue_depth(env.hint_queue_url) == 1
    # ... and becomes visible in the lease's last second (4.5 s left: a 4 s delay)
    (delayed,) = receive_hints(env.hint_queue_url, expect=1, wait_seconds=15)
    assert delayed.pk == "CONN#expiring"
    assert delayed.epoch == expiring.lease_epoch
    # ... so a peer acting on it as the worker does (wait out the rest of the lease, if any,
    # then acquire) wins the lease without waiting for another pass
    peer = store_at(env)
    try:
        taken = peer.acquire(delayed.pk, "peer-worker")
    except LeaseConflict as early:
        wait_ms = acquire_wait_ms(early.current, "peer-worker", now_ms(), EARLY_HINT_MAX_WAIT_MS)
        assert wait_ms is not None, early.current  # not a live lease: one about to lapse
        time.sleep(wait_ms / 1000)
        taken = peer.acquire(delayed.pk, "peer-worker")
    assert (taken.lease_owner, taken.lease_epoch) == ("peer-worker", expiring.lease_epoch + 1)

    # AND the pass published its metrics
    (pass_metrics, *_rest) = emf_documents(capsys.readouterr().out)
    assert pass_metrics["OrphansFound"] == 2
    assert pass_metrics["ExpiringFound"] == 1
    assert pass_metrics["HintsSent"] == 3
    assert pass_metrics["OldestOrphanAgeMs"] == 6_000
    assert pass_metrics["PassMs"] >= 0
    assert pass_metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "wsfleet"


def test_hints_are_not_duplicated_across_passes_warm_or_cold(env) -> None:
    # GIVEN five orphans and one lease about to expire
    now = now_ms()
    orphans = [f"CONN#o{i}" for i in range(5)]
    for pk in orphans:
        store_at(env).start(pk.removeprefix("CONN#"), "wss://up.example/o")
        store_at(env, now - 2 * LEASE_MS).acquire(pk, "dead-worker")
    store_at(env).start("soon", "wss://up.example/soon")
    store_at(env, now - LEASE_MS + 500).acquire("CONN#soon", "dying-worker")

    # WHEN several passes run: one invocation with several passes, another warm one, then a
    # cold container (empty ledger, so only DynamoDB's claim stands between it and a duplicate)
    multi = reconciler_app.lambda_handler(
        scheduler_event(), lambda_context("reconciler", timeout_ms=7_000)
    )
    warm = invoke_one_pass()
    reconciler_app.reset_dependencies()
    cold = invoke_one_pass()

    # THEN every pass saw the orphans, but each was hinted exactly once
    assert multi["passes"] >= 2
    assert multi["hints_sent"] == 6
    assert warm["hints_sent"] == 0 and warm["orphans_found"] >= 5
    assert cold["hints_sent"] == 0 and cold["orphans_found"] >= 5
    # ... the queue holds one pending hint per orphan (visible, in flight or delayed)
    assert queue_depth(env.hint_queue_url) == 6
    hints = receive_hints(env.hint_queue_url, expect=6, wait_seconds=10)
    assert sorted(h.pk for h in hints) == sorted([*orphans, "CONN#soon"])


def test_a_stale_claim_is_hinted_again(env, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an orphan that was hinted, and that hint was consumed without an acquire
    now = now_ms()
    store_at(env).start("lost", "wss://up.example/lost")
    store_at(env, now - 2 * LEASE_MS).acquire("CONN#lost", "dead-worker")
    assert invoke_one_pass()["hints_sent"] == 1
    assert [h.pk for h in receive_hints(env.hint_queue_url)] == ["CONN#lost"]

    # WHEN the re-hint interval has passed (a 1 ms interval stands in for the real 60 s)
    reconciler = reconciler_app.reconciler()
    monkeypatch.setattr(reconciler.ledger, "rehint_after_ms", 1)
    time.sleep(0.01)

    # THEN the next pass hints it again, once
    assert invoke_one_pass()["hints_sent"] == 1
    assert [h.pk for h in receive_hints(env.hint_queue_url)] == ["CONN#lost"]


def test_a_hint_that_could_not_be_sent_goes_out_on_the_next_pass(env, monkeypatch) -> None:
    # GIVEN an orphan, and a pass whose hint cannot be sent (the queue is not reachable)
    now = now_ms()
    store_at(env).start("unsent", "wss://up.example/unsent")
    store_at(env, now - 2 * LEASE_MS).acquire("CONN#unsent", "dead-worker")
    reconciler = reconciler_app.reconciler()
    working = reconciler.sender
    broken = HintSender(boto3.client("sqs"), env.hint_queue_url + "-gone", attempts=1)
    monkeypatch.setattr(reconciler, "sender", broken)
    first = invoke_one_pass()
    assert (first["hints_sent"], first["hints_failed"]) == (0, 1)
    assert queue_depth(env.hint_queue_url) == 0

    # WHEN the queue is back, well within the re-hint interval (60 s)
    monkeypatch.setattr(reconciler, "sender", working)

    # THEN the next pass sends the hint: the failed send withdrew its claim
    assert invoke_one_pass()["hints_sent"] == 1
    assert [h.pk for h in receive_hints(env.hint_queue_url)] == ["CONN#unsent"]


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_pass_interval_that_would_hint_live_leases_is_refused(
    env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lease 10 s - heartbeat 2 s = 8 s: an 8 s pass would put freshly renewed leases in the window
    monkeypatch.setenv("RECONCILE_PASS_SECONDS", "8")
    reconciler_app.reset_dependencies()
    with pytest.raises(ConfigurationError, match="RECONCILE_PASS_SECONDS"):
        invoke_one_pass()


# ---------------------------------------------------------------- dead workers
def make_worker(env: Any, worker_id: str, *, expires_at_ms: int | None, tag: bool = True) -> str:
    """A control queue (tagged like the worker tags it) and, unless expires is None, its item."""
    sqs = boto3.client("sqs")
    name = control_queue_name(env.control_prefix, worker_id)
    url = sqs.create_queue(QueueName=name, tags={WORKER_ID_TAG: worker_id} if tag else {})[
        "QueueUrl"
    ]
    if expires_at_ms is not None:
        now = now_ms()
        store_at(env).register_worker(
            WorkerRecord(
                worker_id=worker_id,
                control_queue_url=url,
                started_at_ms=now - 600_000,
                heartbeat_at_ms=expires_at_ms - LEASE_MS,
                expires_at_ms=expires_at_ms,
            )
        )
    return url


def control_queues(env: Any) -> set[str]:
    urls = boto3.client("sqs").list_queues(QueueNamePrefix=env.control_prefix).get("QueueUrls", [])
    return {url.rsplit("/", 1)[-1] for url in urls}


def test_a_dead_workers_queue_and_item_are_removed_and_live_ones_kept(env) -> None:
    # GIVEN a live worker, one whose item expired three leases ago (grace is two), one that
    # missed a single heartbeat, and one that is starting (queue made, item not yet written)
    now = now_ms()
    make_worker(env, "live.host-1", expires_at_ms=now + LEASE_MS)
    make_worker(env, "dead.host-2", expires_at_ms=now - 3 * LEASE_MS)
    make_worker(env, "late.host-3", expires_at_ms=now - LEASE_MS // 2)
    make_worker(env, "starting.host-4", expires_at_ms=None)
    store = store_at(env)

    # WHEN a pass runs
    result = invoke_one_pass()

    # THEN only the dead worker's queue and item are gone
    assert result["control_queues_deleted"] == 1
    assert result["workers_deleted"] == 1
    prefix = env.control_prefix
    assert control_queues(env) == {
        control_queue_name(prefix, w) for w in ("live.host-1", "late.host-3", "starting.host-4")
    }
    assert store.get_worker("dead.host-2") is None
    assert store.get_worker("live.host-1") is not None
    assert store.get_worker("late.host-3") is not None

    # AND a second pass (warm caches) deletes nothing more
    again = invoke_one_pass()
    assert again["control_queues_deleted"] == 0
    assert len(control_queues(env)) == 3


def test_leftover_queues_without_a_worker_item_go_once_past_the_grace(env) -> None:
    # GIVEN a queue nobody registered (tagged) and an untagged one, both created just now
    make_worker(env, "never-registered", expires_at_ms=None)
    make_worker(env, "untagged", expires_at_ms=None, tag=False)
    live = make_worker(env, "live", expires_at_ms=now_ms() + 3_600_000)
    store = store_at(env)
    sqs = boto3.client("sqs")

    def janitor(clock_ms: int) -> Any:
        return reconciler_app.ControlQueueJanitor(
            sqs, store, prefix=env.control_prefix, grace_ms=2 * LEASE_MS, clock=lambda: clock_ms
        )

    # WHEN a janitor looks now, nothing is old enough to be a leftover
    assert janitor(now_ms()).sweep().queues_deleted == 0
    assert len(control_queues(env)) == 3

    # WHEN one looks after the grace period (a clock set ahead stands in for waiting)
    report = janitor(now_ms() + 2 * LEASE_MS + 1_000).sweep()

    # THEN both leftovers are deleted; the live worker (whose item is valid for an hour) is not
    assert (report.queues_seen, report.queues_deleted, report.workers_deleted) == (3, 2, 0)
    assert control_queues(env) == {live.rsplit("/", 1)[-1]}


def test_cleanup_work_per_pass_is_capped(env) -> None:
    # GIVEN five dead workers and a janitor allowed two deletions and four lookups per pass
    for i in range(5):
        make_worker(env, f"dead-{i}", expires_at_ms=now_ms() - 3 * LEASE_MS)
    janitor = reconciler_app.ControlQueueJanitor(
        boto3.client("sqs"),
        store_at(env),
        prefix=env.control_prefix,
        grace_ms=2 * LEASE_MS,
        max_lookups=4,
        max_deletions=2,
    )
    # WHEN passes run, THEN each removes at most two and together they remove all five
    deleted = []
    for _ in range(4):
        report = janitor.sweep()
        assert report.queues_deleted <= 2
        deleted.append(report.workers_deleted)
    assert deleted == [2, 2, 1, 0]
    assert control_queues(env) == set()
