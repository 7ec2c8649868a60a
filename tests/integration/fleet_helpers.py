"""Helpers for tests that run real worker processes against the embedded backend.

Reusable by the worker integration tests, the chaos suite and local tooling:

* :func:`wait_until` - poll a condition with a generous deadline (the only kind of timing a
  test may rely on; :mod:`bench.waiting`'s, re-exported here);
* :class:`WorkerProcess` - ``python -m wsfleet_worker`` as a child process with its own log
  file, signals (SIGTERM/SIGKILL/SIGSTOP/SIGCONT), and parsers for its JSON log and EMF lines;
* :class:`StoreDriver` - drives the store a fleet of workers shares, not the workers: boto3
  clients bound to one set of resources (explicit endpoint, so it works in module-scoped
  fixtures without monkeypatching), with the operations tests need: start a connection and
  hint it, act as the reconciler, read records and stored messages;
* :func:`streaming` - wait until a worker streams a connection;
* :func:`queue_depth` - a queue's visible and in-flight message counts;
* :class:`UpstreamThread` - a scripted WebSocket upstream for what the simulator does not play;
* :func:`check_stream` - the loss/duplicate check: every seq ``1..upto`` stored exactly once
  with the simulator's content for it;
* pytest fixtures for tests that each want a fleet of their own (``sim``, ``fleet``,
  ``spawn``): a test module binds them at module level (``sim, fleet, spawn =
  fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn``), and pytest finds fixtures
  under the names a module binds. (A ``from`` import would do too, but then every test
  parameter named like one trips ruff's F811.)

Short timings are the defaults of :data:`FAST_WORKER_ENV` (worker lease 2 s, heartbeat 0.5 s,
checkpoints every 0.5 s, a sweep every 2 s).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from websockets.asyncio.server import ServerConnection, serve

from bench.waiting import wait_until
from bench.worker_capacity import json_lines, value
from wsfleet.control import StopCommand
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.lease import is_worker_alive
from wsfleet.messages import MessageStore
from wsfleet.record import (
    INDEX_SHARDS,
    ConnectionRecord,
    DesiredState,
    connection_id_from_pk,
    connection_pk,
)
from wsfleet.store import DynamoDBLeaseStore, IndexEntry
from wsfleet.upstream_options import DEFAULT_OPTIONS, UpstreamOptions
from wsfleet_local.procs import spawn as spawn_child
from wsfleet_local.simulator import SimulatorThread

__all__ = [
    "FAST_WORKER_ENV",
    "SIMULATOR_RATE",
    "StoreDriver",
    "StreamCheck",
    "UpstreamThread",
    "WorkerProcess",
    "check_stream",
    "fleet",
    "queue_depth",
    "resume_problems",
    "sim",
    "spawn",
    "streaming",
    "wait_until",
]


#: No path but the control channel notices a STOP within a test's time: the checkpoint write
#: (ConnectionStopped) and the sweep are slow, so the outcome of a STOP test is explained by
#: the control channel either way (test_worker_stop.py, test_worker_hostile_queues.py).
SLOW_HEARTBEAT_ENV: dict[str, str] = {
    "LEASE_SECONDS": "30",
    "HEARTBEAT_EVERY": "10",
    "LEASE_SAFETY_MARGIN_SECONDS": "2",
    "CHECKPOINT_SECONDS": "600",
    "WORKER_SWEEP_SECONDS": "600",
}

#: Worker settings for tests: short lease and heartbeat, quick polls, frequent metrics.
FAST_WORKER_ENV: dict[str, str] = {
    "LEASE_SECONDS": "2",
    "HEARTBEAT_EVERY": "0.5",
    "LEASE_SAFETY_MARGIN_SECONDS": "0.5",
    "CHECKPOINT_SECONDS": "0.5",
    "WORKER_SWEEP_SECONDS": "2",
    "MESSAGE_FLUSH_MS": "50",
    "DRAIN_TIMEOUT_SECONDS": "10",
    "MESSAGE_RETENTION_DAYS": "1",
    "WORKER_HINT_WAIT_SECONDS": "1",
    "WORKER_CONTROL_WAIT_SECONDS": "1",
    "WORKER_METRICS_FLUSH_SECONDS": "1",
    "WORKER_IO_THREADS": "8",
    "WORKER_WRITE_THREADS": "2",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
    # The worker applies the router's upstream policy too: allow the loopback simulator.
    "ALLOWED_UPSTREAM_HOSTS": "127.0.0.1,localhost",
    "ALLOW_INSECURE_WS": "true",
}

#: Frames per second per stream of the ``sim`` fixture's simulator.
SIMULATOR_RATE = 20.0

#: Worker settings of the make-before-break tests: a lease long enough that a hand-off never
#: races its expiry on a loaded machine, and the default prepare bound.
HANDOFF_TIMING = {
    "LEASE_SECONDS": "8",
    "HEARTBEAT_EVERY": "2",
    "LEASE_SAFETY_MARGIN_SECONDS": "2",
    "HANDOFF_PREPARE_SECONDS": "3",
}

_names = itertools.count(1)


# ============================================================================ worker processes


class WorkerProcess:
    """One ``python -m wsfleet_worker`` child. Always :meth:`stop` it (or use ``with``)."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        log_dir: Path,
        worker_id: str | None = None,
        **overrides: str,
    ) -> None:
        self.worker_id = worker_id or f"w{next(_names)}-{uuid.uuid4().hex[:6]}"
        self.log_path = Path(log_dir) / f"{self.worker_id}.log"
        full_env = {**os.environ, **FAST_WORKER_ENV, **env, **overrides}
        full_env["WORKER_ID"] = self.worker_id
        full_env.setdefault("HEALTH_FILE", str(Path(log_dir) / f"{self.worker_id}.health"))
        full_env.setdefault("CONTROL_QUEUE_PREFIX", f"ctl-{uuid.uuid4().hex[:6]}-")
        self.env = full_env
        # Own session, dies with the test process, stdout and stderr into the log file.
        self.process = spawn_child(
            self.worker_id, [sys.executable, "-m", "wsfleet_worker"], env=full_env,
            log_path=self.log_path,
        )  # fmt: skip

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_running(self) -> bool:
        return self.process.alive()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.popen.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGCONT (in case it is paused), SIGTERM (unless sent already), wait, then SIGKILL.
        Idempotent."""
        self.signal(signal.SIGCONT)
        return self.process.stop(signal.SIGTERM, timeout)

    # -- output -------------------------------------------------------------------------
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """Every JSON line of stdout (log records and EMF documents)."""
        return json_lines(self.log_path)

    def logs(self, message: str | None = None) -> list[dict[str, Any]]:
        """Log records (optionally only those with this ``message``)."""
        return [
            r for r in self.records()
            if "_aws" not in r and (message is None or r.get("message") == message)
        ]

    def metric_total(self, name: str) -> float:
        """Sum of a counter over every EMF document printed so far."""
        return float(sum(value(doc, name) for doc in self.records() if "_aws" in doc))

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


# ============================================================================ driving the store


class StoreDriver:
    """Drives one set of wsfleet resources (tables + hint queue) as the router and the
    reconciler would, and reads what the workers wrote; it starts no worker itself."""

    def __init__(self, env: Mapping[str, str], *, lease_ms: int = 2000) -> None:
        self.env = dict(env)
        session = boto3.session.Session(
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", "testing"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", "testing"),
            region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
        )
        endpoint = env["AWS_ENDPOINT_URL"]
        self.dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        self.sqs = session.client("sqs", endpoint_url=endpoint)
        self.store = DynamoDBLeaseStore(self.dynamodb, env["CONNECTIONS_TABLE"], lease_ms=lease_ms)
        self.messages = MessageStore(self.dynamodb, env["MESSAGES_TABLE"])
        self.hint_queue_url = env["HINT_QUEUE_URL"]
        self.hints = HintSender(self.sqs, self.hint_queue_url)

    # -- connections ----------------------------------------------------------------------
    def start(
        self,
        connection_id: str,
        ws_url: str,
        *,
        resume: bool = True,
        upstream: UpstreamOptions = DEFAULT_OPTIONS,
    ) -> ConnectionRecord:
        """What the router does for START: write the record, then hint it."""
        result = self.store.start(connection_id, ws_url, resume=resume, upstream=upstream)
        self.hints.send(Hint(result.record.pk))
        return result.record

    def record(self, connection_id: str) -> ConnectionRecord:
        record = self.store.get(connection_pk(connection_id))
        assert record is not None, f"no record for {connection_id}"
        return record

    def wait_for_state(
        self,
        connection_id: str,
        state: DesiredState,
        *,
        timeout: float,
        message: str | Callable[[], str] | None = None,
    ) -> ConnectionRecord:
        """The connection's record once it reaches ``state`` (a bounded wait, never a timing
        assertion); ``message`` says what the workers did if it never does."""
        record: ConnectionRecord = wait_until(
            lambda: (r := self.record(connection_id)).desired_state is state and r,
            timeout=timeout,
            message=message or (lambda: f"not {state.value}: {self.record(connection_id)}"),
        )
        return record

    def hint_orphans(self) -> list[str]:
        """One reconciler pass, as lease model v2 reads: the connections of every worker whose
        lease is over (gsi_workers, then gsi_owner), and every STARTED connection left free
        (gsi_unowned); hint each of them."""
        now = int(time.time() * 1000)
        entries: list[IndexEntry] = []
        workers = self.store.get_workers(self.store.list_worker_ids())
        for worker in workers.values():
            if not is_worker_alive(worker, now):
                entries.extend(self.store.owned_by(worker.worker_id))
        for shard in range(INDEX_SHARDS):
            entries.extend(self.store.unowned(shard, now + 1))
        self.hints.send_many(Hint(e.pk, epoch=e.epoch) for e in entries)
        return [connection_id_from_pk(e.pk) for e in entries]

    def worker_item(self, worker_id: str) -> Any:
        return self.store.get_worker(worker_id, consistent=True)

    # -- stored frames --------------------------------------------------------------------
    def stored(self, connection_id: str) -> list[dict[str, Any]]:
        return self.messages.read_all(connection_pk(connection_id))

    def stored_seqs(self, connection_id: str) -> list[int]:
        return [item["seq"] for item in self.stored(connection_id) if "seq" in item]

    def send_stop(self, worker_id: str, pk: str, epoch: int) -> None:
        """A StopCommand on the worker's control queue, as the stream notifier sends it."""
        queue_url = self.worker_item(worker_id).control_queue_url
        self.sqs.send_message(QueueUrl=queue_url, MessageBody=StopCommand(pk, epoch).body())

    def purge_hints(self) -> None:
        self.sqs.purge_queue(QueueUrl=self.hint_queue_url)


def streaming(fleet: StoreDriver, stream_id: str, worker: WorkerProcess) -> ConnectionRecord:
    """Wait until frames of ``stream_id`` are stored (no renewal needed for that); its record,
    owned by ``worker``."""
    wait_until(lambda: len(fleet.stored_seqs(stream_id)) >= 5, timeout=60, message=worker.tail)
    record = fleet.record(stream_id)
    assert record.lease_owner == worker.worker_id
    return record


def queue_depth(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue: SQS's approximate counts, exact on moto."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


class UpstreamThread:
    """A WebSocket upstream on 127.0.0.1 in a daemon thread, for what the simulator does not
    play (an oversize frame on every connection, a fixed hostile script): ``handler`` serves
    each connection, and :attr:`connections` counts them.

    Example::

        with UpstreamThread(send_script) as upstream:
            fleet.start("s", upstream.url("s"))
    """

    def __init__(
        self, handler: Callable[[ServerConnection], Awaitable[None]], **serve_options: Any
    ) -> None:
        """``serve_options`` go to websockets' ``serve`` (``max_size=None`` unless given:
        what the worker sends back is not under test, its own limit is)."""
        self.handler = handler
        self.serve_options = {"max_size": None, **serve_options}
        self.port = 0
        self.connections = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UpstreamThread:
        self._thread.start()
        assert self._ready.wait(10), "the upstream did not start"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)

    def url(self, name: str) -> str:
        return f"ws://127.0.0.1:{self.port}/{name}"

    async def _serve(self, ws: ServerConnection) -> None:
        self.connections += 1
        await self.handler(ws)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = self._loop.create_future()
            async with serve(self._serve, "127.0.0.1", 0, **self.serve_options) as server:
                self.port = server.sockets[0].getsockname()[1]
                self._ready.set()
                await self._stop

        self._loop.run_until_complete(main())
        self._loop.close()


@dataclass
class StreamCheck:
    """Outcome of :func:`check_stream` (empty lists mean clean)."""

    upto: int
    missing: list[int] = field(default_factory=list)
    wrong_content: list[int] = field(default_factory=list)
    bad_keys: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong_content or self.bad_keys)


def check_stream(
    items: Iterable[Mapping[str, Any]], stream_id: str, upto: int
) -> StreamCheck:
    """Every seq 1..upto stored once (keys are unique per table), with its own content.

    ``data`` of frame n on stream s is ``"s:n"`` (see ``wsfleet_local.simulator.frame_data``),
    and an item's sk must be its seq zero-padded: then a replayed frame can only have
    overwritten itself, never added a second copy.
    """
    check = StreamCheck(upto)
    seen: dict[int, Mapping[str, Any]] = {}
    for item in items:
        if "seq" not in item:
            continue
        seq = int(item["seq"])
        if item["sk"] != f"{seq:020d}":
            check.bad_keys.append(item["sk"])
        seen[seq] = item
    for seq in range(1, upto + 1):
        item = seen.get(seq)
        if item is None:
            check.missing.append(seq)
        elif item.get("message_data") != f"{stream_id}:{seq}":
            check.wrong_content.append(seq)
    return check


def resume_problems(sessions: Iterable[Any]) -> list[str]:
    """Upstream sessions of one stream (simulator SessionRecords, oldest first) that did not
    resume where the previous one left off.

    A session must ask for ``from_seq <= previous.last_seq_sent + 1`` (asking for less is a
    harmless overlap: the replayed frames overwrite themselves), and the simulator must not
    have had to skip frames (``gap == 0``).
    """
    problems: list[str] = []
    previous = None
    for session in sessions:
        if session.gap:
            problems.append(f"session {session.session_id} skipped {session.gap} frames")
        if previous is not None:
            sent = previous.last_seq_sent if previous.last_seq_sent is not None else (
                (previous.from_seq or 1) - 1
            )
            if session.from_seq is None or session.from_seq > sent + 1:
                problems.append(
                    f"session {session.session_id} resumed at {session.from_seq} after "
                    f"session {previous.session_id} sent up to {sent}"
                )
        previous = session
    return problems


# ============================================================================ pytest fixtures
# A fresh fleet per test: its own simulator, its own resources (``aws`` of tests/conftest.py),
# its own worker processes.


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    """An upstream WebSocket simulator streaming :data:`SIMULATOR_RATE` frames/s per stream."""
    with SimulatorThread(rate=SIMULATOR_RATE) as running:
        yield running


@pytest.fixture
def fleet(aws: Any) -> StoreDriver:
    """Clients and operations over the test's own tables and hint queue."""
    return StoreDriver(aws.env())


@pytest.fixture
def spawn(aws: Any, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn(**env_overrides)`` starts a worker on the test's resources, logging under
    ``tmp_path``; every worker started is stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(**overrides: str) -> WorkerProcess:
        worker = WorkerProcess(aws.env(), log_dir=tmp_path, **overrides)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
