"""The control channel over an in-memory SQS double, and a STOP routed through a worker built on
the in-memory lease store.

:class:`~wsfleet_worker.control_channel.ControlChannel` creates its queue, receives through the
shared :class:`~wsfleet_worker.sqs_consumer.QueueConsumer` (backing off when a receive fails),
hands every STOP to ``on_stop`` and deletes each round's messages in one batch, whatever they
held; a garbage body or a failing ``on_stop`` costs that message only. Through a
:class:`~wsfleet_worker.worker.Worker` (its ``on_stop``), a STOP closes the session it names
only when the record confirms it: a forged one leaves the stream running.
Each test reads GIVEN / WHEN / THEN.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from memory_sqs import MemorySqs
from worker_doubles import Logger

from bench.waiting import wait_until_async
from wsfleet.clock import now_ms
from wsfleet.control import WORKER_ID_TAG, HandoffHint, StopCommand
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.record import WorkerRecord, connection_pk
from wsfleet.settings import Settings
from wsfleet_worker.config import WorkerConfig
from wsfleet_worker.control_channel import ControlChannel
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader
from wsfleet_worker.session_rules import ExitReason
from wsfleet_worker.worker import Worker

WAIT = 10.0
WORKER = "w1"
PREFIX = "test-ctl-"

#: The shared poll (bench.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


def channel_on(sqs: MemorySqs, logger: Logger, metrics: WorkerMetrics) -> ControlChannel:
    return ControlChannel(
        sqs, Offloader(io_threads=1, write_threads=1), metrics, logger,
        prefix=PREFIX, worker_id=WORKER, wait_seconds=1,
    )  # fmt: skip


async def run_handing_on(channel: ControlChannel, handed: list[str]) -> None:
    """``channel.run`` refusing every STOP and recording each hand-off message's pk."""

    async def on_stop(command: StopCommand) -> bool:
        return False

    async def on_handoff(message: object) -> None:
        handed.append(message.pk)  # type: ignore[attr-defined]

    await channel.run(on_stop, on_handoff)


def consume(
    channel: ControlChannel,
    on_stop: Callable[[StopCommand], Awaitable[bool]],
    scenario: Callable[[], Awaitable[None]],
) -> None:
    """Open the channel, run it while ``scenario`` runs, then cancel it (as the worker does)."""

    async def main() -> None:
        await channel.open()
        task = asyncio.create_task(channel.run(on_stop))
        try:
            await scenario()
        finally:
            task.cancel()  # as the worker ends it
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


# ---------------------------------------------------------------- the channel


def test_open_creates_the_workers_queue_tagged_with_its_id_and_close_deletes_it():
    sqs, metrics = MemorySqs(), WorkerMetrics("test", emit=lambda document: None)
    channel = channel_on(sqs, Logger(), metrics)

    async def main() -> None:
        # WHEN the channel opens, then closes
        url = await channel.open()
        # THEN the queue carries the worker's name and tag (the reconciler traces it back),
        # keeps STOPs briefly (moot after 300 s) and long-polls by default
        assert url == channel.queue_url and url.endswith(f"/{PREFIX}{WORKER}")
        attributes, tags = sqs.queue_settings(url)
        assert tags == {WORKER_ID_TAG: WORKER}
        assert attributes["MessageRetentionPeriod"] == "300"
        assert attributes["ReceiveMessageWaitTimeSeconds"] == "1"
        assert "Policy" not in attributes  # no sender ARNs configured
        await channel.close()
        assert not sqs.exists(url)

    asyncio.run(main())


def test_a_close_before_open_deletes_nothing():
    sqs = MemorySqs()
    channel = channel_on(sqs, Logger(), WorkerMetrics("test", emit=lambda document: None))

    asyncio.run(channel.close())

    assert "delete_queue" not in sqs.calls


def test_each_stop_reaches_on_stop_and_the_round_is_deleted_in_one_batch():
    # GIVEN two STOPs and a garbage body on the control queue
    sqs, logger = MemorySqs(), Logger()
    metrics = WorkerMetrics("test", emit=lambda document: None)
    channel = channel_on(sqs, logger, metrics)
    received: list[StopCommand] = []

    async def on_stop(command: StopCommand) -> bool:
        received.append(command)
        return command.epoch == 2  # the first names an older epoch: not applied

    async def scenario() -> None:
        for body in (StopCommand("CONN#a", 1).body(), "{not json", StopCommand("CONN#a", 2).body()):
            sqs.send_message(QueueUrl=channel.queue_url, MessageBody=body)
        # WHEN the channel consumes them
        await until(lambda: sqs.depth(channel.queue_url) == (0, 0), "every message deleted")

    consume(channel, on_stop, scenario)
    # THEN both STOPs were handed over, parsed, in order; the garbage was counted, not acted on
    assert received == [StopCommand("CONN#a", 1), StopCommand("CONN#a", 2)]
    assert [e["applied"] for e in logger.extras("STOP command received")] == [False, True]
    assert metrics.totals["StopCommands"] == 2
    assert metrics.totals["InvalidControlMessages"] == 1
    # AND the three messages went in one DeleteMessageBatch
    assert sqs.deleted_batches() == [3]


class _SlowDeletes(MemorySqs):
    """Every DeleteMessageBatch waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.deletes_go = threading.Event()

    def delete_message_batch(self, **kwargs: Any) -> Any:
        self.deletes_go.wait(3 * WAIT)
        return super().delete_message_batch(**kwargs)


def test_a_delete_still_out_does_not_hold_up_the_next_receive():
    # A hand-off message is a peer's stream waiting: the next one must not wait for the
    # previous round's DeleteMessageBatch (a late delete only brings a message back later).
    sqs = _SlowDeletes()
    channel = channel_on(sqs, Logger(), WorkerMetrics("test", emit=lambda document: None))
    handed: list[str] = []

    async def main() -> None:
        await channel.open()
        task = asyncio.create_task(run_handing_on(channel, handed))
        try:
            # GIVEN a hand-off received, its delete still out
            url = channel.queue_url
            sqs.send_message(QueueUrl=url, MessageBody=HandoffHint("CONN#a", 1).body())
            await until(lambda: handed == ["CONN#a"], "the first hand-off")
            # WHEN the next one arrives
            sqs.send_message(QueueUrl=url, MessageBody=HandoffHint("CONN#b", 1).body())
            # THEN it is received and handed on while that delete is still out
            await until(lambda: handed == ["CONN#a", "CONN#b"], "the second hand-off")
            assert sqs.deleted_batches() == []
            # AND once the deletes go through, both messages are gone
            sqs.deletes_go.set()
            await until(lambda: sqs.depth(channel.queue_url) == (0, 0), "both deleted")
        finally:
            sqs.deletes_go.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


class _Waits(MemorySqs):
    """Records each receive's WaitTimeSeconds."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[int] = []

    def receive_message(self, **kwargs: Any) -> Any:
        self.waits.append(kwargs.get("WaitTimeSeconds", 0))
        return super().receive_message(**kwargs)


def test_a_burst_of_hand_off_messages_is_received_beside_the_long_poll_until_it_ends():
    # A drain's hundred PREPAREs (or its takers' READYs) were ten receives one after another
    sqs = _Waits()
    channel = channel_on(sqs, Logger(), WorkerMetrics("test", emit=lambda document: None))
    handed: list[str] = []
    after_burst: list[int] = []

    async def main() -> None:
        await channel.open()
        # GIVEN 35 hand-off messages waiting when the channel starts
        for i in range(35):
            body = HandoffHint(f"CONN#c{i}", 1).body()
            sqs.send_message(QueueUrl=channel.queue_url, MessageBody=body)
        task = asyncio.create_task(run_handing_on(channel, handed))
        try:
            # WHEN it consumes them
            await until(lambda: len(handed) == 35, "every hand-off")
            await until(lambda: sqs.depth(channel.queue_url) == (0, 0), "every one deleted")
            await until(lambda: sqs.polls_out == 1, "back to the long poll alone")
            settled = len(sqs.waits)
            await until(lambda: len(sqs.waits) >= settled + 2, "two more receives")
            after_burst.extend(sqs.waits[settled:])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    # THEN each was handed on once, and receives without a wait ran beside the long poll
    assert sorted(handed) == sorted(f"CONN#c{i}" for i in range(35))
    assert 0 in sqs.waits
    # AND they ended with the burst: idle again, only the long poll receives
    assert after_burst and set(after_burst) == {1}


def test_a_failing_on_stop_costs_its_message_only():
    # GIVEN a STOP whose handling raises (a bug), then a good one
    sqs, logger = MemorySqs(), Logger()
    metrics = WorkerMetrics("test", emit=lambda document: None)
    channel = channel_on(sqs, logger, metrics)
    handled: list[str] = []

    async def on_stop(command: StopCommand) -> bool:
        if command.pk == "CONN#bug":
            raise RuntimeError("a bug")
        handled.append(command.pk)
        return True

    async def scenario() -> None:
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=StopCommand("CONN#bug", 1).body())
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=StopCommand("CONN#ok", 1).body())
        # WHEN the channel consumes them
        await until(lambda: handled == ["CONN#ok"], "the good STOP handled")
        await until(lambda: sqs.depth(channel.queue_url) == (0, 0), "both deleted")

    consume(channel, on_stop, scenario)
    # THEN the failure was counted and logged; the channel went on
    assert metrics.totals["ControlMessageFailures"] == 1
    assert [e["connection_id"] for e in logger.extras("STOP command failed")] == ["bug"]


def test_a_failing_receive_is_logged_and_the_channel_recovers():
    # GIVEN a control queue whose next two receives fail
    sqs, logger = MemorySqs(), Logger()
    channel = channel_on(sqs, logger, WorkerMetrics("test", emit=lambda document: None))
    received: list[StopCommand] = []

    async def on_stop(command: StopCommand) -> bool:
        received.append(command)
        return True

    async def scenario() -> None:
        sqs.failing_receives = 2
        sqs.send_message(QueueUrl=channel.queue_url, MessageBody=StopCommand("CONN#a", 3).body())
        # WHEN the channel keeps polling
        await until(lambda: received, "the STOP, after the failures")

    consume(channel, on_stop, scenario)
    # THEN each failure was logged, and the STOP still arrived
    assert len(logger.extras("control queue receive failed")) == 2
    assert received == [StopCommand("CONN#a", 3)]


# ---------------------------------------------------------------- routed through a worker


async def never_answers(url: str, **_options: Any) -> Any:
    await asyncio.Event().wait()


class Outbox:
    def add(self, hint: Any) -> None:
        pass

    async def flush(self) -> None:
        return None


def make_worker(store: InMemoryLeaseStore, sqs: MemorySqs) -> Worker:
    settings = Settings(
        hint_queue_url="https://sqs.invalid/hints", worker_id=WORKER, lease_seconds=60.0,
        heartbeat_seconds=10.0, lease_safety_margin_seconds=2.0, checkpoint_seconds=600.0,
        control_queue_prefix=PREFIX,
    )  # fmt: skip
    config = WorkerConfig(settings=settings, control_wait_seconds=1)
    worker = Worker.from_config(
        config, dynamodb=object(), sqs=sqs, leases=store, outbox=Outbox(),  # type: ignore[arg-type]
        logger=Logger(), metrics=WorkerMetrics("test", emit=lambda document: None),
        connector=never_answers,
    )  # fmt: skip
    now = now_ms()
    store.register_worker(
        WorkerRecord(worker_id=WORKER, control_queue_url="", started_at_ms=now,
                     heartbeat_at_ms=now, expires_at_ms=now + settings.lease_ms)
    )  # fmt: skip
    worker.liveness.start(now)
    return worker


def test_a_confirmed_stop_closes_its_session_and_a_forged_one_does_not():
    # GIVEN a worker streaming two connections, one of them STOPPED through the API
    store, sqs = InMemoryLeaseStore(lease_ms=60_000), MemorySqs()
    worker = make_worker(store, sqs)
    channel = worker.control
    assert channel is not None

    async def main() -> None:
        tasks = {}
        for connection_id in ("stopped", "live"):
            store.start(connection_id, f"wss://up.example/{connection_id}")
            record = store.acquire(connection_pk(connection_id), WORKER)
            worker._start_session(record)
            tasks[connection_id] = worker._session_tasks[record.pk]
        stopped = worker.sessions[connection_pk("stopped")]
        live = worker.sessions[connection_pk("live")]
        store.stop(stopped.pk)
        await channel.open()
        consuming = asyncio.create_task(channel.run(worker._on_stop_command))
        try:
            # WHEN a STOP arrives for each (the one for "live" forged: its record is STARTED)
            for session in (stopped, live):
                body = StopCommand(session.pk, session.epoch).body()
                sqs.send_message(QueueUrl=channel.queue_url, MessageBody=body)
            await until(lambda: sqs.depth(channel.queue_url) == (0, 0), "both handled")
            result = await asyncio.wait_for(tasks["stopped"], WAIT)
            # THEN the confirmed one ended through the control channel, released STOPPED
            assert (result.reason, result.via, result.released) == (
                ExitReason.STOPPED, "control", True)  # fmt: skip
            # AND the forged one is still streaming, counted as unconfirmed
            assert live.reason is None
            assert worker.metrics.totals["UnconfirmedStops"] == 1
        finally:
            live.finish(ExitReason.SHUTDOWN)
            await asyncio.wait_for(tasks["live"], WAIT)
            consuming.cancel()
            await asyncio.gather(consuming, return_exceptions=True)
            worker.offloader.shutdown()

    asyncio.run(main())
    after = store.get(connection_pk("stopped"))
    assert after is not None and after.lease_owner == ""
