"""Two real worker processes stream from the simulator into the moto-backed tables.

One fleet (tables, simulator, two ``python -m wsfleet_worker`` processes with lease 2 s and
heartbeat 0.5 s) serves every test of this module; each test uses its own stream ids.
Assertions are on the messages table, the connection records and the simulator's session
log; the only timing is generous wait-until deadlines.
"""

from __future__ import annotations

import uuid

import pytest
from fleet_helpers import (
    StoreDriver,
    WorkerProcess,
    check_stream,
    queue_depth,
    resume_problems,
    wait_until,
)

from wsfleet.record import DesiredState
from wsfleet.upstream_options import parse_upstream_options
from wsfleet_local.simulator import SimulatorThread
from wsfleet_worker.health import is_fresh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RATE = 20.0  # frames/s per stream


@pytest.fixture(scope="module")
def sim():
    with SimulatorThread(rate=RATE) as running:
        yield running


@pytest.fixture(scope="module")
def env(backend):
    return backend.create_resources(f"wst-{uuid.uuid4().hex[:6]}").env()


@pytest.fixture(scope="module")
def fleet(env) -> StoreDriver:
    return StoreDriver(env)


@pytest.fixture(scope="module")
def workers(env, sim, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("workers")
    pair = (WorkerProcess(env, log_dir=log_dir), WorkerProcess(env, log_dir=log_dir))
    try:
        yield pair
    finally:
        for worker in pair:
            worker.stop()


def logs_of(workers) -> str:
    return "\n---\n".join(w.tail(30) for w in workers)


def streamed_past(
    fleet: StoreDriver, stream_id: str, seq: int, workers, timeout: float = 30.0
) -> int:
    """Wait until the stored checkpoint of ``stream_id`` reaches ``seq``; return it."""
    return wait_until(
        lambda: (last := fleet.record(stream_id).last_seq) >= seq and last,
        timeout=timeout,
        message=lambda: f"{stream_id} checkpoint stuck at {fleet.record(stream_id).last_seq}\n"
        + logs_of(workers),
    )


def metric(workers, name: str) -> float:
    return sum(w.metric_total(name) for w in workers)


def test_start_streams_frames_into_the_messages_table(fleet, sim, workers):
    fleet.start("plain", sim.url_for("plain"))

    checkpoint = streamed_past(fleet, "plain", 30, workers)

    record = fleet.record("plain")
    assert record.lease_owner in {w.worker_id for w in workers}
    assert record.lease_epoch == 1
    check = check_stream(fleet.stored("plain"), "plain", checkpoint)
    assert check.ok, check
    (session,) = sim.sessions("plain")
    assert session.from_seq == 1 and session.is_open
    owner = next(w for w in workers if w.worker_id == record.lease_owner)
    assert is_fresh(owner.env["HEALTH_FILE"], 1.5)


def test_workers_register_their_control_queue(fleet, workers):
    for worker in workers:
        item = wait_until(lambda w=worker: fleet.worker_item(w.worker_id), timeout=30)
        assert item.control_queue_url.endswith(worker.worker_id)
        queue_tags = fleet.sqs.list_queue_tags(QueueUrl=item.control_queue_url)["Tags"]
        assert queue_tags == {"wsfleet:worker_id": worker.worker_id}


def test_resent_start_does_not_move_a_live_connection(fleet, sim, workers):
    fleet.start("steady", sim.url_for("steady"))
    streamed_past(fleet, "steady", 10, workers)
    before = fleet.record("steady")

    for _ in range(3):  # the router re-hints on every START
        fleet.start("steady", sim.url_for("steady"))

    wait_until(
        lambda: queue_depth(fleet.sqs, fleet.hint_queue_url) == (0, 0),
        timeout=30,
        message="hints were not consumed",
    )
    streamed_past(fleet, "steady", before.last_seq + 10, workers)
    after = fleet.record("steady")
    assert (after.lease_owner, after.lease_epoch) == (before.lease_owner, before.lease_epoch)
    (session,) = sim.sessions("steady")
    assert session.is_open


def test_abnormal_closes_reconnect_and_resume_without_gap(fleet, sim, workers):
    fleet.start("flaky", sim.url_for("flaky"))
    streamed_past(fleet, "flaky", 10, workers)

    def sessions_reach(count: int) -> None:
        wait_until(
            lambda: len(sim.sessions("flaky")) >= count,
            timeout=30,
            message=lambda: logs_of(workers),
        )

    sim.inject_fault("flaky", "drop")  # TCP reset, no close frame
    sessions_reach(2)
    sim.inject_fault("flaky", "close_error")  # 1011
    sessions_reach(3)
    sim.inject_fault("flaky", "reject")  # the next handshake gets HTTP 503 ...
    sim.inject_fault("flaky", "drop")  # ... which is the reconnect after this drop
    sessions_reach(4)
    sent = max(s.last_seq_sent or 0 for s in sim.sessions("flaky"))
    checkpoint = streamed_past(fleet, "flaky", sent + 10, workers)

    sessions = sim.sessions("flaky")
    assert resume_problems(sessions) == []
    assert sessions[0].from_seq == 1
    check = check_stream(fleet.stored("flaky"), "flaky", checkpoint)
    assert check.ok, check
    record = fleet.record("flaky")
    assert record.lease_epoch == 1  # the lease was held throughout: no handover
    # Upstream trouble (1011, a refused handshake, a dropped link) never counts as poison.
    assert (record.desired_state, record.failure_count) == (DesiredState.STARTED, 0)
    assert record.last_error is not None
    # A coarse category (wsfleet_worker.session_rules.ErrorCategory), never socket or HTTP detail.
    assert record.last_error in {
        "handshake_rejected", "connection_lost", "upstream_closed (code 1011)", "connect_failed",
    }, record.last_error
    wait_until(lambda: metric(workers, "Reconnects") >= 4, timeout=10)


def test_routine_normal_closes_reconnect_and_resume_without_gap(fleet, sim, workers):
    # GIVEN a streaming connection with the default options
    fleet.start("routine", sim.url_for("routine"))
    streamed_past(fleet, "routine", 10, workers)
    # WHEN the upstream closes it routinely: 1000 (a session limit), twice
    for count in (2, 3):
        sim.inject_fault("routine", "close_normal")
        wait_until(
            lambda n=count: len(sim.sessions("routine")) >= n,
            timeout=30,
            message=lambda: logs_of(workers),
        )
    # THEN every close reconnected and resumed where the stream was: nothing lost, still
    # STARTED under the same lease, the close shown as the last error, nothing counted
    sent = max(s.last_seq_sent or 0 for s in sim.sessions("routine"))
    checkpoint = streamed_past(fleet, "routine", sent + 10, workers)
    sessions = sim.sessions("routine")
    assert resume_problems(sessions) == []
    assert [s.close_code for s in sessions[:2]] == [1000, 1000]
    check = check_stream(fleet.stored("routine"), "routine", checkpoint)
    assert check.ok, check
    record = fleet.record("routine")
    assert (record.desired_state, record.lease_epoch, record.failure_count) == (
        DesiredState.STARTED, 1, 0)  # fmt: skip
    assert record.last_error == "upstream_closed (code 1000)"


def test_with_normal_close_final_the_upstreams_end_stops_the_connection(fleet, sim, workers):
    sim.open_stream("finite", max_seq=40)  # sends 1..40, then closes with 1000
    fleet.start(
        "finite",
        sim.url_for("finite"),
        upstream=parse_upstream_options({"normal_close": "final"}, secret_prefixes=()),
    )

    record = fleet.wait_for_state(
        "finite",
        DesiredState.STOPPED,
        timeout=30,
        message=lambda: logs_of(workers),
    )

    assert record.stop_reason == "upstream_closed"
    assert record.lease_owner == ""
    assert record.last_seq == 40
    check = check_stream(fleet.stored("finite"), "finite", 40)
    assert check.ok, check
    assert len(sim.sessions("finite")) == 1  # nobody reconnected to a finished stream


def test_garbage_and_unnumbered_frames_are_stored_counted_and_harmless(fleet, sim, workers):
    fleet.start("noisy", sim.url_for("noisy"))
    streamed_past(fleet, "noisy", 5, workers)

    sim.inject_fault("noisy", "garbage")
    sim.inject_fault("noisy", "noseq")

    def unnumbered():
        return [i for i in fleet.stored("noisy") if "seq" not in i]

    local = wait_until(lambda: len(u := unnumbered()) == 2 and u, timeout=30)
    assert sorted(i["message_data"] for i in local) == ["<<garbage for noisy>>", "noisy:noseq"]
    assert all(i["sk"].startswith("L") for i in local)
    before = fleet.record("noisy").last_seq
    checkpoint = streamed_past(fleet, "noisy", before + 10, workers)
    check = check_stream(fleet.stored("noisy"), "noisy", checkpoint)
    assert check.ok, check
    assert len(sim.sessions("noisy")) == 1  # no crash, no reconnect
    wait_until(
        lambda: metric(workers, "InvalidFrames") >= 1 and metric(workers, "NoSeqFrames") >= 1,
        timeout=10,
    )


def test_logs_are_json_with_ids_and_no_query_strings(fleet, sim, workers):
    fleet.start("private", sim.url_for("private") + "?token=s3cr3t")
    streamed_past(fleet, "private", 5, workers)
    for worker in workers:
        text = worker.output()
        assert "s3cr3t" not in text
        for line in worker.logs():
            assert line["worker_id"] == worker.worker_id
        for line in worker.logs("session started"):
            assert {"connection_id", "epoch"} <= set(line)
    assert metric(workers, "MessagesReceived") > 0
    documents = [d for w in workers for d in w.records() if "ActiveConnections" in d]
    assert documents and documents[-1]["ServiceName"] == "wsfleet-worker"
