"""Benchmark: every frame sink in one run, throughput per worker vCPU and cost per million frames
(issue #27, item 7).

For each sink (``dynamodb``; ``kinesis`` KPL-aggregated; ``kinesis`` plain, one frame per
record; ``firehose``) and each load, one :mod:`bench.throughput` run (its own upstream, moto
server, dynalite tables and one worker, in a child process): 100 connections x 20 frames/s and
10 connections x 1,000 frames/s of 200-byte frames, and 100 x 20 of 1 KB frames. Each run gives

* **frames per worker vCPU-second**: frames stored over the worker's CPU seconds in a steady
  window (the machine's load average is recorded beside it: on a shared machine the figure is
  CPU time, which other processes slow down too);
* **cost per million frames** from the units the backend was sent (:mod:`bench.sink_cost`):
  DynamoDB write request units of the items read back; Kinesis and Firehose records the
  service took, counted at a proxy in front of it (:mod:`bench.sink_requests`);
* **no loss**: every stream read back from the sink, seq 1..max, each with its own content
  (duplicates counted: the stream sinks are at-least-once).

Before the sinks, at each load, the **receive floor** (:mod:`bench.receive_floor`): a bare
websockets client on asyncio, in its own process, reading the same upstream at the same rate
and frame size and only counting frames (and a second pass that also runs the worker's
``parse_frame`` on each), its CPU measured the same way over the same window. Each sink's
frames per vCPU-second is shown as a percentage of it, and :func:`floor_verdict` says whether
the 30,000 target is reachable at all at each target load with websockets on asyncio.

Usage::

    python -m bench --only sinks           # the step, into bench/RESULTS.md
    python -m bench.sink_bench --window 10 # standalone: the table and the floor's verdict
    python -m bench.sink_bench --only-sink kinesis-aggregated --only-load 100x20-200B
    python -m bench.sink_bench --only-sink receive-floor   # the receive floor alone
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import ROOT

__all__ = ["LOADS", "SINKS", "TARGET_KINESIS_AGGREGATED", "floor_verdict", "run_sinks", "table"]

#: Issue #27: frames per worker vCPU-second with Kinesis aggregation.
TARGET_KINESIS_AGGREGATED = 30_000


@dataclass(frozen=True)
class SinkConfig:
    name: str
    sink: str
    worker_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class Load:
    name: str
    connections: int
    rate: float
    frame_bytes: int


SINKS = (
    SinkConfig("dynamodb", "dynamodb"),
    SinkConfig("kinesis-aggregated", "kinesis", ("MESSAGE_KINESIS_AGGREGATION=true",)),
    SinkConfig("kinesis-plain", "kinesis", ("MESSAGE_KINESIS_AGGREGATION=false",)),
    SinkConfig("firehose", "firehose"),
)
LOADS = (
    Load("100x20-200B", 100, 20.0, 200),
    Load("10x1000-200B", 10, 1000.0, 200),
    Load("100x20-1KB", 100, 20.0, 1024),
)
#: The loads issue #27's 30,000 target is set at.
TARGET_LOADS = ("100x20-200B", "10x1000-200B")
#: The receive floor's rows (bench/receive_floor.py's variants): counting only, and parsing.
FLOOR = "receive-floor"
FLOOR_PARSE = "receive-floor+parse"


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(
    config: SinkConfig, load: Load, *, run_dir: Path, window: float, warmup: float
) -> dict[str, Any]:
    """One bench/throughput.py run (child process; only its JSON output is relied on)."""
    out = run_dir / f"{config.name}-{load.name}"
    argv = [sys.executable, str(ROOT / "bench" / "throughput.py"), "--json-only",
            "--no-profile", "--no-py-spy", "--sink", config.sink,
            "--connections", str(load.connections), "--rate", str(load.rate),
            "--frame-bytes", str(load.frame_bytes), "--window", str(window),
            "--warmup", str(warmup), "--out", str(out)]  # fmt: skip
    if config.worker_env:
        argv += ["--worker-env", *config.worker_env]
    before = _load_average()
    started = time.monotonic()
    completed = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip
    row: dict[str, Any] = {"sink": config.name, "load": load.name,
                           "connections": load.connections, "rate": load.rate,
                           "frame_bytes": load.frame_bytes,
                           "load_average_before": before, "load_average_after": _load_average(),
                           "elapsed_seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    if completed.returncode != 0:
        row["error"] = f"throughput exited {completed.returncode}: {completed.stderr[-1500:]}"
        return row
    result = json.loads(completed.stdout)
    verify = result.get("verify") or {}
    cost = verify.get("cost") or {}
    row.update({
        "frames_per_cpu_second": result.get("frames_per_cpu_second"),
        "cpu_us_per_frame": result.get("cpu_us_per_frame"),
        "frames_stored_per_second": result.get("frames_stored_per_second"),
        "worker_cores_used": result.get("worker_cores_used"),
        "active_connections": result.get("active_connections"),
        "write_requests_per_frame": result.get("write_requests_per_frame"),
        "window_seconds": result.get("window_seconds"),
        "frames_checked": verify.get("frames_stored"),
        "duplicates": verify.get("duplicates"),
        "no_loss": verify.get("no_loss"),
        "problems": verify.get("problems"),
        "requests": verify.get("requests"),
        "cost": cost,
        "cost_of_records_in_stream": verify.get("cost_of_records_in_stream"),
        "run_dir": str(out),
    })  # fmt: skip
    if config.name == "kinesis-aggregated":
        per_cpu = row["frames_per_cpu_second"] or 0
        row["target"] = f">= {TARGET_KINESIS_AGGREGATED:,} frames/s per vCPU"
        row["target_met"] = bool(per_cpu >= TARGET_KINESIS_AGGREGATED and row["no_loss"])
    return row


def run_floor(load: Load, *, run_dir: Path, window: float, warmup: float) -> list[dict[str, Any]]:
    """The receive floor at ``load`` (bench/receive_floor.py, both variants against one
    upstream): one row per variant, in the keys of the sinks' rows."""
    from .receive_floor import run_floor as measure

    started = time.monotonic()
    base = {"load": load.name, "connections": load.connections, "rate": load.rate,
            "frame_bytes": load.frame_bytes}  # fmt: skip
    try:
        figures = measure(connections=load.connections, rate=load.rate,
                          frame_bytes=load.frame_bytes, warmup=warmup, window=window,
                          run_dir=run_dir / f"floor-{load.name}")  # fmt: skip
    except Exception as exc:  # the sinks are still measured
        return [{"sink": FLOOR, **base, "load_average_before": _load_average(),
                 "load_average_after": _load_average(),
                 "error": f"receive floor: {type(exc).__name__}: {exc}"}]  # fmt: skip
    rows = []
    for variant, r in figures.items():
        rows.append({
            "sink": variant, **base,
            "load_average_before": r["load_average_before"],
            "load_average_after": r["load_average_after"],
            "elapsed_seconds": round(time.monotonic() - started, 1),
            "frames_per_cpu_second": r.get("frames_per_cpu_second"),
            "cpu_us_per_frame": r.get("cpu_us_per_frame"),
            "frames_stored_per_second": r.get("frames_stored_per_second"),
            "worker_cores_used": r.get("worker_cores_used"),
            "active_connections": r.get("active_connections"),
            "window_seconds": r.get("window_seconds"),
            "frames_counted": r.get("frames_stored"),
            "upstream_cores_used": r.get("upstream_cores_used"),
            "floor": "bare websockets client on asyncio: frames counted"
                     + (", each through parse_frame" if variant == FLOOR_PARSE else ""),
            "run_dir": str(run_dir / f"floor-{load.name}"),
        })  # fmt: skip
    return rows


def _percent_of_floor(rows: list[dict[str, Any]]) -> None:
    """Each sink row's frames per vCPU-second as a percentage of its load's receive floor."""
    floors = {r["load"]: r.get("frames_per_cpu_second") for r in rows if r["sink"] == FLOOR}
    for row in rows:
        floor = floors.get(row["load"])
        if row.get("floor") or not floor or not row.get("frames_per_cpu_second"):
            continue
        row["percent_of_floor"] = round(100 * row["frames_per_cpu_second"] / floor, 1)


def run_sinks(
    run_dir: Path, *, window: float = 20.0, warmup: float = 5.0,
    sinks: tuple[SinkConfig, ...] = SINKS, loads: tuple[Load, ...] = LOADS, floor: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The receive floor at every load, then every sink at every load, one after the other
    (``python -m bench``'s step)."""
    from .sink_cost import PRICES, PRICES_CHECKED

    rows: list[dict[str, Any]] = []
    for load in loads if floor else ():
        print(f"[sinks] {FLOOR} {load.name} ...", file=sys.stderr, flush=True)
        measured = run_floor(load, run_dir=run_dir, window=window, warmup=warmup)
        rows += measured
        for row in measured:
            print(f"[sinks] {row['sink']} {load.name}: "
                  f"{row.get('error') or row.get('frames_per_cpu_second')} "
                  f"(load {row['load_average_after']})", file=sys.stderr, flush=True)  # fmt: skip
    for config in sinks:
        for load in loads:
            print(f"[sinks] {config.name} {load.name} ...", file=sys.stderr, flush=True)
            row = run_one(config, load, run_dir=run_dir, window=window, warmup=warmup)
            rows.append(row)
            print(f"[sinks] {config.name} {load.name}: "
                  f"{row.get('error') or row.get('frames_per_cpu_second')} "
                  f"(load {row['load_average_after']})", file=sys.stderr, flush=True)  # fmt: skip
    _percent_of_floor(rows)
    result = {
        "benchmark": "sinks",
        "settings": {"window_seconds": window, "warmup_seconds": warmup,
                     "dynamodb": "dynalite", "streams": "moto (embedded server)",
                     "receive_floor": "bench/receive_floor.py" if floor else "not run"},
        "prices": {**PRICES, "checked": PRICES_CHECKED, "region": "us-east-1"},
        "rows": rows,
    }  # fmt: skip
    print(table(result) + "\n\n" + floor_verdict(result), file=sys.stderr, flush=True)
    return result


def _cost_cell(row: dict[str, Any]) -> str:
    cost = row.get("cost") or {}
    value = cost.get("usd_per_million_frames")
    return "-" if value is None else f"${value:.4f}"


def _units_cell(cost: dict[str, Any]) -> str:
    """What the backend was sent, in its billing units."""
    if "write_request_units" in cost:
        return f"{cost['write_request_units']:,} WRU ({cost.get('items', 0):,} items)"
    if "put_payload_units" in cost:
        return f"{cost['put_payload_units']:,} PUT units ({cost.get('records', 0):,} records)"
    return f"{cost.get('billed_bytes', 0):,} B billed ({cost.get('records', 0):,} records)"


def table(result: dict[str, Any]) -> str:
    """Throughput and cost per sink and load, one row each (markdown)."""
    header = ["sink", "load (conns x frames/s, frame)", "frames/s per vCPU",
              "% of receive floor", "CPU us/frame",
              "frames/s", "load avg (1 min) before / after", "frames checked (dup)", "no loss",
              "units sent", "frames per record", "$ per million frames",
              "$ per conn-hour at 20/s", "Kinesis on-demand $ per million"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result.get("rows", []):
        if "error" in row:
            lines.append(f"| {row['sink']} | {row['load']} | error: "
                         f"{row['error'][:120]!r} |" + " |" * (len(header) - 3))  # fmt: skip
            continue
        if row.get("floor"):
            lines.append("| " + " | ".join(str(v) for v in [
                row["sink"], f"{row['connections']} x {row['rate']:g}, {row['frame_bytes']} B",
                f"{row['frames_per_cpu_second']:,.0f}" if row.get("frames_per_cpu_second")
                else "-", "(floor)" if row["sink"] == FLOOR else "-",
                row.get("cpu_us_per_frame"), row.get("frames_stored_per_second"),
                f"{row['load_average_before'][0]} / {row['load_average_after'][0]}",
                f"{row.get('frames_counted')} counted", "-", "-", "-", "-", "-", "",
            ]) + " |")  # fmt: skip
            continue
        cost = row.get("cost") or {}
        units = _units_cell(cost)
        on_demand = (cost.get("on_demand") or {}).get("usd_per_million_frames")
        lines.append("| " + " | ".join(str(v) for v in [
            row["sink"], f"{row['connections']} x {row['rate']:g}, {row['frame_bytes']} B",
            f"{row['frames_per_cpu_second']:,.0f}" if row.get("frames_per_cpu_second") else "-",
            f"{row['percent_of_floor']:g} %" if row.get("percent_of_floor") else "-",
            row.get("cpu_us_per_frame"), row.get("frames_stored_per_second"),
            f"{row['load_average_before'][0]} / {row['load_average_after'][0]}",
            f"{row.get('frames_checked')} ({row.get('duplicates')})",
            "**yes**" if row.get("no_loss") else "**NO**", units,
            cost.get("frames_per_record", 1 if "write_request_units" in cost else "-"),
            _cost_cell(row),
            f"${cost['usd_per_connection_hour_at_20_fps']:.6f}"
            if cost.get("usd_per_connection_hour_at_20_fps") is not None else "-",
            f"${on_demand:.4f}" if on_demand is not None else "",
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


def floor_verdict(result: dict[str, Any]) -> str:
    """At each target load, whether 30,000 frames per vCPU-second is reachable at all given what
    receiving alone costs (the receive floor), in plain words; "" without floor rows."""
    budget = 1e6 / TARGET_KINESIS_AGGREGATED
    rows = [r for r in result.get("rows", []) if "error" not in r]
    by_load: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_load.setdefault(row["load"], {})[row["sink"]] = row
    lines = []
    for load in TARGET_LOADS:
        found = by_load.get(load, {})
        floor, parsed = found.get(FLOOR), found.get(FLOOR_PARSE)
        if not floor or not floor.get("cpu_us_per_frame"):
            continue
        us, per_cpu = floor["cpu_us_per_frame"], floor["frames_per_cpu_second"]
        where = (f"{floor['connections']} x {floor['rate']:g} frames/s, "
                 f"{floor['frame_bytes']} B")  # fmt: skip
        if per_cpu < TARGET_KINESIS_AGGREGATED:
            verdict = (f"**{where}: {TARGET_KINESIS_AGGREGATED:,} frames per vCPU-second is not "
                       f"reachable with websockets on asyncio on this machine.** Receiving "
                       f"alone (a bare client that only counts frames) costs {us} us of CPU per "
                       f"frame ({per_cpu:,.0f} frames per vCPU-second), more than the "
                       f"{budget:.1f} us a frame may cost in all.")  # fmt: skip
        else:
            verdict = (f"**{where}: the floor leaves room for {TARGET_KINESIS_AGGREGATED:,} "
                       f"frames per vCPU-second.** Receiving alone (a bare client that only "
                       f"counts frames) costs {us} us of CPU per frame ({per_cpu:,.0f} frames "
                       f"per vCPU-second, {100 * us / budget:.0f} % of the {budget:.1f} us "
                       f"budget), leaving {budget - us:.1f} us per frame for parsing, storing "
                       f"and the sink.")  # fmt: skip
        if parsed and parsed.get("cpu_us_per_frame"):
            verdict += (f" With parse_frame on each frame: {parsed['cpu_us_per_frame']} us "
                        f"({parsed['frames_per_cpu_second']:,.0f}).")  # fmt: skip
        sinks = [f"{name} {r['frames_per_cpu_second']:,.0f} ({r['cpu_us_per_frame']} us, "
                 f"{r['percent_of_floor']:g} % of the floor)"
                 for name, r in found.items()
                 if not r.get("floor") and r.get("percent_of_floor")]  # fmt: skip
        if sinks:
            verdict += " The sinks at this load: " + "; ".join(sinks) + "."
        lines.append(verdict)
    return "\n\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--only-sink", nargs="*", default=[], help="sink names (default: all)")
    parser.add_argument("--only-load", nargs="*", default=[], help="load names (default: all)")
    parser.add_argument("--no-floor", action="store_true", help="skip the receive floor")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    sinks = tuple(s for s in SINKS if not args.only_sink or s.name in args.only_sink)
    loads = tuple(load for load in LOADS if not args.only_load or load.name in args.only_load)
    run_dir = Path(tempfile.mkdtemp(prefix="wsfleet-sinks-"))
    result = run_sinks(run_dir, window=args.window, warmup=args.warmup, sinks=sinks, loads=loads,
                       floor=not args.no_floor)  # fmt: skip
    print(json.dumps(result, indent=2) if args.json_only
          else table(result) + "\n\n" + floor_verdict(result))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
