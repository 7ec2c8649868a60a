"""The reconciler (lease model v2) against the embedded moto server: worker hints, early hints,
free connections past the grace, no duplicates, dead workers, requests per pass.

Workers are registered with ``register_worker`` and their connections acquired through the
store; the store and the reconciler share a fake clock, so a lease "runs out" when the test
moves the clock, and nothing waits. What a pass sends is read back from the hint queue, and
what it asks DynamoDB and SQS is counted with botocore event hooks on its own clients.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lambda_helpers import control_queue, drain_queue

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import now_ms
from wsfleet.control import control_queue_name
from wsfleet.control_janitor import ControlQueueJanitor
from wsfleet.exceptions import ConfigurationError, StoreError
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.lease import Lease
from wsfleet.reconcile import HintLedger, dead_worker_grace_ms, rehint_after_ms
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.handler_loader import lambda_context, load_function

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
LEASE_MS = 10_000
HEARTBEAT_SECONDS = 2
PASS_MS = 2_000
GRACE_MS = dead_worker_grace_ms(LEASE_MS)
REHINT_MS = rehint_after_ms(30)

reconciler_app = load_function("reconciler")


@dataclass
class FakeClock:
    """Wall clock in epoch ms that moves only when the test says so (starts at the real now,
    so SQS queue ages, which the janitor reads, stay comparable)."""

    now: int = field(default_factory=now_ms)

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Calls:
    """Counts the API calls made through the clients it is attached to (botocore hooks):
    DynamoDB queries by index (``Query:gsi_owner``), everything else by operation; and keeps
    every SendMessageBatch entry."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.entries: list[dict[str, Any]] = []

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-parameter-build", self._seen)
        return client

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        name = model.name
        if name == "Query":
            name = f"Query:{params.get('IndexName', '-')}"
        if name == "SendMessageBatch":
            self.entries.extend(params["Entries"])
        self.counts[name] += 1

    def reset(self) -> None:
        self.counts.clear()
        self.entries.clear()

    def dynamodb(self) -> dict[str, int]:
        sqs = {"ListQueues", "ListQueueTags", "GetQueueAttributes", "DeleteQueue",
               "SendMessageBatch"}
        return {k: v for k, v in self.counts.items() if k not in sqs}


@dataclass
class Rig:
    """A reconciler, the store it uses (same clock), and what they called."""

    aws: Any
    prefix: str
    clock: FakeClock
    calls: Calls
    store: DynamoDBLeaseStore
    sqs: Any
    reconciler: Any

    def new_reconciler(self, *, sender: HintSender | None = None) -> Any:
        """A reconciler as a fresh container builds it (empty ledger and caches)."""
        janitor = ControlQueueJanitor(
            self.sqs, self.store, prefix=self.prefix, grace_ms=GRACE_MS, clock=self.clock
        )
        return reconciler_app.Reconciler(
            self.store,
            sender or HintSender(self.sqs, self.aws.hint_queue_url),
            janitor,
            pass_interval_ms=PASS_MS,
            page_size=500,
            ledger=HintLedger(REHINT_MS),
            clock=self.clock,
        )

    def run_pass(self, reconciler: Any = None) -> Any:
        self.calls.reset()
        return (reconciler or self.reconciler).run_pass()

    def register(self, worker_id: str, *, expires_in_ms: int, queue: bool = False) -> WorkerRecord:
        """A worker item whose lease ends ``expires_in_ms`` from now (optionally with a control
        queue, created and tagged the way the worker does it)."""
        url = control_queue(self.sqs, self.prefix, worker_id) if queue else ""
        now = self.clock()
        worker = WorkerRecord(
            worker_id=worker_id,
            control_queue_url=url,
            started_at_ms=now,
            heartbeat_at_ms=now,
            expires_at_ms=now + expires_in_ms,
            capacity=1_000,
        )
        self.store.register_worker(worker)
        return worker

    def acquired(self, owner: str, *ids: str) -> dict[str, int]:
        """START each connection and acquire it for ``owner``; returns pk -> epoch."""
        epochs = {}
        for cid in ids:
            self.store.start(cid, f"wss://up.example/{cid}")
            record = self.store.acquire(f"CONN#{cid}", owner)
            epochs[record.pk] = record.lease_epoch
        return epochs

    def hints(self) -> list[Hint]:
        """Receive (and delete) every hint visible now (delayed ones are not)."""
        return [Hint.parse(body) for body in drain_queue(self.sqs, self.aws.hint_queue_url)]

    def sent(self) -> dict[str, int]:
        """pk -> DelaySeconds of every hint the last pass sent."""
        return {json.loads(e["MessageBody"])["pk"]: e["DelaySeconds"] for e in self.calls.entries}


@pytest.fixture
def rig(aws: Any) -> Iterator[Rig]:
    prefix = f"r{uuid.uuid4().hex[:8]}-ctl-"
    clock = FakeClock()
    calls = Calls()
    sqs = calls.attach(sqs_client())
    store = DynamoDBLeaseStore(
        calls.attach(dynamodb_client()), aws.connections_table, lease_ms=LEASE_MS, clock=clock
    )
    rig = Rig(aws, prefix, clock, calls, store, sqs, None)
    rig.reconciler = rig.new_reconciler()
    yield rig
    rig.reconciler.close()
    for url in sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)


# ---------------------------------------------------------------- lapsed workers
def test_a_connection_a_lapsed_worker_took_after_the_claim_is_hinted_at_the_next_pass(
    rig: Rig,
) -> None:
    # GIVEN a lapsed worker whose connections were hinted (the claim of its expiry is made)
    rig.register("zombie", expires_in_ms=LEASE_MS)
    first = rig.acquired("zombie", "a")
    rig.clock.advance(LEASE_MS + 1_000)
    rig.run_pass()
    assert {(h.pk, h.epoch) for h in rig.hints()} == set(first.items())
    # WHEN it acquires one more connection before it notices it is dead (a hint it held
    # through a pause), so its expiry (and the claim) stays the same
    later = rig.acquired("zombie", "b")
    rig.clock.advance(PASS_MS)
    report = rig.run_pass().hints
    # THEN that connection is hinted under its epoch at once, without a new claim, and the one
    # already hinted is not hinted again before the rehint interval
    assert {(h.pk, h.epoch) for h in rig.hints()} == set(later.items())
    assert (report.orphans_found, report.hints_sent, report.already_pending) == (2, 1, 1)
    assert rig.calls.counts.get("UpdateItem", 0) == 0
    rig.clock.advance(PASS_MS)
    assert rig.run_pass().hints.hints_sent == 0
    assert rig.hints() == []


def test_an_expired_workers_connections_are_hinted_once_until_the_rehint_interval(
    rig: Rig,
) -> None:
    # GIVEN a worker that crashed (its lease lapsed) owning three connections, and a live one
    rig.register("crashed", expires_in_ms=LEASE_MS)
    rig.register("healthy", expires_in_ms=10 * LEASE_MS)
    crashed = rig.acquired("crashed", "a", "b", "c")
    rig.acquired("healthy", "h1", "h2")
    rig.clock.advance(LEASE_MS + 1_000)

    # WHEN a pass runs
    report = rig.run_pass()

    # THEN the crashed worker's connections are hinted at once with the epochs it held,
    # the live worker's are not, and the connections were read for that one worker only
    assert {(h.pk, h.epoch) for h in rig.hints()} == set(crashed.items())
    assert set(rig.sent().values()) == {0}
    hints = report.hints
    assert (hints.workers_expired, hints.orphans_found, hints.hints_sent) == (1, 3, 3)
    assert hints.oldest_orphan_age_ms == 1_000
    assert rig.calls.counts["Query:gsi_owner"] == 1
    assert rig.calls.counts["UpdateItem"] == 1  # the one claim for this worker expiry

    # WHEN the next pass runs, and a cold reconciler's pass after it
    rig.clock.advance(PASS_MS)
    warm = rig.run_pass().hints
    cold_reconciler = rig.new_reconciler()
    cold = rig.run_pass(cold_reconciler).hints
    cold_reconciler.close()

    # THEN both still see the orphans but neither hints them again: the warm one skips the
    # claim (its ledger), the cold one's claim is refused by DynamoDB
    assert (warm.orphans_found, warm.hints_sent, warm.already_pending) == (3, 0, 1)
    assert (cold.orphans_found, cold.hints_sent, cold.claims_refused) == (3, 0, 1)
    assert rig.hints() == []

    # WHEN the re-hint interval has passed and nobody took them
    rig.clock.advance(REHINT_MS)
    again = rig.run_pass().hints

    # THEN they are hinted once more
    assert again.hints_sent == 3
    assert sorted(h.pk for h in rig.hints()) == sorted(crashed)


def test_an_early_hint_carries_the_delay_to_the_leases_last_second(rig: Rig) -> None:
    # GIVEN a worker that stopped renewing: 4.5 s of its lease are left, less than a pass
    dying = rig.register("dying", expires_in_ms=LEASE_MS)
    epochs = rig.acquired("dying", "x", "y")
    rig.clock.now = dying.expires_at_ms - 4_500

    # WHEN a pass runs, THEN nothing: the lease ends beyond its horizon (the next pass, 2 s)
    report = rig.run_pass().hints
    assert (report.workers_expiring, report.hints_sent) == (0, 0)

    # WHEN a pass runs 1.5 s before the expiry
    rig.clock.now = dying.expires_at_ms - 1_500
    report = rig.run_pass().hints

    # THEN its connections are hinted with a 1 s delay: landing in the last second, after
    # which the receiving worker waits out the rest (EARLY_HINT_MAX_WAIT_MS)
    assert (report.workers_expiring, report.hints_sent, report.orphans_found) == (1, 2, 0)
    assert rig.sent() == dict.fromkeys(epochs, 1)

    # AND the pass after the expiry does not hint the same expiry again
    rig.clock.now = dying.expires_at_ms + 500
    after = rig.run_pass().hints
    assert (after.workers_expired, after.orphans_found, after.hints_sent) == (1, 2, 0)
    assert rig.calls.entries == []


def test_a_live_workers_connections_are_never_hinted(rig: Rig) -> None:
    # GIVEN a worker renewing every heartbeat
    worker = rig.register("alive", expires_in_ms=LEASE_MS)
    rig.acquired("alive", "l1", "l2", "l3")
    # WHEN passes run for several leases
    for _ in range(3 * LEASE_MS // PASS_MS):
        rig.clock.advance(PASS_MS)
        rig.store.renew_worker(
            worker.worker_id, expires_at_ms=rig.clock() + LEASE_MS, connection_count=3
        )
        report = rig.run_pass().hints
        # THEN none of its connections is hinted or even read
        assert (report.workers_expiring, report.hints_sent) == (0, 0)
        assert rig.calls.counts["Query:gsi_owner"] == 0
    assert rig.hints() == []


def test_a_dead_worker_still_owning_connections_is_hinted_now(rig: Rig) -> None:
    # GIVEN a worker a peer killed (it took one connection), with one connection left
    rig.register("killed", expires_in_ms=LEASE_MS)
    epochs = rig.acquired("killed", "k1", "k2")
    rig.register("peer", expires_in_ms=100 * LEASE_MS)
    rig.clock.advance(LEASE_MS + 1)
    rig.store.acquire("CONN#k1", "peer")  # expired owner: killed, then taken
    killed = rig.store.get_worker("killed", consistent=True)
    assert killed is not None and killed.dead

    # WHEN a pass runs, THEN only the connection it still owns is hinted, with no delay
    report = rig.run_pass().hints
    assert (report.orphans_found, report.hints_sent) == (1, 1)
    assert rig.sent() == {"CONN#k2": 0}
    assert [(h.pk, h.epoch) for h in rig.hints()] == [("CONN#k2", epochs["CONN#k2"])]


# ---------------------------------------------------------------- free connections
def test_a_free_started_connection_past_the_grace_is_hinted_once_and_stopped_ones_never(
    rig: Rig,
) -> None:
    # GIVEN connections that became free at t0 (started, or released by their worker) and
    # whose hint was lost, one stopped at t0, and one started later
    rig.register("w", expires_in_ms=100 * LEASE_MS)
    rig.store.start("lost", "wss://up.example/lost")
    rig.store.start("stopped", "wss://up.example/stopped")
    rig.store.stop("CONN#stopped")
    rig.acquired("w", "released")
    record = rig.store.get("CONN#released")
    assert record is not None
    rig.store.release(Lease.of(record))
    grace = rig.reconciler.unowned_grace_ms
    rig.clock.advance(grace)
    rig.store.start("fresh", "wss://up.example/fresh")

    # WHEN a pass runs exactly at the grace: nothing yet (the releaser's hint may be queued)
    assert rig.run_pass().hints.hints_sent == 0

    # WHEN one runs a millisecond after it
    rig.clock.advance(1)
    report = rig.run_pass().hints

    # THEN the two lost ones are hinted (no delay), not the fresh one, never the stopped one
    assert sorted(h.pk for h in rig.hints()) == ["CONN#lost", "CONN#released"]
    assert (report.orphans_found, report.hints_sent) == (2, 2)
    assert report.oldest_orphan_age_ms == grace + 1
    assert rig.calls.counts["Query:gsi_unowned"] == 16

    # AND later passes, warm or cold, do not hint them again within the re-hint interval
    rig.clock.advance(PASS_MS)
    assert rig.run_pass().hints.hints_sent == 1  # "fresh" is past the grace by now
    assert [h.pk for h in rig.hints()] == ["CONN#fresh"]
    cold = rig.new_reconciler()
    rig.clock.advance(PASS_MS)
    again = rig.run_pass(cold).hints
    cold.close()
    assert (again.orphans_found, again.hints_sent, again.claims_refused) == (3, 0, 3)
    assert rig.hints() == []


# ---------------------------------------------------------------- failed sends
def test_hints_that_could_not_be_sent_go_out_on_the_next_pass(rig: Rig) -> None:
    # GIVEN a crashed worker's connection and a free one whose hint was lost
    rig.register("crashed", expires_in_ms=LEASE_MS)
    rig.acquired("crashed", "owned")
    rig.store.start("free", "wss://up.example/free")
    rig.clock.advance(LEASE_MS + rig.reconciler.unowned_grace_ms + 1)
    # ... and a pass whose hints cannot be sent (the queue is not reachable)
    broken = HintSender(rig.sqs, rig.aws.hint_queue_url + "-gone", attempts=1)
    rig.reconciler.sender = broken
    first = rig.run_pass().hints
    assert (first.hints_sent, first.hints_failed) == (0, 2)

    # WHEN the queue is back, well within the re-hint interval
    rig.reconciler.sender = HintSender(rig.sqs, rig.aws.hint_queue_url)
    rig.clock.advance(PASS_MS)
    second = rig.run_pass().hints

    # THEN both go out: the worker's claim was ours (sent without a new claim), the free
    # connection's claim was withdrawn
    assert (second.hints_sent, second.hints_failed) == (2, 0)
    assert sorted(h.pk for h in rig.hints()) == ["CONN#free", "CONN#owned"]


def test_a_failed_index_read_costs_that_worker_a_pass_not_the_others(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two crashed workers, and gsi_owner failing for one of them
    for wid in ("bad", "good"):
        rig.register(wid, expires_in_ms=LEASE_MS)
        rig.acquired(wid, f"{wid}-1")
    rig.clock.advance(LEASE_MS + 1)
    owned_by = rig.store.owned_by

    def failing(owner: str, **kwargs: Any) -> Any:
        if owner == "bad":
            raise StoreError("query on gsi_owner failed: throttled")
        return owned_by(owner, **kwargs)

    monkeypatch.setattr(rig.store, "owned_by", failing)
    # WHEN a pass runs, THEN the other worker's connection is hinted all the same
    report = rig.run_pass().hints
    assert (report.read_errors, report.hints_sent) == (1, 1)
    assert [h.pk for h in rig.hints()] == ["CONN#good-1"]
    # AND once the index answers again, the next pass hints the rest
    monkeypatch.setattr(rig.store, "owned_by", owned_by)
    rig.clock.advance(PASS_MS)
    assert rig.run_pass().hints.hints_sent == 1
    assert [h.pk for h in rig.hints()] == ["CONN#bad-1"]


# ---------------------------------------------------------------- requests per pass
def test_a_steady_pass_reads_workers_not_connections(rig: Rig) -> None:
    # GIVEN one live worker owning 200 connections, nothing expired, nothing free
    rig.register("big", expires_in_ms=100 * LEASE_MS)
    rig.acquired("big", *(f"c{i:03d}" for i in range(200)))
    rig.run_pass()  # the first pass looks up the control queues' tags (cached after)

    # WHEN a pass runs
    rig.clock.advance(PASS_MS)
    report = rig.run_pass()

    # THEN it made a fixed number of requests: the worker list, one BatchGetItem and the 16
    # gsi_unowned shards; no connection was read (no gsi_owner, no gsi_state, no GetItem) and
    # nothing was written or sent
    assert rig.calls.dynamodb() == {"Query:gsi_workers": 1, "BatchGetItem": 1,
                                    "Query:gsi_unowned": 16}
    assert rig.calls.counts["ListQueues"] == 1
    assert sum(rig.calls.counts.values()) == 19
    assert report.hints.hints_sent == 0 and report.hints.workers_seen == 1


# ---------------------------------------------------------------- dead workers
def test_a_dead_workers_item_and_queue_go_only_after_its_connections_were_taken(
    rig: Rig,
) -> None:
    # GIVEN a worker that crashed with two STARTED connections and one that was STOPPED
    # meanwhile (nobody can take that one; it must not keep the item alive forever)
    rig.register("dead", expires_in_ms=LEASE_MS, queue=True)
    rig.acquired("dead", "d1", "d2", "d3")
    rig.store.stop("CONN#d3")
    rig.register("peer", expires_in_ms=1_000 * LEASE_MS, queue=True)
    rig.clock.advance(LEASE_MS + GRACE_MS + 1)  # past the janitor's grace

    # WHEN a pass runs while it still owns connections
    report = rig.run_pass()

    # THEN its connections are hinted and its item and queue stay
    assert report.hints.hints_sent == 2
    assert report.cleanup.workers_deleted == 0
    assert rig.store.get_worker("dead") is not None
    queues = {u.rsplit("/", 1)[-1] for u in rig.sqs.list_queues(
        QueueNamePrefix=rig.prefix).get("QueueUrls", [])}
    assert control_queue_name(rig.prefix, "dead") in queues

    # WHEN a peer took one of them, THEN still nothing goes
    rig.store.acquire("CONN#d1", "peer")
    rig.clock.advance(PASS_MS)
    assert rig.run_pass().cleanup.workers_deleted == 0
    assert rig.store.get_worker("dead") is not None

    # WHEN the peer took the other one too
    rig.store.acquire("CONN#d2", "peer")
    rig.clock.advance(PASS_MS)
    cleanup = rig.run_pass().cleanup

    # THEN its item and its control queue are deleted; the peer's stay
    assert (cleanup.workers_deleted, cleanup.queues_deleted) == (1, 1)
    assert rig.store.get_worker("dead") is None
    assert rig.store.get_worker("peer") is not None
    queues = {u.rsplit("/", 1)[-1] for u in rig.sqs.list_queues(
        QueueNamePrefix=rig.prefix).get("QueueUrls", [])}
    assert queues == {control_queue_name(rig.prefix, "peer")}


def test_a_retired_worker_costs_no_claim_and_goes_after_the_grace(rig: Rig) -> None:
    # GIVEN a worker that released everything and retired
    rig.register("retired", expires_in_ms=LEASE_MS, queue=True)
    rig.store.retire_worker("retired")

    # WHEN passes run within the grace, THEN it is read (it is dead) but nothing is written
    rig.clock.advance(PASS_MS)
    report = rig.run_pass()
    assert (report.hints.workers_expired, report.hints.hints_sent) == (0, 0)
    assert rig.calls.counts["UpdateItem"] == 0
    assert report.cleanup.workers_deleted == 0

    # WHEN a pass runs past the grace, THEN its item and queue go
    rig.clock.advance(GRACE_MS)
    cleanup = rig.run_pass().cleanup
    assert (cleanup.workers_deleted, cleanup.queues_deleted) == (1, 1)
    assert rig.store.get_worker("retired") is None


# ---------------------------------------------------------------- the Lambda handler
@pytest.fixture
def env(aws: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Short lease settings for the handler (real clock); a cold reconciler each test."""
    monkeypatch.setenv("LEASE_SECONDS", str(LEASE_MS / 1000))
    monkeypatch.setenv("HEARTBEAT_EVERY", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("RECONCILE_PASS_SECONDS", str(PASS_MS / 1000))
    monkeypatch.setenv("CONTROL_QUEUE_PREFIX", f"r{uuid.uuid4().hex[:8]}-ctl-")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "wsfleet-reconciler")
    reconciler_app.reset_dependencies()
    yield aws
    reconciler_app.reset_dependencies()


def invoke_one_pass() -> dict[str, Any]:
    """One invocation that has time for exactly one pass (the first always runs)."""
    event = json.loads((EVENTS / "scheduler_reconcile.json").read_text())
    return reconciler_app.lambda_handler(event, lambda_context("reconciler", timeout_ms=1_000))


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


def test_the_handler_runs_a_pass_and_publishes_its_metrics(
    env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN (on the real clock) a worker whose lease ended a minute ago owning two
    # connections, and a connection free for a minute (its hint was lost)
    minute_ago = now_ms() - 60_000
    past = DynamoDBLeaseStore(
        dynamodb_client(), env.connections_table, lease_ms=LEASE_MS, clock=lambda: minute_ago
    )
    past.register_worker(WorkerRecord(
        worker_id="gone", control_queue_url="", started_at_ms=minute_ago - LEASE_MS,
        heartbeat_at_ms=minute_ago - LEASE_MS, expires_at_ms=minute_ago,
    ))
    for cid in ("g1", "g2", "lost"):
        past.start(cid, f"wss://up.example/{cid}")
    past.acquire("CONN#g1", "gone")
    past.acquire("CONN#g2", "gone")

    # WHEN the scheduler invokes the reconciler (sample event) for one pass
    began = time.perf_counter()
    result = invoke_one_pass()
    invocation_ms = (time.perf_counter() - began) * 1000

    # THEN all three were hinted
    assert (result["passes"], result["workers_expired"]) == (1, 1)
    assert (result["orphans_found"], result["hints_sent"]) == (3, 3)
    # AND the pass published its metrics
    (pass_metrics, *_rest) = emf_documents(capsys.readouterr().out)
    assert pass_metrics["WorkersExpired"] == 1
    assert pass_metrics["WorkersExpiring"] == 0
    assert pass_metrics["OrphansFound"] == 3
    assert pass_metrics["HintsSent"] == 3
    assert pass_metrics["OldestOrphanAgeMs"] >= 60_000
    # a consistency bound, not a speed target: the pass took no longer than the call that ran it
    assert 0 <= pass_metrics["PassMs"] <= round(invocation_ms) + 1
    assert pass_metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "wsfleet"


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_pass_interval_that_would_hint_live_leases_is_refused(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lease 10 s - heartbeat 2 s = 8 s: an 8 s pass would put freshly renewed leases in the window
    monkeypatch.setenv("RECONCILE_PASS_SECONDS", "8")
    reconciler_app.reset_dependencies()
    with pytest.raises(ConfigurationError, match="RECONCILE_PASS_SECONDS"):
        invoke_one_pass()


def test_a_multi_pass_invocation_hints_each_orphan_once(env: Any) -> None:
    # GIVEN (real clock) a worker whose lease ended a minute ago owning three connections
    minute_ago = now_ms() - 60_000
    past = DynamoDBLeaseStore(
        dynamodb_client(), env.connections_table, lease_ms=LEASE_MS, clock=lambda: minute_ago
    )
    past.register_worker(WorkerRecord(
        worker_id="gone", control_queue_url="", started_at_ms=minute_ago,
        heartbeat_at_ms=minute_ago, expires_at_ms=minute_ago,
    ))
    for cid in ("m1", "m2", "m3"):
        past.start(cid, f"wss://up.example/{cid}")
        past.acquire(f"CONN#{cid}", "gone")
    # WHEN one invocation runs several passes (2 s apart)
    started = time.monotonic()
    result = reconciler_app.lambda_handler(
        json.loads((EVENTS / "scheduler_reconcile.json").read_text()),
        lambda_context("reconciler", timeout_ms=9_000),
    )
    # THEN every pass saw the orphans but they were hinted once
    assert result["passes"] >= 2, time.monotonic() - started
    assert (result["orphans_found"], result["hints_sent"]) == (3, 3)


# ---------------------------------------------------------------- the fleet view
def test_each_pass_writes_the_fleet_view_and_a_new_plan_only_once_the_last_settled(
    rig: Rig,
) -> None:
    # GIVEN a reconciler that rebalances, a worker holding 10 and a new, empty one
    policy = reconciler_app.RebalancePolicy(max_moves=3, band_percent=10, act_ms=4_000)
    reconciler = rig.new_reconciler()
    reconciler.rebalance = policy
    rig.register("old", expires_in_ms=10 * LEASE_MS)
    new = rig.register("new", expires_in_ms=10 * LEASE_MS, queue=True)
    rig.store.renew_worker("old", expires_at_ms=rig.clock() + 10 * LEASE_MS, connection_count=10)

    # WHEN a pass runs
    report = rig.run_pass(reconciler)
    requests = dict(rig.calls.counts)

    # THEN its view asks the loaded worker for its bound, addressed to the new one's queue,
    # at the cost of one read and one write
    view = rig.store.get_fleet_view(consistent=True)
    assert view is not None and report.rebalance_moves == 3
    assert [(m.giver, m.taker, m.count) for m in view.moves] == [("old", "new", 3)]
    assert dict(view.queues) == {"new": new.control_queue_url}
    assert dict(view.targets) == {"old": 5, "new": 5}
    assert (view.workers, view.held, view.best_free) == (2, 10, 1_000)
    assert (requests["PutItem"], requests["GetItem"]) == (1, 1)

    # WHEN the next pass comes before the workers reported the hand-off
    rig.clock.advance(PASS_MS)
    kept = rig.run_pass(reconciler)
    # THEN the plan stays as it was (the workers act on a plan once)
    again = rig.store.get_fleet_view(consistent=True)
    assert again is not None and kept.rebalance_moves == 3
    assert (again.plan_at_ms, again.moves) == (view.plan_at_ms, view.moves)

    # WHEN both have heartbeated after the plan was carried out
    rig.clock.advance(policy.act_ms)
    rig.store.renew_worker("old", expires_at_ms=rig.clock() + 10 * LEASE_MS, connection_count=7)
    rig.store.renew_worker("new", expires_at_ms=rig.clock() + 10 * LEASE_MS, connection_count=3)
    rig.clock.advance(1)
    rig.run_pass(reconciler)
    # THEN a new plan is made from the counts as they stand
    fresh = rig.store.get_fleet_view(consistent=True)
    assert fresh is not None and fresh.plan_at_ms > view.plan_at_ms
    assert [(m.giver, m.taker, m.count) for m in fresh.moves] == [("old", "new", 1)]
    reconciler.close()


def test_a_plan_asks_no_giver_for_more_than_its_heartbeat_says_it_may_move(rig: Rig) -> None:
    # GIVEN three workers above their share of 5, the first holding only connections moved
    # within the dwell time (its heartbeat says 0 movable), and an empty one
    reconciler = rig.new_reconciler()
    reconciler.rebalance = reconciler_app.RebalancePolicy(
        max_moves=20, band_percent=10, act_ms=4_000
    )
    expires = rig.clock() + 10 * LEASE_MS
    for wid, held, movable in (("a", 7, 0), ("b", 7, 7), ("c", 6, None)):
        rig.register(wid, expires_in_ms=10 * LEASE_MS)
        rig.store.renew_worker(
            wid, expires_at_ms=expires, connection_count=held, movable_count=movable
        )
    rig.register("d", expires_in_ms=10 * LEASE_MS, queue=True)
    assert rig.store.get_workers(["a"])["a"].movable_count == 0
    # WHEN a pass plans
    rig.run_pass(reconciler)
    # THEN the moves come from the others (c reported no count: all of its may move)
    view = rig.store.get_fleet_view(consistent=True)
    assert view is not None
    assert [(m.giver, m.taker, m.count) for m in view.moves] == [("b", "d", 2), ("c", "d", 1)]
    reconciler.close()


def test_without_rebalancing_no_view_is_written(rig: Rig) -> None:
    rig.register("w", expires_in_ms=LEASE_MS)
    rig.run_pass()
    assert rig.store.get_fleet_view(consistent=True) is None
    assert "PutItem" not in rig.calls.counts
