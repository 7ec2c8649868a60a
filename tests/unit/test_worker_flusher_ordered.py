"""MessageFlusher with an ordered sink (``SinkLimits.ordered``, the Kinesis sink): one batch at
a time, and a frame handed back unwritten goes again before its connection's later frames.
The stand-in store and owners are those of test_worker_flusher."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from test_worker_flusher import WAIT, Owner, RecordingStore, frame, until

from wsfleet_worker.flusher import MessageFlusher
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader


@pytest.mark.parametrize("ordered", [True, False])
def test_a_retried_frame_lands_before_its_connections_later_frames(ordered):
    async def main() -> list[int]:
        store = RecordingStore()
        store.limits = dataclasses.replace(store.limits, ordered=ordered)
        offloader = Offloader(io_threads=1, write_threads=4)
        flusher = MessageFlusher(
            store, offloader, WorkerMetrics("t", emit=lambda doc: None), flush_ms=0,
            max_in_flight=4,
        )  # fmt: skip
        task = asyncio.create_task(flusher.run())
        owner = Owner("a")
        try:
            # GIVEN frame 2's first write is refused (throttled)
            store.unwritten_once = {("CONN#a", frame(owner, 2).message.sk)}
            for seq in (1, 2):
                await flusher.put(frame(owner, seq))
            await until(lambda: 1 in owner.written)
            # WHEN the connection's next frames come while frame 2 waits for its retry
            for seq in (3, 4, 5):
                await flusher.put(frame(owner, seq))
            await until(lambda: sorted(owner.written) == [1, 2, 3, 4, 5])
        finally:
            task.cancel()
            await flusher.aclose()
            offloader.shutdown()
        landed = [m.seq for batch in store.batches for m in batch]
        landed.remove(2)  # its refused first attempt
        return landed

    landed = asyncio.run(asyncio.wait_for(main(), WAIT))
    # THEN with an ordered sink frame 2 is written again before 3, 4 and 5
    if ordered:
        assert landed == [1, 2, 3, 4, 5]
    else:  # the DynamoDB sink has no order to keep: later batches do not wait for a retry
        assert sorted(landed) == [1, 2, 3, 4, 5]
