"""Lease model v2 on the moto server: what one worker writes, and how it fences.

An in-process :class:`~wsfleet_worker.worker.Worker` runs against the test's own tables with
short timings. Every DynamoDB request of its client is recorded with a botocore event hook
(``before-parameter-build``), so the tests count real requests, not calls of our own code:

* idle connections cost one worker-item write per heartbeat and no connection-item write;
* a busy connection's checkpoint is written at most once per CHECKPOINT_SECONDS;
* a worker whose renewals fail (throttled, injected with a ``before-call`` hook) fences every
  session before its lease expires, writes nothing afterwards and exits with status 3;
* a connection the worker owns without a session is released by its sweep, hinted, and
  taken again.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FAST_WORKER_ENV, StoreDriver
from websockets.asyncio.server import ServerConnection, serve
from worker_doubles import Logger

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import now_ms
from wsfleet.record import connection_pk
from wsfleet_local.simulator import SimulatorThread
from wsfleet_local.waiting import wait_until_async
from wsfleet_worker.config import WorkerConfig
from wsfleet_worker.worker import EXIT_LEASE_LOST, Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LIMIT = 30.0  # a bound on waiting, never a timing assertion
HEARTBEAT_MS = 500
#: Clock granularity allowance when checking "not more often than": requests are stamped
#: when botocore builds them, a few ms after the renewal computed its start.
SLACK_MS = 30
_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}


@dataclass(frozen=True)
class Request:
    at_ms: int
    operation: str
    pk: str
    params: dict[str, Any]


class RequestLog:
    """Every DynamoDB request a client makes, from botocore's own event hooks."""

    def __init__(self, client: Any) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self.throttle_renewals = False
        client.meta.events.register("before-parameter-build.dynamodb", self._record)
        client.meta.events.register("before-call.dynamodb.UpdateItem", self._inject)

    def _record(self, params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        key = params.get("Key") or params.get("Item") or {}
        pk = str(key.get("pk", {}).get("S", ""))
        with self._lock:
            self.requests.append(Request(now_ms(), model.name, pk, params))

    def _inject(self, params: dict[str, Any], **kwargs: Any) -> Any:
        """Short-circuit worker-item updates with a throttling error while asked to."""
        if not self.throttle_renewals:
            return None
        body = json.loads(params.get("body") or b"{}")
        if not str(body.get("Key", {}).get("pk", {}).get("S", "")).startswith("WORKER#"):
            return None
        error = {
            "Error": {"Code": "ThrottlingException", "Message": "injected"},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
        return _Status(400), error

    def since(self, mark: int) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.at_ms >= mark]

    def writes(self, prefix: str, since: int = 0) -> list[Request]:
        return [
            r for r in self.since(since)
            if r.operation in _WRITES and r.pk.startswith(prefix)
        ]

    def message_writes(self, since: int = 0) -> list[Request]:
        return [r for r in self.since(since) if r.operation == "BatchWriteItem"]


@dataclass(frozen=True)
class _Status:
    status_code: int


def gaps(requests: list[Request]) -> list[int]:
    return [b.at_ms - a.at_ms for a, b in itertools.pairwise(requests)]


#: The shared poll (wsfleet_local.waiting), bounded by LIMIT.
until = functools.partial(wait_until_async, timeout=LIMIT)


def run_worker(
    aws: Any,
    tmp_path: Path,
    scenario: Callable[[Worker, RequestLog, StoreDriver], Awaitable[None]],
    **overrides: str,
) -> int:
    """Run a worker in this process around ``scenario``; returns its exit status."""
    env = {
        **os.environ,
        **FAST_WORKER_ENV,
        "WORKER_ID": f"live-{aws.endpoint_url[-5:]}-{time.monotonic_ns() % 10**6}",
        "HEALTH_FILE": str(tmp_path / "health"),
        "WORKER_CONTROL_CHANNEL": "false",
        **overrides,
    }
    config = WorkerConfig.from_env(env)

    async def main() -> int:
        dynamodb = dynamodb_client(max_pool_connections=16)
        log = RequestLog(dynamodb)
        # A recording logger: Powertools keeps one logger per service and process only.
        worker = Worker.from_config(
            config, dynamodb=dynamodb, sqs=sqs_client(max_pool_connections=16), logger=Logger()
        )
        fleet = StoreDriver(aws.env())
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: fleet.worker_item(worker.worker_id), "the worker item")
            await scenario(worker, log, fleet)
        finally:
            worker.request_stop()
        return await asyncio.wait_for(running, LIMIT)

    return asyncio.run(main())


async def idle_upstream() -> Any:
    """A WebSocket server that accepts and never sends a frame."""

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    return await serve(handler, "127.0.0.1", 0)


def url_of(server: Any, name: str) -> str:
    port = server.sockets[0].getsockname()[1]
    return f"ws://127.0.0.1:{port}/{name}"


def test_idle_connections_cost_one_worker_write_per_heartbeat_and_no_connection_write(
    aws, tmp_path
):
    async def scenario(worker: Worker, log: RequestLog, fleet: StoreDriver) -> None:
        # GIVEN a worker holding five idle connections
        server = await idle_upstream()
        try:
            for i in range(5):
                fleet.start(f"idle{i}", url_of(server, f"idle{i}"))
            await until(
                lambda: len(worker.taker.running()) == 5
                and all(s.state.name == "STREAMING" for s in worker.sessions.values()),
                "five streaming sessions",
            )
            # WHEN it holds them for several heartbeats
            mark = now_ms()
            await until(lambda: len(log.writes("WORKER#", mark)) >= 6, "six heartbeats")
            window = log.since(mark)
        finally:
            server.close()
        # THEN each write was the worker item's renewal, at most one per heartbeat ...
        writes = [r for r in window if r.operation in _WRITES]
        assert {(r.operation, r.pk) for r in writes} == {
            ("UpdateItem", f"WORKER#{worker.worker_id}")
        }
        assert all(gap >= HEARTBEAT_MS - SLACK_MS for gap in gaps(writes)), gaps(writes)
        # ... and nothing touched a connection item (no renew, no checkpoint while idle)
        assert [r for r in window if r.pk.startswith("CONN#")] == []
        assert all(r.params["ExpressionAttributeValues"][":n"] == {"N": "5"} for r in writes)

    assert run_worker(aws, tmp_path, scenario) == 0


def test_a_busy_connection_checkpoints_at_most_once_per_checkpoint_interval(aws, tmp_path):
    with SimulatorThread(rate=20.0) as sim:

        async def scenario(worker: Worker, log: RequestLog, fleet: StoreDriver) -> None:
            # GIVEN a connection streaming 20 frames/s with CHECKPOINT_SECONDS=1
            fleet.start("busy", sim.url_for("busy"))
            await until(lambda: fleet.record("busy").last_seq > 0, "a first checkpoint")
            # WHEN it streams for a few intervals
            mark = now_ms()
            await until(lambda: len(log.writes("CONN#", mark)) >= 4, "four checkpoints")
            checkpoints = log.writes("CONN#", mark)
            # THEN the connection item was written at most once a second, each time forward
            assert all(r.operation == "UpdateItem" for r in checkpoints)
            assert all(gap >= 1000 - SLACK_MS for gap in gaps(checkpoints)), gaps(checkpoints)
            seqs = [int(r.params["ExpressionAttributeValues"][":last_seq"]["N"])
                    for r in checkpoints]
            assert seqs == sorted(set(seqs))
            assert len(log.message_writes(mark)) > len(checkpoints)  # frames flowed meanwhile

        assert run_worker(aws, tmp_path, scenario, CHECKPOINT_SECONDS="1") == 0


def test_failing_renewals_fence_every_session_before_the_expiry_and_exit_3(aws, tmp_path):
    fenced_at: list[int] = []
    with SimulatorThread(rate=20.0) as sim:

        async def scenario(worker: Worker, log: RequestLog, fleet: StoreDriver) -> None:
            # GIVEN a worker streaming two connections
            for name in ("f0", "f1"):
                fleet.start(name, sim.url_for(name))
            await until(lambda: all(fleet.record(n).last_seq > 0 for n in ("f0", "f1")),
                        "both streaming")
            on_fence = worker.liveness._on_fence
            worker.liveness._on_fence = lambda cause: (fenced_at.append(now_ms()),
                                                       on_fence(cause))[1]
            # WHEN every renewal of its worker item is throttled from now on
            log.throttle_renewals = True
            await until(lambda: fenced_at, "the self-fence")
            await asyncio.sleep(1.0)  # let anything that would still write try to
            # THEN it fenced before the lease it last wrote expired ...
            item = fleet.worker_item(worker.worker_id)
            assert fenced_at[0] < item.expires_at_ms
            assert not item.dead  # not retired: it expires
            # ... closed both upstream sockets, and wrote nothing after the fence
            assert all(not s.is_open for n in ("f0", "f1") for s in sim.sessions(n))
            late = [r for r in log.since(fenced_at[0]) if r.operation in _WRITES]
            assert [r for r in late if not r.pk.startswith("WORKER#")] == []
            assert log.message_writes(fenced_at[0]) == []
            for name in ("f0", "f1"):  # nothing released: the connections lapse with it
                assert fleet.record(name).lease_owner == worker.worker_id
            assert worker.metrics.totals["SelfFenced"] == 2
            assert worker.metrics.totals["WorkerSelfFenced"] == 1

        assert run_worker(aws, tmp_path, scenario) == EXIT_LEASE_LOST


def test_a_connection_owned_without_a_session_is_released_by_the_sweep_and_taken_again(
    aws, tmp_path
):
    async def scenario(worker: Worker, log: RequestLog, fleet: StoreDriver) -> None:
        server = await idle_upstream()
        try:
            # GIVEN a connection that names the worker, with no session (no hint was sent)
            fleet.store.start("strand", url_of(server, "strand"))
            taken = fleet.store.acquire(connection_pk("strand"), worker.worker_id)
            # WHEN the sweep runs
            record = await until(
                lambda: (r := fleet.record("strand")).lease_epoch > taken.lease_epoch
                and connection_pk("strand") in worker.taker.running() and r,
                "the stranded connection to be streamed again",
            )
        finally:
            server.close()
        # THEN it was released and hinted, and acquired anew (here by the same worker)
        assert worker.metrics.totals["SweepReleases"] == 1
        assert (record.lease_owner, record.lease_epoch) == (
            worker.worker_id, taken.lease_epoch + 1
        )

    assert run_worker(aws, tmp_path, scenario, WORKER_SWEEP_SECONDS="1") == 0

