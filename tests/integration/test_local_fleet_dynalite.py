"""LocalFleet with its tables on dynalite (``tables=Dynalite()``), SQS still on moto.

The benchmarks use this mode to separate wsfleet's own cost from the serialised moto
server's. These tests check that the whole path really runs on dynalite: START through the
API lands in dynalite's table (not moto's), a worker streams and checkpoints there, a SIGTERM
hands the stream to a peer, and stopping the fleet leaves no dynalite process behind.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import boto3
import pytest
from fleet_helpers import wait_until

from bench import dynalite
from bench.dynalite_plugin import require_dynalite
from wsfleet.record import ConnectionRecord, connection_pk
from wsfleet_local.client import ApiClient, scan_table
from wsfleet_local.fleet import FleetTimings, LocalFleet
from wsfleet_local.procs import pid_alive

pytestmark = pytest.mark.integration


def client(endpoint_url: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client("dynamodb", endpoint_url=endpoint_url)


def record(dynamodb: Any, table: str, stream_id: str) -> ConnectionRecord | None:
    connections, _workers = scan_table(dynamodb, table)
    found = [item for item in connections if item["pk"] == connection_pk(stream_id)]
    return ConnectionRecord.from_item(found[0]) if found else None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_an_unknown_dynamodb_backend_is_refused():
    with pytest.raises(ValueError, match="dynamodb must be one of"):
        dynalite.tables_service("cassandra")


def test_streams_and_hand_off_run_on_dynalite(tmp_path):
    require_dynalite()  # skips without it; fails instead under WSFLEET_REQUIRE_DYNALITE=1 (CI)
    timings = FleetTimings(lease_seconds=4.0, heartbeat_seconds=1.0)
    # Checkpoints every second: the test waits for them (the default is every 10 minutes).
    with LocalFleet(
        workers=1, timings=timings, run_dir=tmp_path, tables=dynalite.Dynalite(),
        extra_worker_env={"CHECKPOINT_SECONDS": "1"},
    ) as fleet:
        assert fleet.dynamodb_endpoint_url != fleet.endpoint_url
        table = fleet.resources.connections_table
        on_dynalite, on_moto = client(fleet.dynamodb_endpoint_url), client(fleet.endpoint_url)
        ApiClient(fleet.api_url).start("d1", fleet.simulator.url_for("d1"))

        first = wait_until(
            lambda: (r := record(on_dynalite, table, "d1")) and r.last_seq > 0 and r,
            timeout=60,
            message="the first worker to checkpoint on dynalite",
        )
        assert first.lease_owner == fleet.worker_ids[0]
        assert record(on_moto, table, "d1") is None  # moto's table is not used

        fleet.add_worker()
        fleet.kill_worker(0, signal.SIGTERM)
        second = wait_until(
            lambda: (r := record(on_dynalite, table, "d1"))
            and r.lease_owner == fleet.worker_ids[1]
            and r.last_seq > first.last_seq
            and r,
            timeout=60,
            message="the peer to take the stream over and checkpoint",
        )
        assert second.lease_epoch == first.lease_epoch + 1
        (dynalite_pid,) = [pid for pid in fleet.child_pids() if "dynalite" in cmdline(pid)]
    wait_until(lambda: not pid_alive(dynalite_pid), timeout=15, message="dynalite to exit")
