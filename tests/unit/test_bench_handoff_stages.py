"""bench.handoff_stages: each hand-off stage read from worker log lines and the upstream's
session log, per connection, relative to the signal."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from bench.handoff_stages import STAGES, STEPS, log_events, stage_times

SIGNAL = 1_800_000_000.0


def stamp(seconds_after: float) -> str:
    """A Powertools timestamp ``seconds_after`` the signal."""
    moment = datetime.fromtimestamp(SIGNAL + seconds_after, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S,") + f"{moment.microsecond // 1000:03d}+0000"


def line(worker: str, message: str, after: float, **fields: object) -> str:
    return json.dumps({"level": "INFO", "message": message, "timestamp": stamp(after),
                       "worker_id": worker, **fields})  # fmt: skip


def session(stream: str, opened: float, closed: float | None, first: float | None):
    return SimpleNamespace(
        stream_id=stream, session_id=f"{stream}@{opened}", opened_at=SIGNAL + opened,
        closed_at=None if closed is None else SIGNAL + closed,
        first_frame_at=None if first is None else SIGNAL + first,
    )  # fmt: skip


def test_each_stage_is_read_per_connection_from_the_giver_the_takers_and_the_upstream(
    tmp_path: Path,
):
    # GIVEN the giver's and a taker's log lines for two connections, and the upstream's sessions
    (tmp_path / "worker-w0.log").write_text("\n".join([
        line("w0", "session finished", -5.0, connection_id="a"),  # before the signal: ignored
        line("w0", "session finished", 0.100, connection_id="a"),
        line("w0", "session finished", 0.200, connection_id="b"),
        line("w0", "hints sent", 0.120, connection_ids=["a"]),
        line("w0", "hints sent", 0.250, connection_ids=["b", "other"]),
        "not json",
    ]) + "\n")  # fmt: skip
    (tmp_path / "worker-w1.log").write_text("\n".join([
        line("w1", "hints received", 0.150, count=2, connection_ids=["a"]),
        line("w1", "hints received", 0.300, count=1, connection_ids=["b"]),
        line("w1", "lease acquired", 0.200, connection_id="a", acquire_ms=50),
        line("w1", "lease acquired", 0.400, connection_id="b", acquire_ms=100),
        line("w1", "first frame stored", 0.350, connection_id="a"),
        line("w1", "first frame stored", 0.600, connection_id="b"),
    ]) + "\n")  # fmt: skip
    sessions = [
        session("a", -10.0, 0.010, -9.0), session("a", 0.220, None, 0.230),
        session("b", -10.0, 0.020, -9.0), session("b", 0.450, None, 0.500),
    ]  # fmt: skip
    events = log_events(sorted(tmp_path.glob("worker-*.log")))

    # WHEN the stages are timed
    timed = stage_times(events, sessions, ["a", "b"], signalled_at=SIGNAL, giver="w0")

    # THEN every stage has both connections, at the later one's time as its p99
    stages = timed["stages"]
    assert list(stages) == list(STAGES)
    assert {stage: stages[stage]["n"] for stage in STAGES} == dict.fromkeys(STAGES, 2)
    expected_p99 = {"giver_closed": 0.02, "released": 0.2, "hint_sent": 0.25, "hint_seen": 0.3,
                    "acquired": 0.4, "upstream_opened": 0.45, "first_frame": 0.5,
                    "first_stored": 0.6}  # fmt: skip
    assert {stage: stages[stage]["p99"] for stage in STAGES} == expected_p99
    # and each step is measured per connection: b waited 0.1 s from its hint seen to its acquire
    assert list(timed["steps"]) == list(STEPS)
    assert timed["steps"]["hint_seen->acquired"]["max"] == 0.1
    assert timed["steps"]["first_frame->first_stored"]["min"] == 0.1  # b: 0.5 -> 0.6


def test_a_stage_nobody_logged_is_left_out_rather_than_counted_as_zero():
    # GIVEN only the upstream's sessions (the workers logged at WARNING)
    sessions = [session("a", -10.0, 0.010, -9.0), session("a", 0.300, None, 0.310)]

    # WHEN the stages are timed
    timed = stage_times([], sessions, ["a"], signalled_at=SIGNAL, giver="w0")

    # THEN only what the upstream saw is there
    assert set(timed["stages"]) == {"giver_closed", "upstream_opened", "first_frame"}
    assert set(timed["steps"]) == {"upstream_opened->first_frame"}
