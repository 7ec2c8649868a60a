"""HintPoller against the real (moto) hint queue: overlapping rounds, capacity, shutdown.

The lease taker is the test's: its ``acquire`` blocks on demand, so the poller's own
behaviour (what it receives while a round is still busy, what it deletes or gives back) is
what is observed, through the queue itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

import boto3
import pytest
from fleet_helpers import queue_depth

from bench.waiting import wait_until_async
from wsfleet.hints import Hint
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader
from wsfleet_worker.poller import HintPoller
from wsfleet_worker.sqs_consumer import QueueConsumer
from wsfleet_worker.taking import HintOutcome

pytestmark = pytest.mark.integration

LIMIT = 15.0  # a bound on waiting for the queue, never a timing assertion


def sqs_client(aws):
    return boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name=aws.region)


def send(sqs, url: str, *pks: str) -> None:
    for pk in pks:
        sqs.send_message(QueueUrl=url, MessageBody=Hint(pk).body())


#: The shared poll (bench.waiting), bounded by LIMIT.
until = functools.partial(wait_until_async, timeout=LIMIT)


class Taker:
    """Stands in for the lease taker: a fixed capacity, nothing running, the test's acquire."""

    def __init__(self, acquire: Callable[[Hint], Awaitable[HintOutcome]], capacity: int) -> None:
        self.acquire = acquire
        self._capacity = capacity

    def free_slots(self) -> int:
        return self._capacity

    def capacity_left(self) -> int:
        return self._capacity

    def running(self) -> set[str]:
        return set()


def run_poller(
    aws,
    acquire: Callable[[Hint], Awaitable[HintOutcome]],
    scenario: Callable[[HintPoller, object], Awaitable[None]],
    *,
    capacity: int = 100,
    metrics: WorkerMetrics | None = None,
) -> None:
    async def main() -> None:
        sqs = sqs_client(aws)
        offloader = Offloader(io_threads=2, write_threads=1, sqs_threads=2)
        logger = logging.getLogger("test-poller")
        queue = QueueConsumer(
            sqs, offloader, logger, queue="hint queue", message="hint",
            queue_url=aws.hint_queue_url, wait_seconds=1,
        )
        poller = HintPoller(
            queue,
            Taker(acquire, capacity),  # type: ignore[arg-type]
            metrics or WorkerMetrics("test", emit=lambda doc: None),
            logger,
        )
        task = asyncio.create_task(poller.run())
        try:
            await scenario(poller, sqs)
            assert not task.done(), task  # the poller (and so the worker) is still running
        finally:
            poller.stop()
            await asyncio.wait_for(task, LIMIT)
            offloader.shutdown()

    asyncio.run(main())


def test_a_busy_round_does_not_hold_up_the_next_receive(aws):
    """An acquire still waiting (e.g. for an early hint's lease to lapse) must not keep the
    poller from receiving and acting on hints that arrive meanwhile."""
    slow_released = asyncio.Event()
    acquired: list[str] = []

    async def acquire(hint: Hint) -> HintOutcome:
        acquired.append(hint.pk)
        if hint.pk == "CONN#slow":
            await slow_released.wait()
        return HintOutcome.DONE

    async def scenario(poller, sqs) -> None:
        send(sqs, aws.hint_queue_url, "CONN#slow")
        await until(lambda: acquired == ["CONN#slow"], "the slow hint to be taken")
        send(sqs, aws.hint_queue_url, "CONN#quick")
        await until(lambda: "CONN#quick" in acquired, "the next hint, while slow still waits")
        assert not slow_released.is_set()
        slow_released.set()
        await until(lambda: queue_depth(sqs, aws.hint_queue_url) == (0, 0), "both deleted")

    run_poller(aws, acquire, scenario)


def test_rounds_waiting_for_one_slow_acquire_each_do_not_stop_the_receives(aws):
    """A hint leaves the hand when its own acquire ends, not when its round does: rounds whose
    other hints are done, each waiting for one slow acquire (and its delete), hold one place
    each, so hints arriving meanwhile are still received and acquired (issue #26: a hand-off
    burst is not paced by each round's slowest acquire)."""
    slow_released = asyncio.Event()
    acquired: list[str] = []

    async def acquire(hint: Hint) -> HintOutcome:
        acquired.append(hint.pk)
        if hint.pk.startswith("CONN#slow"):
            await slow_released.wait()
        return HintOutcome.DONE

    async def scenario(poller, sqs) -> None:
        # GIVEN four rounds in hand, each with a quick hint done and a slow one waiting
        for i in range(4):
            send(sqs, aws.hint_queue_url, f"CONN#slow{i}", f"CONN#quick{i}")
            await until(lambda i=i: {f"CONN#slow{i}", f"CONN#quick{i}"} <= set(acquired),
                        f"round {i} taken")  # fmt: skip
        # WHEN another hint arrives while all of them wait
        send(sqs, aws.hint_queue_url, "CONN#late")
        # THEN it is received and acquired before any slow acquire ends
        await until(lambda: "CONN#late" in acquired, "the late hint, while the rounds wait")
        assert not slow_released.is_set()
        slow_released.set()
        await until(lambda: queue_depth(sqs, aws.hint_queue_url) == (0, 0), "all deleted")

    run_poller(aws, acquire, scenario)


def test_hints_in_hand_count_against_free_slots(aws):
    """Overlapping rounds never take more hints than the worker has room for."""
    release = asyncio.Event()
    in_hand: list[str] = []

    async def acquire(hint: Hint) -> HintOutcome:
        in_hand.append(hint.pk)
        await release.wait()
        return HintOutcome.DONE

    async def scenario(poller, sqs) -> None:
        send(sqs, aws.hint_queue_url, *(f"CONN#c{i}" for i in range(5)))
        await until(lambda: len(in_hand) == 2, "two hints (the free slots) in hand")
        await asyncio.sleep(1.5)  # more receive chances: none may take a third
        assert len(in_hand) == 2
        assert queue_depth(sqs, aws.hint_queue_url)[0] == 3  # still visible, for peers
        release.set()
        await until(lambda: len(in_hand) == 5, "the rest, once the first two are done")

    run_poller(aws, acquire, scenario, capacity=2)


def test_stop_waits_for_rounds_in_hand_and_their_outcomes_apply(aws):
    release = asyncio.Event()

    async def acquire(hint: Hint) -> HintOutcome:
        await release.wait()
        return HintOutcome.GIVE_BACK  # e.g. the worker began to drain: visible again for a peer

    async def scenario(poller, sqs) -> None:
        send(sqs, aws.hint_queue_url, "CONN#a")
        await until(lambda: queue_depth(sqs, aws.hint_queue_url) == (0, 1), "received")
        poller.stop()
        release.set()

    run_poller(aws, acquire, scenario)
    sqs = sqs_client(aws)
    assert queue_depth(sqs, aws.hint_queue_url) == (1, 0)  # given back, not lost or deleted


def test_one_bad_message_costs_that_message_not_the_poller(aws):
    """Poison bodies are counted and deleted; a hint whose handling raises is counted and left
    for redelivery; the round's other hints and the poller itself carry on (issue #11, 2)."""
    metrics = WorkerMetrics("test", emit=lambda doc: None)
    acquired: list[str] = []

    async def acquire(hint: Hint) -> HintOutcome:
        acquired.append(hint.pk)
        if hint.pk == "CONN#bug":
            raise RuntimeError("a bug in acting on this one hint")
        return HintOutcome.DONE

    async def scenario(poller, sqs) -> None:
        for body in ("[" * 5000, '{"pk": "CONN#x", "epoch": ' + "9" * 5000 + "}"):
            sqs.send_message(QueueUrl=aws.hint_queue_url, MessageBody=body)
        send(sqs, aws.hint_queue_url, "CONN#bug", "CONN#good")
        await until(lambda: {"CONN#bug", "CONN#good"} <= set(acquired), "both hints acted on")
        # poison and the good hint deleted; the failed one in flight until its visibility ends
        await until(lambda: queue_depth(sqs, aws.hint_queue_url) == (0, 1), "deletes")
        counts = metrics.snapshot()
        assert (counts["InvalidHints"], counts["HintFailures"]) == (2, 1)
        send(sqs, aws.hint_queue_url, "CONN#later")
        await until(lambda: "CONN#later" in acquired, "a hint after the failure")

    run_poller(aws, acquire, scenario, metrics=metrics)
