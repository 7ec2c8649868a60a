"""Rebalancing end to end on a local fleet (moto server): a worker joins and the spread evens
out, every move a graceful hand-off, nothing lost, nothing moved twice.

Two workers stream 12 connections; a third joins. The reconciler's fleet view plans the
moves, the loaded workers hand connections off (release with the final checkpoint, a hint to
the newcomer's control queue), the newcomer takes them. Short intervals; every wait is for a
condition with a generous deadline, nothing is timed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fleet_helpers import wait_until

from bench.fleet_bench import audit_streams
from wsfleet.rebalance import WorkerLoad, in_band
from wsfleet.record import ConnectionRecord
from wsfleet_local.backend import local_client
from wsfleet_local.client import ApiClient, scan_table
from wsfleet_local.fleet import FleetTimings, LocalFleet

pytestmark = pytest.mark.integration

CONNECTIONS = 12
BAND_PERCENT = 10.0


def _records(dynamodb: Any, fleet: LocalFleet) -> dict[str, ConnectionRecord]:
    connections, _ = scan_table(dynamodb, fleet.resources.connections_table)
    records = [ConnectionRecord.from_item(item) for item in connections]
    return {r.connection_id: r for r in records}


def _loads(records: dict[str, ConnectionRecord], workers: list[str]) -> list[WorkerLoad]:
    held = Counter(r.lease_owner for r in records.values())
    return [WorkerLoad(w, held.get(w, 0), 100) for w in workers]


def test_a_joining_worker_evens_the_spread_out_with_nothing_lost_or_moved_twice(tmp_path):
    timings = FleetTimings(lease_seconds=4.0, heartbeat_seconds=1.0, rebalance_seconds=1.0)
    with LocalFleet(workers=2, timings=timings, run_dir=tmp_path, rate=20) as fleet:
        dynamodb = local_client("dynamodb", fleet.dynamodb_endpoint_url)
        api = ApiClient(fleet.api_url)
        ids = [f"rb{i:02d}" for i in range(CONNECTIONS)]
        for stream_id in ids:
            api.start(stream_id, fleet.simulator.url_for(stream_id))
        # GIVEN every connection streamed by one of the first two workers
        first_two = list(fleet.worker_ids)
        before = wait_until(
            lambda: (r := _records(dynamodb, fleet))
            and all(r[i].lease_owner in first_two for i in ids if i in r)
            and len(r) == CONNECTIONS
            and r,
            timeout=120,
            message="the two workers to own every connection",
        )
        # WHEN a third worker joins
        fleet.add_worker()
        everyone = list(fleet.worker_ids)
        # THEN the spread evens out: every worker within its band of the 4 it should hold
        after = wait_until(
            lambda: (r := _records(dynamodb, fleet))
            and all(x.lease_owner in everyone for x in r.values())
            and in_band(_loads(r, everyone), BAND_PERCENT)
            and r,
            timeout=180,
            message="the spread to even out over three workers",
        )
        # AND the newcomer got its connections only by moves from the two others, each
        # connection moved at most once (one acquire more: epoch + 1)
        newcomer = everyone[-1]
        taken = [i for i in ids if after[i].lease_owner == newcomer]
        assert taken
        for stream_id in ids:
            moves = after[stream_id].lease_epoch - before[stream_id].lease_epoch
            assert moves <= 1, stream_id
            if moves:
                assert after[stream_id].rebalanced_at_ms is not None
        # AND no frame was lost or stored twice, and no two sessions of a stream overlapped
        for result in audit_streams(fleet, ids, after).values():
            assert (result.lost, result.duplicated) == (0, 0), result
