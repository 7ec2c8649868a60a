"""`wsfleet demo` end to end, small: a crash, a deploy, a worker joining and STOPs with
nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WSFLEET = str(Path(sys.executable).with_name("wsfleet"))


def test_demo_runs_to_a_clean_summary(tmp_path):
    # GIVEN a small demo (2 workers, 6 streams) WHEN it runs without a terminal (as in CI)
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [
            WSFLEET, "demo", "--workers", "2", "--streams", "6", "--stops", "2",
            "--steady", "1", "--seed", "3", "--run-dir", str(tmp_path / "run"),
            "--json", str(summary),
        ],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    # THEN it exits 0 with every disruption measured and nothing lost or duplicated
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads(summary.read_text())
    assert report["ok"] is True and report["failures"] == []
    assert report["lost"] == 0 and report["duplicated"] == 0
    # (upstream session overlaps are the planned make-before-break hand-offs: not duplicates)
    assert report["produced"] > 0 and report["stored"] > 0
    assert report["crash_failover_seconds"] and report["handoff_seconds"]
    assert len(report["stop_seconds"]) == 2
    assert "joined" in report["rebalance"]  # a worker joined and the spread evened out
    assert "lost" in result.stdout and "duplicated" in result.stdout  # the summary table
    # AND the live-only pair went through the deploy: each moved, and reports what it lost
    live = {h["mode"]: h for h in report["live_handoffs"]}
    assert set(live) == {"overlap", "break"}
    for handoff in live.values():
        assert handoff["moves"] >= 1 and handoff["stored"] > 0, handoff
        assert handoff["gap_frames"] == handoff["lost"], handoff  # nothing lost untraced
    # break-before-make on an upstream that cannot replay loses the hand-off's frames (the
    # 0-loss row below would catch a mode that loses them); make-before-break loses none
    assert live["break"]["lost"] > 0, live["break"]
    assert live["overlap"]["lost"] == 0, live["overlap"]
    assert "live-only overlap" in result.stdout and "live-only break" in result.stdout


def test_demo_without_task_events_fails_the_crash_over_by_the_lease(tmp_path):
    # GIVEN the demo with the exit events off (a hung or partitioned worker: no event comes)
    summary = tmp_path / "summary.json"
    run = tmp_path / "run"
    result = subprocess.run(
        [
            WSFLEET, "demo", "--workers", "2", "--streams", "4", "--stops", "1",
            "--steady", "1", "--seed", "5", "--run-dir", str(run), "--json", str(summary),
            "--no-task-events",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # THEN no task exit function ran, and the crash still failed over (by the lease) with
    # nothing lost; the summary says which path it measured. (The later phases, whose outcome
    # decides the exit status, are the test above's.)
    assert summary.exists(), result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads(summary.read_text())
    assert report["task_exit_events"] is False
    assert report["lost"] == 0 and report["duplicated"] == 0
    assert report["crash_failover_seconds"]  # every crashed stream flowed again elsewhere
    assert not list(run.glob("lambda-task_exit*"))
    assert list(run.glob("lambda-reconciler*"))  # the lease path's early hints
    assert "no task exit event" in report["crash_path"]  # what the summary's crash line says
