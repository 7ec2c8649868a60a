"""The hint poller's placement: when a worker holds back before a receive, and when not."""

from __future__ import annotations

import asyncio
from typing import Any

from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.poller import MAX_HINTS_IN_HAND, HintPoller


class Queue:
    """The parts of QueueConsumer the poller's room calculation touches."""

    def __init__(self) -> None:
        self.wait_seconds = 20
        self._stopped = asyncio.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def delete(self, receipts: list[str]) -> None:
        return None

    async def give_back(self, receipts: list[str]) -> None:
        return None


class Taker:
    def free_slots(self) -> int:
        return 50

    def capacity_left(self) -> int:
        return 50

    def running(self) -> set[str]:
        return set()


class Logger:
    def warning(self, *args: Any, **kwargs: Any) -> None:
        return None

    def debug(self, *args: Any, **kwargs: Any) -> None:
        return None


def make(placement: Any) -> tuple[HintPoller, Queue]:
    queue = Queue()
    poller = HintPoller(
        queue,  # type: ignore[arg-type]
        Taker(),  # type: ignore[arg-type]
        WorkerMetrics("test", emit=lambda doc: None),
        Logger(),
        placement=placement,
    )
    return poller, queue


def test_a_loaded_worker_holds_back_once_then_receives_without_waiting() -> None:
    asked: list[int] = []

    def placement() -> float:
        asked.append(1)
        return 0.01

    async def run() -> None:
        poller, queue = make(placement)
        assert await poller._room() == MAX_HINTS_IN_HAND  # (fewer than the 50 free slots)
        assert len(asked) == 1 and queue.wait_seconds == 0  # held back once, then no wait
        # a balanced worker receives at once, with the long poll again
        poller._placement = lambda: 0.0
        assert await poller._room() == MAX_HINTS_IN_HAND
        assert queue.wait_seconds == 20

    asyncio.run(run())


def test_no_holding_back_while_hints_are_queued() -> None:
    async def run() -> None:
        poller, queue = make(lambda: 5.0)
        poller._requested = 10
        await poller._start_round([{"ReceiptHandle": str(i), "Body": "x"} for i in range(2)])
        assert poller._backlog  # the last receive brought two: a burst
        assert await poller._room() == MAX_HINTS_IN_HAND - 2  # the two in hand count
        assert queue.wait_seconds == 20
        await asyncio.gather(*poller._rounds)  # two unusable hints, deleted
        await poller._start_round([{"ReceiptHandle": "3", "Body": "x"}])
        assert not poller._backlog  # one at a time: a trickle, placement applies
        await asyncio.gather(*poller._rounds)

    asyncio.run(run())
