"""The hint poller over the in-memory lease store and an in-memory SQS double.

The real :class:`~wsfleet_worker.poller.HintPoller`, its :class:`~wsfleet_worker.sqs_consumer.
QueueConsumer` and a real :class:`~wsfleet_worker.taking.LeaseTaker` acquiring in
:class:`wsfleet.memstore.InMemoryLeaseStore`; only SQS (:class:`memory_sqs.MemorySqs`) and the
sessions (a started connection is recorded, not streamed) stand in. What is covered is the
receive loop the poller shares with the control channel and what a hint comes to: acquired and
started, deleted in one batch per round; unusable, duplicate or refused hints deleted and
counted; a failing hint left for redelivery; no more received than there is room for; a
failing receive backed off and retried; a batch that arrives after stop given back.
Each test reads GIVEN / WHEN / THEN.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from memory_sqs import MemorySqs
from worker_doubles import Logger

from wsfleet.exceptions import StoreError
from wsfleet.hints import Hint
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.record import ConnectionRecord, connection_pk
from wsfleet_local.waiting import wait_until_async
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader
from wsfleet_worker.parts import WorkerParts
from wsfleet_worker.poller import HintPoller
from wsfleet_worker.sqs_consumer import QueueConsumer
from wsfleet_worker.taking import LeaseTaker

WAIT = 10.0
WORKER = "w1"

#: The shared poll (wsfleet_local.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


class Store(InMemoryLeaseStore):
    """The in-memory store; acquiring ``CONN#bug`` raises a bug, ``CONN#slow`` a StoreError."""

    def __init__(self) -> None:
        super().__init__(lease_ms=60_000)

    def acquire(self, pk: str, owner: str, **kwargs: Any) -> ConnectionRecord:
        if pk == "CONN#bug":
            raise RuntimeError("a bug in acquire")
        if pk == "CONN#slow":
            raise StoreError("throttled")
        return super().acquire(pk, owner, **kwargs)


class Alive:
    """The worker lease as the taker sees it: held, renewed on time."""

    fenced = False

    def may_write(self, now: int) -> bool:
        return True

    def behind_ms(self, now: int) -> int:
        return 0


class Outbox:
    def __init__(self) -> None:
        self.hints: list[Hint] = []

    def add(self, hint: Hint) -> None:
        self.hints.append(hint)


class Rig:
    """A worker's hint side: queue, store, taker, poller; sessions are recorded by pk."""

    def __init__(self, *, max_connections: int = 10, wait_seconds: int = 1) -> None:
        self.sqs = MemorySqs()
        self.url = self.sqs.create_queue(QueueName="hints")["QueueUrl"]
        self.store = Store()
        self.metrics = WorkerMetrics("test", emit=lambda document: None)
        self.logger = Logger()
        self.offloader = Offloader(io_threads=2, write_threads=1)
        self.sessions: dict[str, Any] = {}
        parts = WorkerParts(
            worker_id=WORKER, leases=self.store, offloader=self.offloader, metrics=self.metrics,
            logger=self.logger,
        )  # fmt: skip
        self.taker = LeaseTaker(
            parts, Alive(), Outbox(),  # type: ignore[arg-type]
            max_connections=max_connections, heartbeat_seconds=10.0,
            sessions=self.sessions, session_tasks={}, start_session=self._start_session,
        )  # fmt: skip
        self.consumer = QueueConsumer(
            self.sqs, self.offloader, self.logger, queue="hint queue", message="hint",
            queue_url=self.url, wait_seconds=wait_seconds,
        )  # fmt: skip
        self.poller = HintPoller(self.consumer, self.taker, self.metrics, self.logger)

    def _start_session(self, record: ConnectionRecord) -> None:
        self.sessions[record.pk] = SimpleNamespace(reason=None, record=record)

    def started(self, *connection_ids: str) -> None:
        for connection_id in connection_ids:
            self.store.start(connection_id, f"wss://up.example/{connection_id}")

    def hint(self, *bodies: str) -> None:
        for body in bodies:
            self.sqs.send_message(QueueUrl=self.url, MessageBody=body)

    def owner(self, connection_id: str) -> str:
        record = self.store.get(connection_pk(connection_id))
        assert record is not None
        return record.lease_owner

    def run(self, scenario: Callable[[Rig], Awaitable[None]]) -> None:
        async def main() -> None:
            task = asyncio.create_task(self.poller.run())
            try:
                await scenario(self)
            finally:
                self.poller.stop()
                await asyncio.wait_for(task, WAIT)
                self.offloader.shutdown()

        asyncio.run(main())


def body(connection_id: str) -> str:
    return Hint(connection_pk(connection_id)).body()


# ---------------------------------------------------------------- acting on hints


def test_hints_are_acquired_started_and_deleted_in_one_batch():
    # GIVEN three STARTED connections, each hinted, queued before the poller receives
    rig = Rig()
    rig.started("a", "b", "c")
    rig.hint(body("a"), body("b"), body("c"))

    async def run(rig: Rig) -> None:
        # WHEN the poller runs
        await until(lambda: len(rig.sessions) == 3, "three sessions started")
        await until(lambda: rig.sqs.depth(rig.url) == (0, 0), "the hints deleted")

    rig.run(run)
    # THEN each lease is this worker's, each session started, and one DeleteMessageBatch
    # removed the round's three messages
    assert [rig.owner(c) for c in "abc"] == [WORKER] * 3
    assert sorted(rig.sessions) == ["CONN#a", "CONN#b", "CONN#c"]
    assert rig.sqs.deleted_batches() == [3]
    assert rig.metrics.totals["Acquired"] == 3


def test_unusable_duplicate_and_refused_hints_are_deleted_and_counted():
    # GIVEN a connection running here, a STOPPED one, one never started, and a garbage body
    rig = Rig()
    rig.started("here", "stopped")
    rig.store.stop(connection_pk("stopped"))
    rig._start_session(rig.store.acquire(connection_pk("here"), WORKER))
    rig.hint("not json", body("here"), body("stopped"), body("ghost"))

    async def run(rig: Rig) -> None:
        # WHEN the poller acts on them
        await until(lambda: rig.sqs.depth(rig.url) == (0, 0), "every message deleted")

    rig.run(run)
    # THEN none started a session; the garbage is counted as invalid, the refusals as conflicts
    assert sorted(rig.sessions) == ["CONN#here"]
    assert rig.metrics.totals["InvalidHints"] == 1
    assert rig.metrics.totals["AcquireConflicts"] == 2  # STOPPED, and not found
    assert rig.logger.count("deleting unusable hints") == 1
    assert rig.owner("stopped") == ""


def test_a_hint_that_fails_or_meets_store_trouble_is_left_in_flight_and_the_rest_go_on():
    # GIVEN a hint whose acquire hits a bug, one whose acquire meets store trouble, and a good one
    rig = Rig()
    rig.started("bug", "slow", "good")
    rig.hint(body("bug"), body("slow"), body("good"))

    async def run(rig: Rig) -> None:
        # WHEN the poller acts on the round
        await until(lambda: "CONN#good" in rig.sessions, "the good hint taken")
        await until(lambda: rig.sqs.depth(rig.url) == (0, 2), "the good hint deleted")

    rig.run(run)
    # THEN the good one is deleted, the other two wait in flight for their visibility timeout
    # (redelivery, then the dead-letter queue): neither deleted nor given back
    assert rig.sqs.deleted_batches() == [1]
    assert "change_message_visibility_batch" not in rig.sqs.calls
    assert rig.metrics.totals["HintFailures"] == 1  # the bug; store trouble is not a failure
    assert rig.logger.count("acquire failed; hint left for redelivery") == 1


# ---------------------------------------------------------------- the receive loop


def test_no_more_hints_are_received_than_there_are_free_slots():
    # GIVEN a worker with room for two connections and five hints queued
    rig = Rig(max_connections=2)
    ids = [f"c{i}" for i in range(5)]
    rig.started(*ids)
    rig.hint(*(body(i) for i in ids))

    async def run(rig: Rig) -> None:
        # WHEN it fills up
        await until(lambda: len(rig.sessions) == 2, "two sessions")
        await until(lambda: rig.sqs.depth(rig.url) == (3, 0), "two hints deleted")
        # THEN it asked for no more than its room, and left the rest visible for peers
        assert max(rig.sqs.receive_limits()) <= 2
        # WHEN a session ends and frees its slot
        rig.sessions.pop(next(iter(rig.sessions)))
        rig.poller.slot_freed()
        # THEN it takes exactly one more
        await until(lambda: rig.sqs.depth(rig.url) == (2, 0), "one more hint taken")
        assert len(rig.sessions) == 2

    rig.run(run)
    assert rig.metrics.totals["Acquired"] == 3


def test_a_failing_receive_is_logged_backed_off_and_retried():
    # GIVEN a hint queue whose next two receives fail (throttled)
    rig = Rig()
    rig.started("a")
    rig.hint(body("a"))
    rig.sqs.failing_receives = 2

    async def run(rig: Rig) -> None:
        # WHEN the poller runs
        await until(lambda: "CONN#a" in rig.sessions, "the hint taken after the failures")

    rig.run(run)
    # THEN each failure was logged once and the poller went on to take the hint
    assert rig.logger.count("hint queue receive failed") == 2
    assert rig.owner("a") == WORKER


def test_a_batch_that_arrives_after_stop_is_given_back_at_once():
    # GIVEN a poller whose long poll is out on an empty queue
    rig = Rig(wait_seconds=5)
    rig.started("late")

    async def run(rig: Rig) -> None:
        await until(lambda: rig.sqs.polls_out == 1, "the long poll out")
        # WHEN it is stopped, and a hint arrives for that poll
        rig.poller.stop()
        rig.hint(body("late"))
        await until(lambda: rig.sqs.receive_limits() and rig.sqs.depth(rig.url) == (1, 0)
                    and "change_message_visibility_batch" in rig.sqs.calls,
                    "the hint given back")  # fmt: skip

    rig.run(run)
    # THEN it was not acted on, and is visible again for a peer
    assert rig.sessions == {}
    assert rig.owner("late") == ""
    assert rig.sqs.bodies(rig.url) == [body("late")]
