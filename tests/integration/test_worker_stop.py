"""STOP closes the upstream socket: through the worker's control queue, or else through the
checkpoint write or the worker's sweep (lease model v2: nothing is renewed per connection).

The stream notifier Lambda (another component) turns a STOPPED record into a StopCommand on
the owner's control queue; here the test sends that command itself, as the notifier would.
Which path closed the session is read from the worker's own log line ("session finished",
``via``), so no assertion depends on timing:

* control path: checkpoints and sweeps are slow (SLOW_HEARTBEAT_ENV), so neither can come
  first;
* fallback paths: the control channel is disabled, and either the sweep (every 1 s, no
  checkpoint due) or the checkpoint write (ConnectionStopped; no sweep due) notices the STOP.
"""

from __future__ import annotations

import fleet_helpers
import pytest
from fleet_helpers import StoreDriver, WorkerProcess, check_stream, streaming, wait_until

from wsfleet.record import DesiredState, connection_pk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Per-test fixtures from fleet_helpers (also used by test_worker_failover.py): a simulator, clients
# over the test's own resources, and worker processes stopped when the test ends. Binding them
# here is what makes pytest find them in this module.
sim, fleet, spawn = fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn

SLOW_HEARTBEAT = fleet_helpers.SLOW_HEARTBEAT_ENV


def session_finished(worker: WorkerProcess, stream_id: str) -> dict:
    return wait_until(
        lambda: next(
            (r for r in worker.logs("session finished") if r.get("connection_id") == stream_id),
            None,
        ),
        timeout=30,
        message=worker.tail,
    )


def assert_stopped_and_released(fleet: StoreDriver, stream_id: str) -> None:
    record = fleet.record(stream_id)
    assert record.desired_state is DesiredState.STOPPED
    assert record.lease_owner == ""
    check = check_stream(fleet.stored(stream_id), stream_id, record.last_seq)
    assert check.ok, check
    assert record.last_seq >= 5  # the final checkpoint rode along with the release


def test_stop_via_the_control_channel_closes_the_socket(fleet, sim, spawn):
    worker = spawn(**SLOW_HEARTBEAT)
    fleet.start("ctl", sim.url_for("ctl"))
    record = streaming(fleet, "ctl", worker)

    # A command for another epoch (an earlier owner's session) is ignored.
    fleet.send_stop(worker.worker_id, record.pk, record.lease_epoch + 7)
    ignored = wait_until(lambda: worker.logs("STOP command received"), timeout=30)
    assert ignored[0]["applied"] is False
    assert sim.sessions("ctl")[0].is_open

    fleet.store.stop(connection_pk("ctl"))
    fleet.send_stop(worker.worker_id, record.pk, record.lease_epoch)

    wait_until(lambda: not sim.sessions("ctl")[0].is_open, timeout=30, message=worker.tail)
    finished = session_finished(worker, "ctl")
    assert (finished["reason"], finished["via"]) == ("stopped", "control")
    assert_stopped_and_released(fleet, "ctl")
    assert len(sim.sessions("ctl")) == 1
    assert sim.sessions("ctl")[0].close_code == 1000


def test_stop_without_control_channel_is_found_by_the_sweep(fleet, sim, spawn):
    # GIVEN a worker without a control channel whose checkpoints are far apart
    worker = spawn(
        WORKER_CONTROL_CHANNEL="false", CHECKPOINT_SECONDS="600", WORKER_SWEEP_SECONDS="1"
    )
    fleet.start("sw", sim.url_for("sw"))
    streaming(fleet, "sw", worker)
    assert fleet.worker_item(worker.worker_id).control_queue_url == ""

    # WHEN the connection is stopped (and no STOP command is sent anywhere)
    fleet.store.stop(connection_pk("sw"))

    # THEN the sweep (gsi_owner shows STOPPED) ends the session and releases it
    wait_until(lambda: not sim.sessions("sw")[0].is_open, timeout=30, message=worker.tail)
    finished = session_finished(worker, "sw")
    assert (finished["reason"], finished["via"]) == ("stopped", "sweep")
    assert_stopped_and_released(fleet, "sw")
    assert len(sim.sessions("sw")) == 1
    assert worker.logs("STOP found by the sweep")


def test_stop_without_control_channel_is_noticed_by_the_checkpoint_write(fleet, sim, spawn):
    # GIVEN a worker without a control channel whose sweep is far away
    worker = spawn(
        WORKER_CONTROL_CHANNEL="false", CHECKPOINT_SECONDS="0.5", WORKER_SWEEP_SECONDS="600"
    )
    fleet.start("cp", sim.url_for("cp"))
    streaming(fleet, "cp", worker)

    # WHEN the connection is stopped
    fleet.store.stop(connection_pk("cp"))

    # THEN the next checkpoint write is refused (ConnectionStopped) and the session ends STOPPED
    wait_until(lambda: not sim.sessions("cp")[0].is_open, timeout=30, message=worker.tail)
    finished = session_finished(worker, "cp")
    assert (finished["reason"], finished["via"]) == ("stopped", "checkpoint")
    assert_stopped_and_released(fleet, "cp")


def test_graceful_exit_deletes_the_control_queue_and_retires_the_worker_item(fleet, spawn):
    worker = spawn()
    item = wait_until(lambda: fleet.worker_item(worker.worker_id), timeout=60, message=worker.tail)
    assert item.capacity == 100 and not item.dead  # MAX_CONNECTIONS' default
    assert worker.stop() == 0
    retired = fleet.worker_item(worker.worker_id)
    assert retired.dead and retired.expires_at_ms <= retired.dead_at_ms  # peers need not wait
    queues = fleet.sqs.list_queues().get("QueueUrls", [])
    assert item.control_queue_url not in queues
