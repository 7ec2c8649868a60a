"""ControlBatcher: hand-off messages to peers' control queues go out ten per
SendMessageBatch, a turn's worth at once and the rest as sends return, each caller told
whether its own message went out (issue #26 item 5: a drain's hundred PREPAREs were a hundred
requests one after another on four SQS threads)."""

from __future__ import annotations

import asyncio
import functools

import pytest
from worker_doubles import sync

from bench.waiting import wait_until_async
from wsfleet.control import PrepareCommand, ReadyReply
from wsfleet_worker.control_channel import ControlBatcher, HandoffMessage

until = functools.partial(wait_until_async, timeout=10.0)


def prepare(i: int) -> PrepareCommand:
    return PrepareCommand(f"CONN#c{i}", 1, "giver", 0, "q-giver")


def ready(i: int) -> ReadyReply:
    return ReadyReply(f"CONN#c{i}", 1, "taker", 5)


class Queues:
    """SendMessageBatch stand-in: records each request; a gate holds requests back."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.refused: set[str] = set()
        self.failing = False

    async def send(self, queue_url: str, messages: list[HandoffMessage]) -> set[str]:
        assert 0 < len(messages) <= 10, "SQS takes 1 to 10 entries per batch"
        self.requests.append((queue_url, [m.pk for m in messages]))
        await self.gate.wait()
        if self.failing:
            raise RuntimeError("SQS is away")
        return {m.pk for m in messages if m.pk not in self.refused}


@sync
async def test_a_turns_worth_of_messages_goes_out_ten_per_request_per_queue():
    # GIVEN 25 PREPAREs for one peer and 3 for another, queued in one turn (a drain)
    queues = Queues()
    batcher = ControlBatcher(queues.send)
    sends = [batcher.send("qa", prepare(i)) for i in range(25)]
    sends += [batcher.send("qb", prepare(100 + i)) for i in range(3)]
    # WHEN they are sent
    results = await asyncio.gather(*sends)
    # THEN every one went out, in 4 requests (10 + 10 + 5 to one queue, 3 to the other)
    assert all(results)
    assert sorted((url, len(pks)) for url, pks in queues.requests) == [
        ("qa", 5), ("qa", 10), ("qa", 10), ("qb", 3)]
    assert batcher.requests == 4
    sent = sorted(pk for _, pks in queues.requests for pk in pks)
    expected = [f"CONN#c{i}" for i in range(25)] + [f"CONN#c{100 + i}" for i in range(3)]
    assert sent == sorted(expected)


@sync
async def test_messages_that_come_one_at_a_time_go_at_once_until_three_sends_are_out():
    # GIVEN READYs coming one at a time (sessions' first frames), no request answered yet
    queues = Queues()
    queues.gate.clear()
    batcher = ControlBatcher(queues.send)
    first = []
    for i in range(3):
        first.append(asyncio.create_task(batcher.send("qg", ready(i))))
        await until(lambda n=i + 1: len(queues.requests) == n, f"request {i + 1}")
    # WHEN three more come while those three requests are out
    later = []
    for i in range(3, 6):
        later.append(asyncio.create_task(batcher.send("qg", ready(i))))
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    # THEN the first three went at once, one request each, and the others wait for one of
    # them to return, then go together in one
    assert len(queues.requests) == 3
    queues.gate.set()
    assert all(await asyncio.gather(*first, *later))
    assert [len(pks) for _, pks in queues.requests] == [1, 1, 1, 3]


@sync
async def test_each_caller_learns_whether_its_own_message_went_out():
    queues = Queues()
    queues.refused = {"CONN#c1"}
    batcher = ControlBatcher(queues.send)
    assert await asyncio.gather(*(batcher.send("qa", prepare(i)) for i in range(3))) == [
        True, False, True]
    # AND a request that fails outright fails each of its callers (they fall back)
    queues.failing = True
    results = await asyncio.gather(*(batcher.send("qa", prepare(i)) for i in range(2)),
                                   return_exceptions=True)  # fmt: skip
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    # AND the batcher goes on afterwards
    queues.failing = False
    assert await batcher.send("qa", prepare(9))


@sync
async def test_a_caller_that_gave_up_costs_nobody_else_their_answer():
    queues = Queues()
    queues.gate.clear()
    batcher = ControlBatcher(queues.send)
    gone = asyncio.create_task(batcher.send("qa", prepare(0)))
    kept = asyncio.create_task(batcher.send("qa", prepare(1)))
    await until(lambda: len(queues.requests) == 1, "the request")
    gone.cancel()
    queues.gate.set()
    assert await kept
    with pytest.raises(asyncio.CancelledError):
        await gone
