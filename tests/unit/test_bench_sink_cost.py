"""bench.sink_cost: the cost of stored frames from what the sink holds, at list prices."""

from __future__ import annotations

import pytest

from bench.sink_cost import kinesis_cost


def test_a_kinesis_record_costs_one_put_unit_per_25_kb_or_part_of_it():
    # GIVEN 4 records: 128 frames in 25,000 bytes (1 unit), 25,001 bytes (2), 1 MiB (42), 10 B (1)
    cost = kinesis_cost([25_000, 25_001, 1_048_576, 10], frames=1_000)
    assert cost["put_payload_units"] == 1 + 2 + 42 + 1
    # THEN per million frames: 46 units per 1,000 frames at $0.014 per million units
    assert cost["usd_per_million_frames_put_units"] == pytest.approx(46 * 0.014 / 1e6 * 1e3)
    shard_hours = (25_000 + 25_001 + 1_048_576 + 10) / (1024 * 1024 * 3600)
    assert cost["usd_per_million_frames_shard_hours"] == pytest.approx(
        shard_hours * 0.015 * 1e3, rel=1e-3
    )

