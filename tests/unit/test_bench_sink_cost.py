"""bench.sink_cost: the cost of stored frames from what the sink holds, at list prices."""

from __future__ import annotations

import pytest

from bench.sink_cost import dynamodb_cost, firehose_cost, kinesis_cost


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



def test_plain_kinesis_records_fill_shards_by_count_before_bytes():
    # GIVEN a million 300-byte records: 1,000 records/s per shard binds, not 1 MB/s
    cost = kinesis_cost({300: 1_000_000}, frames=1_000_000)
    shard_usd = 1000 / 3600 * 0.015
    assert cost["usd_per_million_frames_shard_hours"] == pytest.approx(shard_usd, rel=1e-3)
    # and on-demand bills each record as 1 KB of data in at $0.08 per GB
    assert cost["on_demand"]["usd_per_million_frames"] == pytest.approx(1e6 * 1024 / 2**30 * 0.08)


def test_firehose_rounds_each_record_up_to_5_kb():
    cost = firehose_cost([1, 5120, 5121, 1_024_000], frames=4)
    assert cost["billed_bytes"] == 5120 + 5120 + 10240 + 1_024_000
    assert cost["usd_per_million_frames"] == pytest.approx(
        cost["billed_bytes"] / 2**30 * 0.029 * 1e6 / 4, rel=1e-5
    )


def test_dynamodb_bills_a_write_unit_per_kb_of_each_item():
    cost = dynamodb_cost({300: 10, 1024: 1, 1025: 1}, frames=12)
    assert cost["write_request_units"] == 10 + 1 + 2
    assert cost["usd_per_connection_hour_at_20_fps"] == pytest.approx(
        13 / 12 * 0.625 / 1e6 * 72_000, rel=1e-5
    )


def test_the_request_counter_counts_what_the_service_took_and_the_frames_in_it():
    # GIVEN a PutRecords of an aggregated record (3 frames) and a plain one the service refused
    import base64
    import json

    from bench.sink_requests import count_request
    from wsfleet.sinks.kinesis import aggregate

    packed = aggregate("conn-a", [b'{"seq":1}', b'{"seq":2}', b'{"seq":3}'])
    body = json.dumps({"StreamName": "s", "Records": [
        {"Data": base64.b64encode(packed).decode(), "PartitionKey": "conn-a"},
        {"Data": base64.b64encode(b'{"seq":1}').decode(), "PartitionKey": "conn-b"},
    ]}).encode()  # fmt: skip
    answer = json.dumps({"FailedRecordCount": 1, "Records": [
        {"SequenceNumber": "1", "ShardId": "shardId-0"},
        {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow"},
    ]}).encode()  # fmt: skip
    taken, refused = count_request("kinesis", body, 200, answer)
    # THEN one record billed at its data plus partition key, carrying 3 frames; one refused
    assert taken == [(len(packed) + len("conn-a"), 3)] and refused == 1
    # and a request refused as a whole (throttled) took nothing
    assert count_request("kinesis", body, 400, b"{}") == ([], 0)


def test_the_sinks_step_is_registered_and_its_rows_reach_results_md(monkeypatch):
    # GIVEN the step's result as bench/sink_bench.py writes it: two rows, one below target
    from bench import __main__ as bench_main
    from bench.report import render

    monkeypatch.setattr("bench.dynalite.available", lambda: True)
    assert "sinks" in bench_main.GROUPS
    assert [s.name for s in bench_main._steps(quick=True) if s.group == "sinks"] == ["sinks"]

    def row(load: str, per_cpu: float, met: bool) -> dict:
        return {"sink": "kinesis-aggregated", "load": load, "connections": 10, "rate": 1000.0,
                "frame_bytes": 200, "load_average_before": [1.0, 1, 1],
                "load_average_after": [2.5, 1, 1], "frames_per_cpu_second": per_cpu,
                "cpu_us_per_frame": 1e6 / per_cpu, "frames_stored_per_second": 9000.0,
                "frames_checked": 1000, "duplicates": 0, "no_loss": True,
                "cost": kinesis_cost({25_000: 8}, frames=1000),
                "target": ">= 30,000 frames/s per vCPU", "target_met": met}  # fmt: skip

    document = {"results": {"sinks": {"group": "sinks", "prices": {"region": "us-east-1"},
                                      "rows": [row("10x1000-200B", 31_000.0, True),
                                               row("100x20-200B", 9_000.0, False)]}}}
    text = render(document)
    # THEN the section has both rows, with the units sent and the load beside each figure
    section = text.split("## 6f. Frame sinks", 1)[1].split("\n## ", 1)[0]
    assert "| kinesis-aggregated | 10 x 1000, 200 B | 31,000 |" in section
    assert "8 PUT units (8 records)" in section and "1.0 / 2.5" in section
    # and the target table says which load met the 30,000 target and which did not
    targets = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert "sinks 10x1000-200B | 31,000 frames/s per vCPU at load 2.5" in targets
    assert targets.count("Kinesis aggregated >= 30,000") == 2 and "**NO**" in targets


def _floor_row(sink: str, load: str, per_cpu: float) -> dict:
    return {"sink": sink, "load": load, "connections": 100, "rate": 20.0, "frame_bytes": 200,
            "load_average_before": [0.5, 1, 1], "load_average_after": [0.6, 1, 1],
            "frames_per_cpu_second": per_cpu, "cpu_us_per_frame": round(1e6 / per_cpu, 1),
            "frames_stored_per_second": 2000.0, "frames_counted": 40_000,
            "floor": "bare websockets client on asyncio: frames counted"}  # fmt: skip


def test_the_sinks_step_measures_the_receive_floor_at_every_load_first(monkeypatch, tmp_path):
    # GIVEN the floor and the sinks' runs replaced by figures (the real ones are processes)
    from bench import receive_floor, sink_bench

    calls: list[str] = []

    def floor(*, connections, rate, frame_bytes, warmup, window, run_dir):
        calls.append(f"floor {connections}x{rate:g}-{frame_bytes}")
        figures = {"frames_per_cpu_second": 20_000.0, "cpu_us_per_frame": 50.0,
                   "frames_stored_per_second": connections * rate, "frames_stored": 4000,
                   "load_average_before": [1.0], "load_average_after": [1.0]}  # fmt: skip
        return {sink_bench.FLOOR: figures,
                sink_bench.FLOOR_PARSE: {**figures, "frames_per_cpu_second": 16_000.0}}

    def one(config, load, **_):
        calls.append(f"{config.name} {load.name}")
        return {"sink": config.name, "load": load.name, "connections": load.connections,
                "rate": load.rate, "frame_bytes": load.frame_bytes,
                "frames_per_cpu_second": 5_000.0, "cpu_us_per_frame": 200.0,
                "load_average_before": [1.0], "load_average_after": [1.0]}  # fmt: skip

    monkeypatch.setattr(receive_floor, "run_floor", floor)
    monkeypatch.setattr(sink_bench, "run_one", one)
    result = sink_bench.run_sinks(tmp_path, window=1, warmup=0, sinks=sink_bench.SINKS[1:2])
    # THEN the floor ran at each load before any sink, two rows per load
    assert calls == ["floor 100x20-200", "floor 10x1000-200", "floor 100x20-1024",
                     "kinesis-aggregated 100x20-200B", "kinesis-aggregated 10x1000-200B",
                     "kinesis-aggregated 100x20-1KB"]  # fmt: skip
    floors = [r for r in result["rows"] if r.get("floor")]
    assert [(r["sink"], r["load"]) for r in floors][:2] == [
        ("receive-floor", "100x20-200B"), ("receive-floor+parse", "100x20-200B")]
    assert len(floors) == 6
    # AND each sink row is a percentage of its own load's floor (counting only)
    sinks = [r for r in result["rows"] if not r.get("floor")]
    assert {r["percent_of_floor"] for r in sinks} == {25.0}
    assert all("percent_of_floor" not in r for r in floors)


def test_floor_rows_reach_results_md_with_a_plain_verdict_on_the_target():
    # GIVEN a floor below 30,000 at 100 x 20 and above it at 10 x 1,000, and the sinks beside
    from bench.report import render

    rows = [
        _floor_row("receive-floor", "100x20-200B", 20_000.0),
        _floor_row("receive-floor+parse", "100x20-200B", 16_000.0),
        {**_floor_row("receive-floor", "10x1000-200B", 60_000.0), "connections": 10,
         "rate": 1000.0},
        {"sink": "kinesis-aggregated", "load": "100x20-200B", "connections": 100, "rate": 20.0,
         "frame_bytes": 200, "load_average_before": [0.5, 1, 1],
         "load_average_after": [0.6, 1, 1], "frames_per_cpu_second": 5_000.0,
         "cpu_us_per_frame": 200.0, "percent_of_floor": 25.0, "no_loss": True,
         "cost": kinesis_cost({25_000: 8}, frames=1000),
         "target": ">= 30,000 frames/s per vCPU", "target_met": False},
    ]  # fmt: skip
    text = render({"results": {"sinks": {"group": "sinks", "prices": {}, "rows": rows}}})
    section = text.split("## 6f. Frame sinks", 1)[1].split("\n## ", 1)[0]
    # THEN the floor's rows are in the table and the sink's figure is a percentage of it
    assert "| receive-floor | 100 x 20, 200 B | 20,000 | (floor) | 50.0 |" in section
    assert "| receive-floor+parse | 100 x 20, 200 B | 16,000 | - | 62.5 |" in section
    assert "| kinesis-aggregated | 100 x 20, 200 B | 5,000 | 25 % | 200.0 |" in section
    # AND the section says plainly where 30,000 is out of reach and where it is not
    assert ("**100 x 20 frames/s, 200 B: 30,000 frames per vCPU-second is not reachable with "
            "websockets on asyncio on this machine.**") in section
    assert "kinesis-aggregated 5,000 (200.0 us, 25 % of the floor)" in section
    assert "**10 x 1000 frames/s, 200 B: the floor leaves room for 30,000" in section
    # AND the target table carries the floor's answer per target load
    targets = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert targets.count("receive floor (websockets on asyncio") == 2
    assert "sinks 100x20-200B | 20,000 frames/s per vCPU (50.0 us per frame)" in targets
