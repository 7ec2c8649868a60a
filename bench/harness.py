"""Shared pieces of the benchmarks: the machine, percentiles, a fleet with a request meter.

Every fleet benchmark runs on :class:`bench.faults.FaultyFleet`: the real local
system (moto, simulator, router/reconciler/notifier Lambdas, Streams poller, worker
processes) with the workers' AWS traffic going through the fault proxy, which here injects
nothing and only counts requests.

Times are wall clock: the simulator stamps its session log with ``time.time()`` in its own
process, and a disruption is stamped the same way here, on the same machine.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "Percentiles",
    "aws_client",
    "machine",
    "percentiles",
]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Percentiles:
    """Nearest-rank percentiles of a sample (seconds unless said otherwise)."""

    n: int
    p50: float
    p95: float
    p99: float
    max: float
    min: float

    def to_dict(self, digits: int = 3) -> dict[str, float | int]:
        return {
            "n": self.n,
            "p50": round(self.p50, digits),
            "p95": round(self.p95, digits),
            "p99": round(self.p99, digits),
            "max": round(self.max, digits),
            "min": round(self.min, digits),
        }


def percentiles(values: Iterable[float]) -> Percentiles | None:
    """Nearest-rank p50/p95/p99 (with 10 samples p95 and p99 are the maximum: say so).

    >>> percentiles([1, 2, 3, 4]).p50
    2
    """
    data = sorted(values)
    if not data:
        return None

    def rank(q: float) -> float:
        return data[max(0, math.ceil(q * len(data)) - 1)]

    return Percentiles(len(data), rank(0.50), rank(0.95), rank(0.99), data[-1], data[0])


def _meminfo_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=False, timeout=5,
        )  # fmt: skip
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    """What the figures were measured on (printed beside them)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cores": os.cpu_count(),
        "memory_mb": _meminfo_mb(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_average_at_start": [round(x, 2) for x in load],
        "commit": _git_commit(),
    }


def aws_client(service: str, endpoint_url: str, region: str = "us-east-1") -> Any:
    """A boto3 client straight to the backend (not through the proxy: not counted)."""
    from wsfleet_local.backend import local_client

    return local_client(service, endpoint_url, region)


def by_stream(sessions: Sequence[Any]) -> dict[str, list[Any]]:
    """Simulator session records grouped by stream, oldest first."""
    grouped: dict[str, list[Any]] = {}
    for record in sorted(sessions, key=lambda r: (r.opened_at, r.session_id)):
        grouped.setdefault(record.stream_id, []).append(record)
    return grouped


def records_by_id(fleet: Any) -> dict[str, Any]:
    """Every connection record of the fleet's table (consistent scan), by connection id."""
    from wsfleet.record import ConnectionRecord
    from wsfleet_local.client import scan_table

    client = aws_client("dynamodb", fleet.dynamodb_endpoint_url)
    connections, _workers = scan_table(client, fleet.resources.connections_table)
    records = [ConnectionRecord.from_item(item) for item in connections]
    return {record.connection_id: record for record in records}


def env_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """Settings dict for the report (drops Nones)."""
    return {key: value for key, value in options.items() if value is not None}
