"""HintOutbox: hints go out in SendMessageBatch-sized batches; a full batch does not wait for
the sends in flight, a partial one gathers what is queued meanwhile (issue #26: a drain's
hints are not paced by its slowest send, and no more requests are sent than batches)."""

from __future__ import annotations

import asyncio
import functools
import threading

from bench.waiting import wait_until_async
from wsfleet.hints import Hint
from wsfleet.record import connection_pk
from wsfleet_worker.offload import Offloader
from wsfleet_worker.outbox import HintOutbox

WAIT = 10.0
until = functools.partial(wait_until_async, timeout=WAIT)


class Logger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __getattr__(self, level: str):
        return lambda message, *a, **k: self.lines.append(message)


class HeldSender:
    """A HintSender whose SendMessageBatch calls wait until the test lets them go."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.out = 0
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def send_many(self, hints: list[Hint]) -> list[Hint]:
        with self._lock:
            self.batches.append([hint.pk for hint in hints])
            self.out += 1
        assert self.gate.wait(WAIT)
        with self._lock:
            self.out -= 1
        return []


def hints(first: int, count: int) -> list[Hint]:
    return [Hint(connection_pk(f"c{i}")) for i in range(first, first + count)]


def test_a_full_batch_goes_at_once_and_a_partial_one_gathers_what_comes_meanwhile():
    async def scenario() -> None:
        sender = HeldSender()
        offloader = Offloader(io_threads=1, write_threads=1, sqs_threads=4)
        outbox = HintOutbox(sender, offloader, Logger())  # type: ignore[arg-type]
        try:
            # GIVEN a hint queued: it goes out at once (and is held there)
            outbox.add(hints(0, 1)[0])
            await until(lambda: sender.out == 1, "the first send out")
            # WHEN fourteen more are queued while it is out
            for hint in hints(1, 14):
                outbox.add(hint)
            # THEN a full ten go at once, beside the first send; the other four wait
            await until(lambda: sender.out == 2, "a full batch sent while the first is out")
            assert [len(batch) for batch in sender.batches] == [1, 10]
            # WHEN the sends come back THEN the four left go in one more request
            sender.gate.set()
            await outbox.flush()
            assert [len(batch) for batch in sender.batches] == [1, 10, 4]
            assert outbox.sent == 15
            sent = [pk for batch in sender.batches for pk in batch]
            assert sorted(sent) == sorted(hint.pk for hint in hints(0, 15))
        finally:
            sender.gate.set()
            offloader.shutdown()

    asyncio.run(scenario())


def test_a_trickle_is_coalesced_while_a_send_is_out():
    async def scenario() -> None:
        sender = HeldSender()
        offloader = Offloader(io_threads=1, write_threads=1, sqs_threads=4)
        outbox = HintOutbox(sender, offloader, Logger())  # type: ignore[arg-type]
        try:
            outbox.add(hints(0, 1)[0])
            await until(lambda: sender.out == 1, "the first send out")
            for hint in hints(1, 4):  # one at a time, as a drain releases them
                outbox.add(hint)
                await asyncio.sleep(0)
            assert len(sender.batches) == 1  # nothing more while the first is out
            sender.gate.set()
            await outbox.flush()
            assert [len(batch) for batch in sender.batches] == [1, 4]  # one request, not four
        finally:
            sender.gate.set()
            offloader.shutdown()

    asyncio.run(scenario())
