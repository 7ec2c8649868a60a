"""What a sink's frames cost, from the request units the backend was actually sent.

The units come from the run, never from an estimate: DynamoDB items read back from the table
(each frame one item, ceil(item size / 1 KB) write request units; the run checks every frame
is stored exactly once), and for the stream sinks every record the service took, counted at the
counting proxy in front of it (:mod:`bench.sink_requests`; for Kinesis the records read back
from the stream give the same figure, :func:`read_kinesis`).

Prices: the us-east-1 list prices below (:data:`PRICES`), the billing rules as the public
price pages state them (checked on :data:`PRICES_CHECKED`): Kinesis provisioned bills PUT
payload units of 25 KB per record and shard-hours (a shard takes 1 MB/s or 1,000 records/s);
Kinesis on-demand bills data in per GB with every record rounded up to 1 KB, plus an hourly
charge per stream; Firehose (Direct PUT) bills ingestion per GB with every record rounded up to
5 KB; DynamoDB on-demand bills one write request unit per KB of item, rounded up. Fixed
charges that do not grow with frames (the on-demand stream-hour, a provisioned shard below its
capacity, S3 storage and requests behind Firehose) are left out of the per-frame figures.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

#: When the billing rules were checked against the public price pages.
PRICES_CHECKED = "2026-12-02"
#: us-east-1 list prices (USD).
PRICES: dict[str, float] = {
    "dynamodb_per_million_write_request_units": 0.625,  # on-demand, standard table class
    "dynamodb_per_million_read_request_units": 0.125,
    "kinesis_per_million_put_payload_units": 0.014,  # provisioned, 25 KB units per record
    "kinesis_per_shard_hour": 0.015,
    "kinesis_on_demand_per_gb_in": 0.08,  # records rounded up to 1 KB
    "kinesis_on_demand_per_stream_hour": 0.04,
    "firehose_direct_put_per_gb": 0.029,  # first 500 TB a month; records rounded up to 5 KB
}
KINESIS_PER_MILLION_PUT_UNITS = PRICES["kinesis_per_million_put_payload_units"]
KINESIS_SHARD_HOUR = PRICES["kinesis_per_shard_hour"]
KINESIS_SHARD_BYTES_PER_HOUR = 1024 * 1024 * 3600
KINESIS_SHARD_RECORDS_PER_HOUR = 1000 * 3600
PUT_PAYLOAD_UNIT_BYTES = 25_000
GB = 1024**3
#: Frames of one connection-hour at the issue's reference rate, 20 frames/s.
FRAMES_PER_CONNECTION_HOUR = 20 * 3600

__all__ = [
    "FRAMES_PER_CONNECTION_HOUR",
    "PRICES",
    "PRICES_CHECKED",
    "dynamodb_cost",
    "firehose_cost",
    "kinesis_cost",
    "read_kinesis",
]


def read_kinesis(client: Any, stream: str) -> tuple[dict[str, list[dict[str, Any]]], list[int]]:
    """Every frame of the stream by connection (deaggregated), and every record's size."""
    from wsfleet.sinks.kinesis import deaggregate

    frames: dict[str, list[dict[str, Any]]] = defaultdict(list)
    sizes: list[int] = []
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = client.get_records(ShardIterator=iterator, Limit=10_000)
            for record in page["Records"]:
                sizes.append(len(record["Data"]) + len(record["PartitionKey"]))
                for _key, data in deaggregate(record["Data"], record["PartitionKey"]):
                    frame = json.loads(data)
                    frames[frame["connection_id"]].append(frame)
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return frames, sizes


def _histogram(sizes: Iterable[int] | Mapping[int, int]) -> dict[int, int]:
    """Record sizes as size -> count (a list of sizes, or a histogram with str or int keys)."""
    if isinstance(sizes, Mapping):
        return {int(size): int(count) for size, count in sizes.items()}
    out: dict[int, int] = defaultdict(int)
    for size in sizes:
        out[size] += 1
    return dict(out)


def _per_frame(usd: float, frames: int) -> dict[str, float]:
    per_million = usd * 1e6 / frames if frames else 0.0
    return {
        "usd_per_million_frames": round(per_million, 6),
        "usd_per_connection_hour_at_20_fps": round(
            per_million * FRAMES_PER_CONNECTION_HOUR / 1e6, 8
        ),
    }


def dynamodb_cost(item_sizes: Iterable[int] | Mapping[int, int], frames: int) -> dict[str, Any]:
    """Per million frames: write request units, ceil(item size / 1 KB) per item written.

    >>> dynamodb_cost([200, 1024, 1025], 3)["write_request_units"]
    4
    """
    histogram = _histogram(item_sizes)
    units = sum(max(1, math.ceil(size / 1024)) * n for size, n in histogram.items())
    usd = units * PRICES["dynamodb_per_million_write_request_units"] / 1e6
    return {
        "items": sum(histogram.values()),
        "write_request_units": units,
        "units_per_frame": round(units / frames, 4) if frames else None,
        **_per_frame(usd, frames),
    }


def kinesis_cost(record_sizes: Iterable[int] | Mapping[int, int], frames: int) -> dict[str, Any]:
    """Per million frames, provisioned (PUT payload units and the shard-hours the records
    fill at full shard use: 1 MB/s or 1,000 records/s, whichever binds) and on-demand (data in,
    each record rounded up to 1 KB)."""
    histogram = _histogram(record_sizes)
    records = sum(histogram.values())
    units = sum(math.ceil(size / PUT_PAYLOAD_UNIT_BYTES) * n for size, n in histogram.items())
    total_bytes = sum(size * n for size, n in histogram.items())
    put = units * KINESIS_PER_MILLION_PUT_UNITS / 1e6
    shard_hours = max(total_bytes / KINESIS_SHARD_BYTES_PER_HOUR,
                      records / KINESIS_SHARD_RECORDS_PER_HOUR)  # fmt: skip
    shard = shard_hours * KINESIS_SHARD_HOUR
    billed_kb = sum(math.ceil(size / 1024) * n for size, n in histogram.items())
    on_demand = billed_kb * 1024 / GB * PRICES["kinesis_on_demand_per_gb_in"]
    per_million = 1e6 / frames if frames else 0.0
    return {
        "records": records,
        "frames_per_record": round(frames / records, 1) if records else 0,
        "bytes": total_bytes,
        "put_payload_units": units,
        **_per_frame(put + shard, frames),
        "usd_per_million_frames_put_units": round(put * per_million, 6),
        "usd_per_million_frames_shard_hours": round(shard * per_million, 6),
        "on_demand": {"billed_bytes": billed_kb * 1024, **_per_frame(on_demand, frames)},
    }


def firehose_cost(record_sizes: Iterable[int] | Mapping[int, int], frames: int) -> dict[str, Any]:
    """Per million frames: Direct PUT ingestion, each record rounded up to 5 KB.

    >>> firehose_cost([100, 5120, 5121], 3)["billed_bytes"]
    20480
    """
    histogram = _histogram(record_sizes)
    records = sum(histogram.values())
    billed = sum(math.ceil(size / 5120) * 5120 * n for size, n in histogram.items())
    usd = billed / GB * PRICES["firehose_direct_put_per_gb"]
    return {
        "records": records,
        "frames_per_record": round(frames / records, 1) if records else 0,
        "bytes": sum(size * n for size, n in histogram.items()),
        "billed_bytes": billed,
        **_per_frame(usd, frames),
    }
