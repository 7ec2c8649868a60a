"""The delivery contract of the Kinesis sink through a SIGKILL, a rebalance and a SIGTERM
(issue #27): nothing lost, every frame re-sent inside the window the connection view reports,
no more re-sent than it reports, nothing re-sent (nor reported) after a drain or a move.

A local fleet on the moto server (tables, Kinesis stream, simulator upstream), short lease and
heartbeat, a small MESSAGE_REPLAY_WINDOW so the send limit drives the checkpoints
(bench/sink_replay.py runs the same scenario as a bench row). The assertions are relations
between counts, never timings; every wait is for a condition with a generous deadline.
"""

from __future__ import annotations

import pytest

from bench.sink_replay import run_sink_replay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_kinesis_failovers_lose_nothing_and_re_send_only_inside_the_reported_window(tmp_path):
    result = run_sink_replay(run_dir=tmp_path, sink="kinesis", connections=6, window=60)
    kinds = result["kinds"]
    assert result["lost"] == 0, result
    # The SIGKILL's takeovers re-sent what lay above each checkpoint, all of it inside the
    # window the views report, and no more than the frames they report re-sent.
    killed = kinds["sigkill"]
    assert killed["handoffs"] >= 1 and killed["windows"], result
    assert killed["outside"] == 0 and killed["re_sent"] <= killed["reported"], result
    assert all(high - low < 60 for _, low, high in killed["windows"]), result
    # Graceful hand-offs (rebalancing moves, the drain; overlap transfers by default) re-send
    # nothing, and the views report nothing re-sent: the transfer or release carries the
    # giver's final window (sent_limit = last_seq), not the last checkpoint's.
    moved = kinds["rebalance"]
    assert moved["handoffs"] >= 1 and moved["outside"] == 0, result
    assert (moved["re_sent"], moved["reported"]) == (0, 0), result
    drained = kinds["sigterm"]
    assert drained["handoffs"] >= 1 and (drained["re_sent"], drained["reported"]) == (0, 0), result
    assert result["met"], result
