"""The local fleet publishes a worker process's exit as its ECS task state change event, and
the task exit function fails that worker over without waiting for its lease.

The lease is long (20 s) and nothing here waits for it: the proof that the event did the work
is in the items (the crashed worker is dead before its lease expired, killed by the task exit
write, and a peer holds its connection), not in a timing.
"""

from __future__ import annotations

import signal

import pytest
from fleet_helpers import wait_until

from wsfleet.aws import dynamodb_client
from wsfleet.record import connection_pk
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.client import ApiClient
from wsfleet_local.fleet import FleetTimings, LocalFleet

pytestmark = pytest.mark.integration


def test_a_crashed_worker_fails_over_from_its_exit_event(tmp_path, monkeypatch):
    timings = FleetTimings(lease_seconds=20.0, heartbeat_seconds=5.0, queue_wait_seconds=2,
                           reconcile_pass_seconds=10.0)  # fmt: skip
    with LocalFleet(workers=1, timings=timings, run_dir=tmp_path) as fleet:
        # GIVEN w0 streaming a connection, then a peer
        monkeypatch.setenv("AWS_ENDPOINT_URL", fleet.endpoint_url)
        store = DynamoDBLeaseStore(dynamodb_client(), fleet.resources.connections_table)
        api = ApiClient(fleet.api_url)
        api.start("x1", fleet.simulator.url_for("x1"))
        pk = connection_pk("x1")
        wait_until(lambda: (r := store.get(pk)) is not None and r.lease_owner == "w0",
                   message="w0 to take x1", timeout=60)  # fmt: skip
        w0 = store.get_worker("w0", consistent=True)
        assert w0 is not None and w0.task_arn and w0.container_runtime_id  # from the endpoint
        peer = fleet.add_worker()

        # WHEN w0 is SIGKILLed (its container stops: exit 137)
        fleet.kill_worker(0, signal.SIGKILL)

        # THEN the peer holds the connection, and w0 was killed by the exit event: dead
        # before its last renewal's lease ran out, with the hint claim the task exit write sets
        wait_until(lambda: store.get(pk).lease_owner == peer.worker_id,
                   message="the peer to take x1 over", timeout=60)  # fmt: skip
        dead = store.get_worker("w0", consistent=True)
        assert dead is not None and dead.dead_at_ms is not None
        assert dead.dead_at_ms < dead.heartbeat_at_ms + fleet.timings.lease_seconds * 1000
        assert dead.hinted_at_ms == dead.dead_at_ms == dead.expires_at_ms
        assert fleet.task_watcher is not None and fleet.task_watcher.published >= 1
