"""What the frames of a throughput run cost in their sink, from what the sink holds.

Read back after the run, not estimated: every Kinesis record of the stream (its size decides
its PUT payload units, 25 KB each, rounded up per record). Prices are list prices (us-east-1,
the figures issue #27 quotes, not re-checked against the live price list): Kinesis provisioned
$0.014 per million PUT payload units plus $0.015 per shard-hour, at full use of a shard's
1 MB/s. (DynamoDB for comparison: one write unit per frame of up to 1 KB, $0.625 per million.)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

KINESIS_PER_MILLION_PUT_UNITS = 0.014
KINESIS_SHARD_HOUR = 0.015
KINESIS_SHARD_BYTES_PER_HOUR = 1024 * 1024 * 3600

__all__ = ["kinesis_cost", "read_kinesis"]


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


def kinesis_cost(record_sizes: list[int], frames: int) -> dict[str, Any]:
    """Per million frames: PUT payload units and shard-hours at full shard use."""
    units = sum(math.ceil(size / 25_000) for size in record_sizes)
    put = units * KINESIS_PER_MILLION_PUT_UNITS / 1e6
    shard = sum(record_sizes) / KINESIS_SHARD_BYTES_PER_HOUR * KINESIS_SHARD_HOUR
    per_million = 1e6 / frames if frames else 0.0
    return {
        "records": len(record_sizes),
        "frames_per_record": round(frames / len(record_sizes), 1) if record_sizes else 0,
        "put_payload_units": units,
        "usd_per_million_frames": round((put + shard) * per_million, 6),
        "usd_per_million_frames_put_units": round(put * per_million, 6),
        "usd_per_million_frames_shard_hours": round(shard * per_million, 6),
    }

