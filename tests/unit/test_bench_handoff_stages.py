"""bench.handoff_stages: each hand-off stage read from worker log lines and the upstream's
session log, per connection, relative to the signal."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from bench.handoff_stages import (
    BREAK_STAGES,
    BREAK_STEPS,
    OVERLAP_STAGES,
    OVERLAP_STEPS,
    first_stored_frames,
    giver_ends,
    log_events,
    stage_times,
    store_stalls,
)

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
        line("w0", "session finished", -5.0, connection_id="a", released=True),  # before
        line("w0", "session finished", 0.100, connection_id="a", released=True),
        line("w0", "session finished", 0.200, connection_id="b", released=True),
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

    # THEN both took the break path (no giver decided a transfer for them)
    assert timed["moves"] == {"break": 2}
    assert set(timed["paths"]) == {"break"}
    # AND every stage of it has both connections, at the later one's time as its p99
    stages = timed["paths"]["break"]["stages"]
    assert list(stages) == list(BREAK_STAGES)
    assert {stage: stages[stage]["n"] for stage in BREAK_STAGES} == dict.fromkeys(BREAK_STAGES, 2)
    expected_p99 = {"giver_closed": 0.02, "released": 0.2, "hint_sent": 0.25, "hint_seen": 0.3,
                    "acquired": 0.4, "upstream_opened": 0.45, "first_frame": 0.5,
                    "first_stored": 0.6}  # fmt: skip
    assert {stage: stages[stage]["p99"] for stage in BREAK_STAGES} == expected_p99
    # and each step is measured per connection: b waited 0.1 s from its hint seen to its acquire
    steps = timed["paths"]["break"]["steps"]
    assert list(steps) == list(BREAK_STEPS)
    assert steps["hint_seen->acquired"]["max"] == 0.1
    assert steps["first_frame->first_stored"]["min"] == 0.1  # b: 0.5 -> 0.6
    # AND the target's stage counts every connection
    assert timed["stages"]["first_stored"]["n"] == 2


def test_a_stage_nobody_logged_is_left_out_rather_than_counted_as_zero():
    # GIVEN only the upstream's sessions (the workers logged at WARNING)
    sessions = [session("a", -10.0, 0.010, -9.0), session("a", 0.300, None, 0.310)]

    # WHEN the stages are timed
    timed = stage_times([], sessions, ["a"], signalled_at=SIGNAL, giver="w0")

    # THEN only what the upstream saw is there
    assert set(timed["stages"]) == {"giver_closed", "upstream_opened", "first_frame"}
    assert set(timed["paths"]["break"]["steps"]) == {"upstream_opened->first_frame"}


def test_an_overlap_move_is_timed_on_its_own_path_from_the_control_messages(tmp_path: Path):
    # GIVEN a giver that transferred "a" through PREPARE, READY and COMMIT, and broke "b"
    # (its taker declined), each stage logged where it happened
    def sent(worker: str, after: float, **messages: list[str]) -> str:
        return line(worker, "control messages sent", after, messages=messages)

    def received(worker: str, after: float, **messages: list[str]) -> str:
        return line(worker, "control messages received", after, messages=messages)

    (tmp_path / "worker-w0.log").write_text("\n".join([
        sent("w0", 0.010, PREPARE=["a", "b"]),
        received("w0", 0.100, READY=["a"]),
        line("w0", "hand-off decided", 0.101, connection_id="a", decision="transfer"),
        line("w0", "hand-off decided", 0.150, connection_id="b", decision="declined"),
        line("w0", "session transferred", 0.130, connection_id="a"),
        sent("w0", 0.140, COMMIT=["a"]),
        line("w0", "session finished", 0.200, connection_id="b", released=True),
        sent("w0", 0.210, HANDOFF=["b"]),
        line("w0", "hints sent", 5.130, connection_ids=["a"]),  # the transfer's delayed copy
    ]) + "\n")  # fmt: skip
    (tmp_path / "worker-w1.log").write_text("\n".join([
        received("w1", 0.020, PREPARE=["a", "b"]),
        sent("w1", 0.090, READY=["a"]),
        received("w1", 0.150, COMMIT=["a"]),
        line("w1", "prepared session adopted", 0.160, connection_id="a"),
        line("w1", "first frame stored", 0.250, connection_id="a"),
        received("w1", 0.220, HANDOFF=["b"]),
        line("w1", "lease acquired", 0.240, connection_id="b"),
        line("w1", "first frame stored", 0.400, connection_id="b"),
        line("w1", "hints received", 5.200, connection_ids=["a"]),  # the copy: not a stage
    ]) + "\n")  # fmt: skip
    sessions = [
        session("a", -10.0, 0.135, -9.0), session("a", 0.030, None, 0.080),
        session("b", -10.0, 0.190, -9.0), session("b", 0.030, 0.180, 0.080),
        session("b", 0.300, None, 0.350),
    ]  # fmt: skip

    # WHEN the stages are timed
    timed = stage_times(log_events(sorted(tmp_path.glob("worker-*.log"))), sessions,
                        ["a", "b"], signalled_at=SIGNAL, giver="w0")  # fmt: skip

    # THEN "a" is the one overlap move, with every stage of the path, "b" a fallback
    assert timed["moves"] == {"overlap": 1, "break": 1, "fallbacks": {"declined": 1}}
    overlap = timed["paths"]["overlap"]
    assert list(overlap["stages"]) == [*OVERLAP_STAGES, "giver_closed"]
    assert {stage: overlap["stages"][stage]["p50"] for stage in OVERLAP_STAGES} == {
        "prepare_sent": 0.01, "prepare_seen": 0.02, "upstream_opened": 0.03,
        "first_frame": 0.08, "ready_sent": 0.09, "ready_seen": 0.1, "transferred": 0.13,
        "commit_sent": 0.14, "commit_seen": 0.15, "adopted": 0.16, "first_stored": 0.25,
    }  # fmt: skip
    assert list(overlap["steps"]) == list(OVERLAP_STEPS)
    assert overlap["steps"]["adopted->first_stored"]["max"] == 0.09
    # AND the delayed copy of the transfer's hint is no stage of anybody's
    assert "hint_seen" not in overlap["stages"]
    broke = timed["paths"]["break"]["stages"]
    assert broke["hint_seen"]["max"] == 0.22  # b's HANDOFF, on the control queue
    assert broke["hint_sent"]["max"] == 0.21
    # AND first stored over every connection is the later of the two, and the copy is not
    # counted as a hint seen there either
    assert timed["stages"]["first_stored"]["max"] == 0.4
    assert timed["stages"]["hint_seen"]["n"] == 1


def item(seq: int, worker: str, received_after: float) -> dict[str, object]:
    """A stored frame as MessageStore.read_all returns it, received ``received_after`` the
    signal."""
    return {"pk": "CONN#x", "sk": f"{seq:020d}", "seq": seq, "worker_id": worker,
            "lease_epoch": 1 if worker == "w0" else 2,
            "received_at_ms": round((SIGNAL + received_after) * 1000)}  # fmt: skip


def test_the_store_stall_runs_from_the_givers_last_stored_frame_to_the_takers_first(
    tmp_path: Path,
):
    # GIVEN two streams handed from w0: the giver stored "a" up to seq 12 (received 0.30 s
    # after the signal) and "b" up to seq 7 (0.10 s); the takers logged their first stored
    # frames (seq 13 at 0.70 s, seq 8 at 0.50 s), a frame each had received (buffered) at
    # 0.35 s and 0.15 s; the giver also logged a "first frame stored" before the signal
    # (the giver transferred "a" at 0.45 s and released "b" at 0.20 s, after a release of "b"
    # before the signal and a session of "b" that ended without a release)
    (tmp_path / "worker-w0.log").write_text("\n".join([
        line("w0", "first frame stored", -30.0, connection_id="a", seq=1),
        line("w0", "session finished", -20.0, connection_id="b", released=True),
        line("w0", "session finished", 0.150, connection_id="b", released=False),
        line("w0", "session finished", 0.200, connection_id="b", released=True),
        line("w0", "session transferred", 0.450, connection_id="a"),
    ]) + "\n")  # fmt: skip
    (tmp_path / "worker-w1.log").write_text("\n".join([
        line("w1", "first frame stored", 0.700, connection_id="a", seq=13),
    ]) + "\n")  # fmt: skip
    (tmp_path / "worker-w2.log").write_text("\n".join([
        line("w2", "first frame stored", 0.500, connection_id="b", seq=8),
        line("w2", "first frame stored", 0.900, connection_id="c", seq=1),  # not handed off
    ]) + "\n")  # fmt: skip
    items = {
        "a": [item(11, "w0", 0.25), item(12, "w0", 0.30), item(13, "w1", 0.35),
              item(14, "w1", 0.40)],
        "b": [item(6, "w0", 0.05), item(7, "w0", 0.10), item(8, "w2", 0.15)],
    }  # fmt: skip
    events = log_events(sorted(tmp_path.glob("worker-*.log")))

    # WHEN the takers' first stored frames are found and the stalls computed
    firsts = first_stored_frames(events, ["a", "b"], signalled_at=SIGNAL, giver="w0")
    ends = giver_ends(events, ["a", "b"], signalled_at=SIGNAL, giver="w0")
    stalls = store_stalls(items, firsts, signalled_at=SIGNAL, giver="w0", giver_ended=ends)

    # THEN each stream's first stored frame is its taker's line, with the seq it names
    assert {k: (round(at - SIGNAL, 3), seq) for k, (at, seq) in firsts.items()} == {
        "a": (0.7, 13), "b": (0.5, 8)}
    # AND the stall is the giver's last frame -> the taker's first stored: a 0.40 s, b 0.40 s
    assert stalls["missing"] == 0
    assert stalls["store_stall"]["n"] == 2
    assert (stalls["store_stall"]["min"], stalls["store_stall"]["max"]) == (0.4, 0.4)
    # AND from the giver's end (its transfer of a at 0.45 s, its release of b at 0.20 s) the
    # stall is at least 0.25 s (a) and 0.30 s (b)
    assert {k: round(at - SIGNAL, 3) for k, at in ends.items()} == {"a": 0.45, "b": 0.2}
    assert (stalls["store_stall_lower"]["min"], stalls["store_stall_lower"]["max"]) == (
        0.25, 0.3)
    # AND the giver stored until 0.10 s (b) and 0.30 s (a) after the signal
    assert (stalls["giver_last_received"]["min"],
            stalls["giver_last_received"]["max"]) == (0.1, 0.3)  # fmt: skip
    # AND each taker's first frame reached the table 0.35 s after it was received
    assert stalls["first_frame_age"] == {"n": 2, "p50": 0.35, "p95": 0.35, "p99": 0.35,
                                         "max": 0.35, "min": 0.35}  # fmt: skip


def test_a_stream_without_a_takers_line_or_a_givers_frame_is_counted_missing():
    # GIVEN "a" with a taker's line but no frame the giver stored, "b" with no taker's line
    firsts = {"a": (SIGNAL + 0.5, 3)}
    items = {"a": [item(3, "w1", 0.2)], "b": [item(1, "w0", 0.1)]}

    # WHEN the stalls are computed
    stalls = store_stalls(items, firsts, signalled_at=SIGNAL, giver="w0")

    # THEN both are missing, and no figure is made up for them
    assert stalls == {"missing": 2}
