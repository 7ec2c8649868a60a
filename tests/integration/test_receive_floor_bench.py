"""The receive floor's bare client (bench/receive_floor.py) really receives and is measured.

A short real run: bench/throughput.py's upstream, 5 connections at 20 frames/s, the client in
its own process counting frames (and parsing them), its CPU read from /proc over a window of a
couple of seconds. Nothing is timed: the figures are counts and CPU seconds.
"""

from __future__ import annotations

import pytest

from bench.receive_floor import run_floor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_bare_client_counts_frames_and_its_cpu_is_measured(tmp_path):
    results = run_floor(connections=5, rate=20.0, frame_bytes=200, warmup=0.5, window=2.0,
                        run_dir=tmp_path)  # fmt: skip
    assert set(results) == {"receive-floor", "receive-floor+parse"}
    for variant, figures in results.items():
        assert figures["active_connections"] == 5, (variant, figures)
        assert figures["frames_stored"] > 0, (variant, figures)
        assert figures["worker_cpu_seconds"] > 0, (variant, figures)
        assert figures["frames_per_cpu_second"] > 0 and figures["cpu_us_per_frame"] > 0
    # AND each client's count lines are in its own log
    assert (tmp_path / "receive-floor.log").read_text().count('"MessagesReceived"') >= 2
