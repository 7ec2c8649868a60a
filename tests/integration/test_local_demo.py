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
    assert report["overlapping_sessions"] == 0
    assert report["produced"] > 0 and report["stored"] > 0
    assert report["crash_failover_seconds"] and report["handoff_seconds"]
    assert len(report["stop_seconds"]) == 2
    assert "joined" in report["rebalance"]  # a worker joined and the spread evened out
    assert "lost" in result.stdout and "duplicated" in result.stdout  # the summary table
