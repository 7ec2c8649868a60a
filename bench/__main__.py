"""``python -m bench`` (``make bench``): every wsfleet benchmark, one command.

Writes ``bench/results.json`` (after every step, so an interrupted run keeps what it measured)
and ``bench/RESULTS.md`` (the tables, the command, the machine and the settings).

Options::

    python -m bench                     # full run (about 45-50 min on 2 cores)
    python -m bench --quick             # smaller K, shorter windows (about 8-10 min)
    python -m bench --only crash stop   # some groups only (results of others are kept)
    python -m bench --render            # re-render RESULTS.md from results.json

Groups: cost, crash, handoff, stop, capacity, flood, throughput, reconcile, compat, scale,
shapes, rebalance (300 connections on 3 workers scaled to 6: time to even, moves, hand-off gaps),
tradeoffs (the operator's tuning table and plot, docs/tradeoffs.md and .png; bench/tradeoffs.py),
handoff-modes (issue #26: make-before-break beside break-before-make in one run, live-only,
one-session and replaying upstreams through SIGTERM drains and a 3 -> 6 rebalance;
bench/handoff_modes.py), sinks (issue #27: every frame sink's frames per worker vCPU-second and
cost per million frames, bench/sink_bench.py, beside the receive floor of a bare websockets
client at the same loads, bench/receive_floor.py).
Loss/duplicate figures come with crash and handoff (each run STOPs its streams and audits the
messages table afterwards). ``cost`` includes ``coordination-cost-1000`` (issue #12's target:
coordination writes and reads per connection-hour at 1,000 connections per worker, every
cadence time-compressed by 2.5). ``scale`` records this checkout's request stream per partition
key and writes ``bench/SCALE.md`` beside the recorded v1 baseline (bench/scale_record.py,
bench/scale_model.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .harness import ROOT, machine

RESULTS_JSON = ROOT / "bench" / "results.json"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
GROUPS = ("cost", "crash", "handoff", "stop", "capacity", "flood", "throughput", "reconcile",
          "compat", "scale", "shapes", "rebalance", "tradeoffs", "handoff-modes", "sinks",
          "sink-replay")


@dataclass(frozen=True)
class Step:
    group: str
    name: str
    run: Callable[[Path], dict[str, Any]]


def _steps(quick: bool) -> list[Step]:
    from .dynalite import available as dynalite_available
    from .fleet_bench import Profile, run_disruption, run_stop_latency
    from .request_cost import run_coordination_cost, run_request_cost
    from .scale_record import run_scale
    from .wrapped import run_capacity, run_compat, run_flood, run_reconcile

    steps: list[Step] = []
    # Issue #12's cost target first: 1,000 connections on one worker, every production cadence
    # divided by 2.5 (lease 8 s: at 2 s the worker's renewals on the loaded moto server ran
    # late enough to self-fence), a window of one compressed checkpoint period (240 s).
    steps.append(Step("cost", "coordination-cost-1000", lambda d: run_coordination_cost(
        run_dir=d, connections=1000, factor=2.5, checkpoint_periods=1)))

    def disruption(kind: str, k: int, profile: str, rate: float, dynamodb: str = "moto",
                   exit_event: bool = False, rate_in_name: bool = False) -> Step:
        suffix = ("" if dynamodb == "moto" else f"-{dynamodb}") + ("-exit" if exit_event else "")
        suffix += f"-{rate:g}fps" if rate_in_name else ""
        return Step(kind, f"{kind}-{profile}-{k}{suffix}", lambda d: run_disruption(
            kind, connections=k, profile=profile, rate=rate, run_dir=d, dynamodb=dynamodb,
            task_events=exit_event))

    crash = functools.partial(disruption, "crash")
    handoff = functools.partial(disruption, "handoff")

    def stop(channel: bool, n: int) -> Step:
        name = "stop-control-channel" if channel else "stop-sweep-fallback"
        return Step("stop", name, lambda d: run_stop_latency(
            control_channel=channel, streams=n, profile=Profile.DEFAULT, rate=2.0, run_dir=d))

    if quick:
        steps += [crash(10, Profile.SHORT, 5.0), crash(100, Profile.MEDIUM, 1.0),
                  handoff(10, Profile.DEFAULT, 5.0), stop(True, 15), stop(False, 15)]
        steps.append(Step("cost", "request-cost", lambda d: run_request_cost(
            run_dir=d, phases=[(10, 1.0), (20, 5.0), (50, 20.0)], window_seconds=10)))
        steps.append(Step("capacity", "capacity-1000", lambda d: run_capacity(
            connections=1000, rate=0.2, lease=20, heartbeat=5, margin=2, window=20)))
        steps.append(Step("reconcile", "reconcile", lambda d: run_reconcile(
            items=[10_000], scenarios=["steady"])))
    else:
        steps += [crash(10, Profile.SHORT, 5.0), crash(100, Profile.MEDIUM, 1.0),
                  crash(10, Profile.DEFAULT, 5.0), crash(100, Profile.DEFAULT, 1.0),
                  handoff(10, Profile.DEFAULT, 5.0), handoff(100, Profile.DEFAULT, 1.0),
                  stop(True, 30), stop(False, 30)]
        # The K = 100 runs again with the tables on dynalite (SQS still on moto): the same
        # code, without the serialised moto server in the way (skipped without node).
        if dynalite_available():
            steps += [crash(100, Profile.SHORT, 1.0, "dynalite"),
                      handoff(100, Profile.DEFAULT, 1.0, "dynalite"),
                      # issue #26: signal -> first frame stored on the taker, p99 <= 0.5 s; at
                      # 1 frame/s the stream's own cadence is most of that figure
                      handoff(100, Profile.DEFAULT, 20.0, "dynalite", rate_in_name=True),
                      # issue #14: the lease-bound crash at a 20 s lease, and the same crash
                      # failed over from the task exit event
                      crash(100, Profile.DEFAULT, 1.0, "dynalite"),
                      crash(100, Profile.DEFAULT, 1.0, "dynalite", exit_event=True)]
        steps.append(Step("cost", "request-cost", lambda d: run_request_cost(
            run_dir=d, phases=[(10, 1.0), (20, 5.0), (50, 20.0)], window_seconds=20)))
        steps.append(Step("cost", "request-cost-flush-250ms", lambda d: run_request_cost(
            run_dir=d, phases=[(20, 5.0)], window_seconds=20, flush_ms=250)))
        steps.append(Step("capacity", "capacity-1000", lambda d: run_capacity(
            connections=1000, rate=0.2, lease=20, heartbeat=5, margin=2, window=45)))
        steps.append(Step("capacity", "capacity-5000", lambda d: run_capacity(
            connections=5000, rate=0.02, lease=20, heartbeat=5, margin=2, window=60)))
        steps.append(Step("reconcile", "reconcile", lambda d: run_reconcile(
            items=[10_000, 100_000], scenarios=["steady"])))
    # Memory bounded in bytes: one worker, many sessions, a flood of maximum-size frames.
    steps.append(Step("flood", "flood-50", lambda d: run_flood(
        connections=50, window=30 if quick else 60)))
    # Frames stored per second per worker vCPU, and the worker's profile (dynalite tables).
    if dynalite_available():
        from .throughput import run_throughput

        steps.append(Step("throughput", "throughput-100", lambda d: run_throughput(
            run_dir=d, connections=100, window=15 if quick else 30)))
    steps.append(Step("compat", "compat-dynalite", lambda d: run_compat()))
    # Rebalancing after a scale-out (issue 14): 300 connections on 3 workers, 3 more join.
    from .rebalance_bench import run_rebalance

    backend = "dynalite" if dynalite_available() else "moto"
    steps.append(Step("rebalance", f"rebalance-300-{backend}", lambda d: run_rebalance(
        connections=100 if quick else 300, run_dir=d, dynamodb=backend)))
    # Partition-key heat: 100 connections on 2 workers, every cadence / 10, a 2-minute window
    # (two checkpoint periods at CHECKPOINT_SECONDS / 10); SCALE.md beside the v1 baseline.
    steps.append(Step("scale", "scale", lambda d: run_scale(
        run_dir=d, connections=100, workers=2, factor=10.0,
        window_seconds=60.0 if quick else 120.0)))
    # Issue #13: one stream per upstream shape through a crash and a hand-off; lost frames
    # beside the gap each connection reports (bench/shapes.py).
    from .shapes import run_shapes

    steps.append(Step("shapes", "shapes", run_shapes))
    # Issue #25: lease/heartbeat, pass, schedule and sweep against failover, recovery and cost
    # (docs/tradeoffs.md and docs/tradeoffs.png).
    from .tradeoffs import run_tradeoffs

    steps.append(Step("tradeoffs", "tradeoffs", run_tradeoffs))
    # Issue #26: each upstream behaviour in both hand-off modes, side by side in one run.
    from .handoff_modes import run_handoff_modes

    steps += [
        Step("handoff-modes", "handoff-modes-drain-20", lambda d: run_handoff_modes(
            run_dir=d, dynamodb=backend, rate=20.0, per_cohort=2 if quick else 4)),
        Step("handoff-modes", "handoff-modes-drain-1000", lambda d: run_handoff_modes(
            run_dir=d, dynamodb=backend, rate=1000.0, behaviours=("live",), per_cohort=2)),
        Step("handoff-modes", "handoff-modes-rebalance", lambda d: run_handoff_modes(
            run_dir=d, dynamodb=backend, disruption="rebalance", rate=20.0,
            behaviours=("live",), per_cohort=10 if quick else 20)),
    ]
    # Issue #27: every frame sink in one run, frames per worker vCPU-second and cost per
    # million frames from the units the backend was sent (bench/sink_bench.py).
    if dynalite_available():
        from .sink_bench import run_sinks

        steps.append(Step("sinks", "sinks", lambda d: run_sinks(
            d, window=10.0 if quick else 20.0, warmup=3.0 if quick else 5.0)))
    # Issue #27's delivery contract: frames lost and re-sent by the stream sinks through a
    # SIGKILL, a rebalance and a SIGTERM, against the windows the views report.
    from .sink_replay import run_sink_replay

    steps += [Step("sink-replay", f"sink-replay-{sink}", functools.partial(
        lambda d, sink: run_sink_replay(run_dir=d, sink=sink), sink=sink))
        for sink in ("kinesis", "firehose")]
    return steps  # fmt: skip


def _load() -> dict[str, Any]:
    try:
        return dict(json.loads(RESULTS_JSON.read_text()))
    except (OSError, ValueError):
        return {}


def _save(document: dict[str, Any]) -> None:
    RESULTS_JSON.write_text(json.dumps(document, indent=2, default=str) + "\n")


def _write_markdown(document: dict[str, Any]) -> None:
    """Render RESULTS.md; a rendering bug must not end the run (results.json is kept)."""
    from .report import render

    try:
        RESULTS_MD.write_text(render(document))
    except Exception:
        print(f"[bench] RESULTS.md not rendered:\n{traceback.format_exc()}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="GROUP_OR_STEP",
                        help=f"groups ({', '.join(GROUPS)}) or step names (e.g. capacity-5000)")
    parser.add_argument("--render", action="store_true", help="only re-render RESULTS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "wsfleet")

    from .report import render

    if args.render:
        RESULTS_MD.write_text(render(_load()))
        return 0
    command = "python -m bench" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    document = _load() if args.only else {}
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    if args.only and document.get("command"):  # a partial re-run joins the last full table
        document.setdefault("reruns", []).append(
            {"command": command, "started_at": stamp, "machine": machine()}
        )
    else:
        document.update({
            "command": command,
            "mode": "quick" if args.quick else "full",
            "started_at": stamp,
            "machine": machine(),
        })  # fmt: skip
    steps = [
        step for step in _steps(args.quick)
        if not args.only or step.group in args.only or step.name in args.only
    ]  # fmt: skip
    rerun = {step.name for step in steps}
    results: dict[str, Any] = {
        name: result
        for name, result in document.get("results", {}).items()
        # what is re-run starts afresh (a re-run group also drops steps it no longer has)
        if args.only and name not in rerun and result.get("group") not in args.only
    }
    began = time.monotonic()
    failures = 0
    for step in steps:
        print(f"[bench] {step.name} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        run_dir = Path(tempfile.mkdtemp(prefix=f"wsfleet-bench-{step.name}-"))
        try:
            result = step.run(run_dir)
        except Exception as exc:  # one broken benchmark must not lose the others
            failures += 1
            result = {"error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        result["group"] = step.group
        result["elapsed_seconds"] = round(time.monotonic() - started, 1)
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        result["run_dir"] = str(run_dir)
        results[step.name] = result
        document["results"] = results
        if not args.only:
            document["total_seconds"] = round(time.monotonic() - began, 1)
        _save(document)
        _write_markdown(document)
        status = "ERROR " + result["error"] if "error" in result else "done"
        print(f"[bench] {step.name}: {status} ({result['elapsed_seconds']} s)", file=sys.stderr,
              flush=True)  # fmt: skip
    if not args.only:
        document["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        document["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    _save(document)
    _write_markdown(document)
    print(f"[bench] wrote {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)}",
          file=sys.stderr)  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
