"""The crash-loop breaker with real worker processes: a poison frame ends FAILED, visibly.

A small ``websockets.serve`` on 127.0.0.1 plays a hostile upstream: it sends the good frames
from ``from_seq`` up to :data:`POISON_SEQ` and then that frame, over ``WORKER_MAX_FRAME_BYTES``,
so the worker closes with 1009 at the same checkpoint on every reconnect. Without the breaker
that loops forever; with it the connection ends FAILED after ``WORKER_BREAKER_MAX_FAILURES``
closes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import fleet_helpers
import pytest
from fleet_helpers import FAST_WORKER_ENV, StoreDriver, UpstreamThread, WorkerProcess, wait_until
from websockets.asyncio.server import ServerConnection

from wsfleet.record import ConnectionRecord, DesiredState
from wsfleet.views import connection_view
from wsfleet_worker.config import WorkerConfig
from wsfleet_worker.session import Session
from wsfleet_worker.worker import Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MAX_FRAME_BYTES = 1024
MAX_FAILURES = 3
POISON_SEQ = 3

fleet, spawn = fleet_helpers.fleet, fleet_helpers.spawn


async def poison_upstream(ws: ServerConnection) -> None:
    """An upstream that always follows its good frames with an oversize one."""
    path = ws.request.path if ws.request is not None else ""
    from_seq = int(path.partition("from_seq=")[2] or 1)
    for seq in range(from_seq, POISON_SEQ):
        await ws.send(json.dumps({"seq": seq, "data": "ok"}))
    await ws.send(json.dumps({"seq": POISON_SEQ, "data": "x" * (4 * MAX_FRAME_BYTES)}))
    await ws.wait_closed()


@pytest.fixture
def upstream() -> Iterator[UpstreamThread]:
    with UpstreamThread(poison_upstream) as running:
        yield running


def test_an_oversize_frame_at_one_checkpoint_ends_failed(backend, upstream, tmp_path):
    # GIVEN two workers with a small frame limit and a breaker of 3
    env = backend.create_resources(f"wsb-{uuid.uuid4().hex[:6]}").env()
    fleet = StoreDriver(env)
    overrides = {
        "WORKER_MAX_FRAME_BYTES": str(MAX_FRAME_BYTES),
        "WORKER_BREAKER_MAX_FAILURES": str(MAX_FAILURES),
    }
    workers = [WorkerProcess(env, log_dir=tmp_path, **overrides) for _ in range(2)]
    try:
        # WHEN a connection is started on an upstream that always sends the oversize frame
        fleet.start("poison", upstream.url("poison"))
        record = fleet.wait_for_state(
            "poison",
            DesiredState.FAILED,
            timeout=60,
            message=lambda: f"{fleet.record('poison')}\n"
            + "\n---\n".join(w.tail(30) for w in workers),
        )
        # THEN it ends FAILED, free, with the worker's own close as the reason
        assert record.lease_owner == ""
        assert record.stop_reason is not None and record.stop_reason.startswith(
            "closed_by_worker (code 1009"
        ), record.stop_reason
        assert record.last_error == record.stop_reason
        assert (record.failure_count, record.failure_seq) == (MAX_FAILURES, POISON_SEQ - 1)
        assert record.last_seq == POISON_SEQ - 1  # the good frames before it are kept
        # AND the churn was bounded: one epoch per failure at most, and no reconnect after
        assert record.lease_epoch <= MAX_FAILURES
        assert upstream.connections == MAX_FAILURES
        # AND the router's view shows it, and the listing by state finds it
        view = connection_view(record, None, 0)
        assert view["desired_state"] == "FAILED"
        assert view["failures"] == {"count": MAX_FAILURES, "at_seq": record.failure_seq}
        listed = fleet.store.list_connections(DesiredState.FAILED).records
        assert [r.connection_id for r in listed] == ["poison"]
        # AND the metric was counted (metrics are flushed every second in tests)
        wait_until(
            lambda: sum(w.metric_total("ConnectionsFailed") for w in workers) >= 1,
            timeout=30,
            message="ConnectionsFailed not emitted",
        )
    finally:
        for worker in workers:
            worker.stop()
    assert sum(w.metric_total("ConnectionsFailed") for w in workers) == 1


def test_a_session_crashing_at_one_checkpoint_ends_failed(aws, upstream, monkeypatch, tmp_path):
    """CRASHED counts too: an in-process worker whose frame handling always raises.

    The crash is provoked by replacing ``Session._on_frame`` (the dependency the streaming
    loop calls per frame); the worker, its store and its queues are the real ones.
    """
    # GIVEN a worker whose sessions crash on their first frame, with a breaker of 3
    for name, value in {**FAST_WORKER_ENV, "WORKER_BREAKER_MAX_FAILURES": str(MAX_FAILURES),
                        "HEALTH_FILE": str(tmp_path / "health"),
                        "CONTROL_QUEUE_PREFIX": f"ctl-{uuid.uuid4().hex[:6]}-"}.items():
        monkeypatch.setenv(name, value)

    async def crash(self: Session, raw: str | bytes) -> None:
        raise RuntimeError("bug triggered by this frame")

    monkeypatch.setattr(Session, "_on_frame", crash)
    fleet = StoreDriver(aws.env())
    worker = Worker.from_config(WorkerConfig.from_env())

    async def scenario() -> ConnectionRecord:
        running = asyncio.create_task(worker.run())
        try:
            # WHEN a connection is started
            await asyncio.to_thread(fleet.start, "crashy", upstream.url("crashy"))

            def failed() -> ConnectionRecord | None:
                record = fleet.record("crashy")
                return record if record.desired_state is DesiredState.FAILED else None

            return await asyncio.to_thread(
                wait_until, failed, timeout=60, message=lambda: str(fleet.record("crashy"))
            )
        finally:
            worker.request_stop()
            await running

    record = asyncio.run(scenario())
    # THEN it ends FAILED after exactly MAX_FAILURES sessions, the reason the crash category
    assert (record.stop_reason, record.last_error) == ("crashed", "crashed")
    assert (record.failure_count, record.failure_seq) == (MAX_FAILURES, 0)
    assert record.lease_epoch == MAX_FAILURES
    assert upstream.connections == MAX_FAILURES
    assert record.lease_owner == ""


async def progress_then_oversize(ws: ServerConnection) -> None:
    """Issue #23's loop: one new frame on every connect (the checkpoint moves each time),
    then a frame over the limit. A live-only feed whose connect-time snapshot is too big."""
    path = ws.request.path if ws.request is not None else ""
    from_seq = int(path.partition("from_seq=")[2] or 1)
    await ws.send(json.dumps({"seq": from_seq, "data": "new"}))
    await ws.send(json.dumps({"seq": from_seq + 1, "data": "x" * (4 * MAX_FRAME_BYTES)}))
    await ws.wait_closed()


def test_progress_then_an_oversize_frame_on_every_connect_ends_failed(fleet, spawn):
    # GIVEN a worker with a small frame limit and a breaker of 3 (its window the default)
    with UpstreamThread(progress_then_oversize) as upstream:
        worker = spawn(
            WORKER_MAX_FRAME_BYTES=str(MAX_FRAME_BYTES),
            WORKER_BREAKER_MAX_FAILURES=str(MAX_FAILURES),
        )
        # WHEN a connection streams from an upstream that moves the checkpoint on every
        # session before the worker closes it with 1009
        fleet.start("creeping", upstream.url("creeping"))
        record = fleet.wait_for_state(
            "creeping", DesiredState.FAILED, timeout=60, message=lambda: worker.tail(30)
        )
    # THEN it ends FAILED after MAX_FAILURES sessions, each of which made progress
    assert record.stop_reason is not None
    assert record.stop_reason.startswith("closed_by_worker (code 1009"), record.stop_reason
    assert record.failure_count == MAX_FAILURES
    assert upstream.connections == MAX_FAILURES
    # the checkpoint moved on every session (the breaker's position rule alone never trips);
    # the last session's frame may still have been in flight at the final write
    assert record.failure_seq is not None and record.failure_seq >= MAX_FAILURES - 1
    assert record.last_seq >= MAX_FAILURES - 1
