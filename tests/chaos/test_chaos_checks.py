"""The chaos checker catches what it claims to catch (synthetic histories, no fleet).

A checker that never fails proves nothing: each test builds a small history with exactly one
defect and expects exactly that invariant to be reported.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace

import chaos_schedule
from chaos_history import (
    ForgedStop,
    Pause,
    PlannedHandoff,
    Sample,
    StopOutcome,
    Verdict,
    WorkerExit,
    check_history,
    check_hostile,
    check_poison,
)
from chaos_schedule import make_schedule

from wsfleet.record import DesiredState, WorkerRecord
from wsfleet_local.simulator import hostile_frame_data

END = 1000.0
LIVE_W1 = WorkerRecord(worker_id="w1", control_queue_url="", started_at_ms=0,
                       heartbeat_at_ms=0, expires_at_ms=int((END + 10) * 1000))  # fmt: skip


@dataclass
class Rec:
    desired_state: DesiredState = DesiredState.STARTED
    lease_owner: str = "w1"
    last_seq: int = 3
    lease_epoch: int = 2
    stop_reason: str | None = None


@dataclass
class Sess:
    stream_id: str
    session_id: int
    opened_at: float
    closed_at: float | None = None
    gap: int = 0
    faults: tuple[str, ...] = field(default_factory=tuple)


def item(seq: int, epoch: int = 2, received: float = 500.0, data: str | None = None) -> dict:
    return {"seq": seq, "sk": f"{seq:020d}", "message_data": data or f"s:{seq}",
            "lease_epoch": epoch, "received_at_ms": int(received * 1000)}  # fmt: skip


def check(**overrides):
    base = dict(
        expected_states={"s": "STARTED"},
        final_records={"s": Rec()},
        live_workers={"w1"},
        worker_records={"w1": LIVE_W1},
        sessions=[Sess("s", 1, 100.0, 200.0), Sess("s", 2, 200.5)],
        items={"s": [item(1, 1, 150.0), item(2, 2, 300.0), item(3, 2, 301.0)]},
        samples=[Sample(150.0, "s", 1, "w0", 0, "STARTED"),
                 Sample(250.0, "s", 2, "w1", 2, "STARTED")],
        pauses=[],
        resume_grace_seconds=3.0,
        end_time=END,
    )  # fmt: skip
    base.update(overrides)
    return check_history(**base)


def invariants(verdict) -> set[str]:
    return {v.invariant for v in verdict.violations}


def test_a_clean_history_passes():
    verdict = check()
    assert verdict.ok, verdict.violations
    assert verdict.figures["messages_checked"] == 3


def test_a_missing_seq_below_the_checkpoint_is_lost():
    assert invariants(check(items={"s": [item(1, 1, 150.0), item(3, 2, 301.0)]})) == {"lost"}


def test_foreign_content_is_a_duplicate():
    bad = [item(1, 1, 150.0), item(2, 2, 300.0, data="t:2"), item(3, 2, 301.0)]
    assert invariants(check(items={"s": bad})) == {"duplicated"}


def test_a_write_received_after_a_later_epoch_was_seen_breaks_fencing():
    late = [item(1, 1, 150.0), item(2, 2, 300.0), item(3, 2, 301.0), item(4, 1, 260.0)]
    assert invariants(check(items={"s": late})) == {"fenced"}


def test_an_old_epoch_above_a_newer_one_breaks_fencing():
    stale = [item(1, 2, 240.0), item(2, 1, 200.0), item(3, 2, 301.0)]
    assert "fenced" in invariants(check(items={"s": stale}))


def test_a_checkpoint_going_backwards_breaks_fencing():
    samples = [Sample(150.0, "s", 1, "w0", 5, "STARTED"),
               Sample(250.0, "s", 2, "w1", 4, "STARTED")]  # fmt: skip
    assert invariants(check(samples=samples)) == {"fenced"}


def test_a_planned_handoffs_overlap_is_told_from_a_split_brain():
    # GIVEN the giver's session (1) and the taker's (2) open together for 0.3 s
    mbb = [Sess("s", 1, 100.0, 200.3), Sess("s", 2, 200.0)]
    # WHEN the giver announced the hand-off (PREPARE) before the taker's session opened and
    # the two closed within the hand-off's end plus the grace: planned, not a violation
    announced = PlannedHandoff("s", epoch=1, prepared_at=199.8, ended_at=200.25)
    verdict = check(sessions=mbb, handoffs=[announced], handoff_grace_seconds=0.5)
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    assert verdict.figures["planned_handoffs_announced"] == 1
    # the same overlap without the announcement is a split brain
    assert invariants(check(sessions=mbb)) == {"overlap"}
    # announced only after the second session had opened: it does not explain it
    late = replace(announced, prepared_at=200.1)
    assert invariants(check(sessions=mbb, handoffs=[late], handoff_grace_seconds=0.5)) == {
        "overlap"
    }
    # a hand-off of another stream explains nothing here
    other = replace(announced, stream_id="t")
    assert invariants(check(sessions=mbb, handoffs=[other], handoff_grace_seconds=0.5)) == {
        "overlap"
    }


def test_a_planned_overlap_that_outlasts_its_handoff_is_a_violation():
    # the giver's session stays open 5 s after the hand-off ended: not the planned window
    lingering = [Sess("s", 1, 100.0, 205.0), Sess("s", 2, 200.0)]
    announced = PlannedHandoff("s", epoch=1, prepared_at=199.8, ended_at=200.2)
    verdict = check(sessions=lingering, handoffs=[announced], handoff_grace_seconds=0.5)
    assert invariants(verdict) == {"overlap"}
    # a giver that died mid-hand-off (end unknown): bounded from the PREPARE instead
    unknown = replace(announced, ended_at=None)
    assert check(sessions=[Sess("s", 1, 100.0, 201.0), Sess("s", 2, 200.0)],
                 handoffs=[unknown], handoff_grace_seconds=1.5).ok  # fmt: skip
    assert not check(sessions=lingering, handoffs=[unknown], handoff_grace_seconds=1.5).ok


def test_one_planned_handoff_excuses_one_pair_a_third_session_is_a_split_brain():
    three = [Sess("s", 1, 100.0, 200.3), Sess("s", 2, 200.0), Sess("s", 3, 200.1, 200.2)]
    announced = PlannedHandoff("s", epoch=1, prepared_at=199.8, ended_at=200.25)
    verdict = check(sessions=three, handoffs=[announced], handoff_grace_seconds=0.5)
    assert invariants(verdict) == {"overlap"}
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    assert verdict.figures["overlaps"] == 3


def test_a_write_by_anyone_but_the_owner_of_its_epoch_is_a_violation():
    owned = [dict(item(1, 1, 150.0), worker_id="w0"), dict(item(2, 2, 300.0), worker_id="w1"),
             dict(item(3, 2, 301.0), worker_id="w1")]  # fmt: skip
    verdict = check(items={"s": owned})
    assert verdict.ok, verdict.violations
    assert verdict.figures["writes_owner_checked"] == 3
    assert verdict.figures["writes_by_non_owner"] == 0
    # a prepared taker (w1) that wrote under the giver's epoch before the transfer named it
    early = [dict(item(1, 1, 150.0), worker_id="w1"), *owned[1:]]
    verdict = check(items={"s": early})
    assert invariants(verdict) == {"owner"}
    assert verdict.figures["writes_by_non_owner"] == 1
    # an epoch no sample saw: not judged, but counted
    unseen = [*owned, dict(item(4, 7, 302.0), worker_id="w9")]
    verdict = check(items={"s": unseen}, final_records={"s": Rec(last_seq=4)})
    assert verdict.figures["writes_of_unsampled_epochs"] == 1
    assert "owner" not in invariants(verdict)


def test_any_overlap_is_a_violation_unless_the_owner_was_paused():
    brief = [Sess("s", 1, 100.0, 200.05), Sess("s", 2, 200.0)]
    assert invariants(check(sessions=brief)) == {"overlap"}
    assert check(sessions=brief).figures["overlaps"] == 1
    touching = [Sess("s", 1, 100.0, 200.0), Sess("s", 2, 200.0)]
    assert check(sessions=touching).ok
    long = [Sess("s", 1, 100.0, 230.0), Sess("s", 2, 200.0)]
    assert invariants(check(sessions=long)) == {"overlap"}
    paused = [Pause("w0", 190.0, 228.0)]
    assert check(sessions=long, pauses=paused).ok
    too_late = [Pause("w0", 190.0, 220.0)]
    assert invariants(check(sessions=long, pauses=too_late)) == {"overlap"}


def test_convergence_needs_one_live_owner_and_one_socket():
    assert invariants(check(live_workers={"w9"})) == {"converged"}
    expired = replace(LIVE_W1, expires_at_ms=int((END - 1) * 1000))
    assert invariants(check(worker_records={"w1": expired})) == {"converged"}
    killed = replace(LIVE_W1, dead_at_ms=int((END - 5) * 1000))
    assert invariants(check(worker_records={"w1": killed})) == {"converged"}
    assert invariants(check(worker_records={})) == {"converged"}
    # an incarnation of a live worker process (started over after a lost lease) counts as it
    reborn = {"s": Rec(lease_owner="w1+2")}
    assert check(final_records=reborn, worker_records={"w1+2": LIVE_W1}).ok
    assert invariants(check(final_records=reborn, worker_records={"w1": LIVE_W1})) == {
        "converged"
    }
    two_open = [Sess("s", 1, 100.0), Sess("s", 2, 100.5)]
    assert "converged" in invariants(check(sessions=two_open))
    stopped = {"s": Rec(desired_state=DesiredState.STOPPED, lease_owner="")}
    assert invariants(check(expected_states={"s": "STOPPED"}, final_records=stopped)) == {
        "converged"
    }


def test_a_resume_gap_is_reported():
    gap = [Sess("s", 1, 100.0, 200.0), Sess("s", 2, 200.5, gap=5)]
    assert invariants(check(sessions=gap)) == {"gap"}


def test_schedules_are_reproducible_and_keep_one_worker_untouched():
    first = make_schedule(random.Random(5), duration=60, workers=3, lease_seconds=4)
    assert first == make_schedule(random.Random(5), duration=60, workers=3, lease_seconds=4)
    assert first != make_schedule(random.Random(6), duration=60, workers=3, lease_seconds=4)
    disrupted: dict[int, float] = {}
    for action in first:
        if action.kind in ("kill", "term", "pause", "restart"):
            busy = {s for s, until in disrupted.items() if until > action.at}
            assert len(busy | {action.slot}) < 3
            disrupted[action.slot] = action.at + 10
        if action.kind in ("revive", "resume"):
            disrupted[action.slot] = action.at


def test_the_handoff_track_disrupts_drains_midway_and_leaves_the_other_tracks_alone():
    args = dict(duration=60, workers=5, lease_seconds=4)
    plain = make_schedule(random.Random(5), **args)
    with_handoffs = make_schedule(random.Random(5), **args, handoffs=5)
    # the other tracks of the seed are unchanged: the hand-off track only adds
    def key(a):
        return (a.at, a.kind, a.slot, a.duration, a.menu, a.variant)

    added = [key(a) for a in with_handoffs]
    for action in plain:
        added.remove(key(action))
    assert added and {k[1] for k in added} <= {
        "handoff", "kill_draining", "kill", "pause", "resume", "revive", "partition", "clear",
        "unmute",
    }  # fmt: skip
    drains = [a for a in with_handoffs if a.kind == "handoff"]
    assert drains and {a.variant for a in drains} <= set(chaos_schedule.HANDOFF_VARIANTS)
    for drain in drains:
        follow = [a for a in with_handoffs if a.at > drain.at]
        # the giver comes back; its strike lands within the drain
        assert any(a.kind == "revive" and a.slot == drain.slot for a in follow)
        assert 0 < drain.duration <= 1.0
        if drain.variant == "kill_giver":
            assert any(a.kind == "kill_draining" and a.slot == drain.slot for a in follow)
        if drain.variant == "mute_taker":
            assert any(a.kind == "unmute" for a in follow)
    # with too few workers (one must stay untouched) there is none
    assert not [a for a in make_schedule(random.Random(5), duration=60, workers=2,
                                         lease_seconds=4, handoffs=5) if a.kind == "handoff"]


# -- poison-message track ----------------------------------------------------------------------


def poison(**overrides) -> Verdict:
    base = dict(
        exits=[WorkerExit("w1", None, ()), WorkerExit("w0", -9, (9,)),
               WorkerExit("w2", 0, (19, 18, 15))],
        queue_depths={"HintQueue": 0, "control:w1": 0},
        dead_lettered=0,
        forged=[ForgedStop("s", "w1", 2, sent_at=100.0)],
        stop_outcomes={"s": [StopOutcome(2, False, 100.2)], "t": [StopOutcome(1, True, 50.0)]},
    )  # fmt: skip
    base.update(overrides)
    verdict = Verdict()
    check_poison(verdict, **base)
    return verdict


def test_a_clean_poison_history_passes():
    verdict = poison()
    assert verdict.ok, verdict.violations
    assert verdict.figures["forged_stops_refused"] == 1


def test_a_worker_that_died_unprompted_did_not_survive():
    # paused and resumed (SIGSTOP 19, SIGCONT 18) is not an end the runner chose
    died = [WorkerExit("w1", None, ()), WorkerExit("w3", 1, (19, 18))]
    assert invariants(poison(exits=died)) == {"survived"}


def test_a_poisoned_queue_left_non_empty_or_dead_lettered_did_not_drain():
    assert invariants(poison(queue_depths={"HintQueue": 0, "control:w1": 2})) == {"drained"}
    assert invariants(poison(dead_lettered=1)) == {"drained"}


def test_an_applied_forged_stop_is_reported():
    applied = {"s": [StopOutcome(2, False, 100.2), StopOutcome(2, True, 100.3)]}
    assert invariants(poison(stop_outcomes=applied)) == {"forged_stop"}
    assert invariants(poison(stop_outcomes={"s": [StopOutcome(2, True, None)]})) == {
        "forged_stop"
    }


def test_a_legitimate_stop_before_a_restart_is_not_the_forged_one():
    # GIVEN s STOPPED for real at epoch 1 (applied), re-STARTed and taken at epoch 2, then a
    # forged STOP at epoch 2 refused: the earlier STOP answers another command
    history = {"s": [StopOutcome(1, True, 40.0), StopOutcome(2, False, 100.2)]}
    verdict = poison(stop_outcomes=history)
    assert verdict.ok, verdict.violations
    assert verdict.figures["forged_stops_refused"] == 1
    # AND a STOP of the forged epoch logged before the forgery was sent is not its answer
    early = {"s": [StopOutcome(2, True, 90.0), StopOutcome(2, False, 100.2)]}
    assert poison(stop_outcomes=early).ok


def test_forged_stops_nobody_processed_prove_nothing():
    assert invariants(poison(stop_outcomes={})) == {"forged_stop"}
    assert poison(forged=[], stop_outcomes={}).ok


# -- hostile-upstream track --------------------------------------------------------------------

MAX = hostile_frame_data("h", "max_size", 2, 400)


def local(data: str) -> dict:
    return {"sk": "L2-1-1", "message_data": data, "lease_epoch": 2}


def marker(data: str) -> dict:
    return {"sk": "L2-1-2", "data_sha256": hashlib.sha256(data.encode()).hexdigest()}


def hostile(**overrides) -> Verdict:
    base = dict(
        frames_stream="h",
        sessions=[Sess("h", 1, 100.0, 150.0, faults=("hostile:huge_seq:9:0",)),  # killed
                  Sess("h", 2, 151.0, faults=("drop", "hostile:huge_seq:1:0",
                                              "hostile:max_size:2:400"))],
        items=[item(1), local("hostile:h:huge_seq:1"), marker(MAX)],
        redirect_stream="r",
        redirect_record=Rec(DesiredState.STOPPED, "", stop_reason="upstream_refused"),
        redirects_served=3,
        trap_connections=0,
        breaker_stream="b",
        breaker_record=Rec(desired_state=DesiredState.FAILED, lease_owner=""),
        breaker_sessions=7,
        max_failures=5,
        disruptions=2,
    )  # fmt: skip
    base.update(overrides)
    verdict = Verdict()
    check_hostile(verdict, **base)
    return verdict


def test_a_clean_hostile_history_passes():
    # the frame sent to the killed session (#9) may be lost; the open session's are stored,
    # one as its data under a local key, the maximum-size one as a marker of its digest
    verdict = hostile()
    assert verdict.ok, verdict.violations
    assert verdict.figures["hostile_frames_checked"] == 2


def test_a_hostile_frame_missing_from_a_live_session_is_lost():
    assert invariants(hostile(items=[item(1), marker(MAX)])) == {"hostile_lost"}
    assert invariants(hostile(items=[item(1), local("hostile:h:huge_seq:1")])) == {"hostile_lost"}


def test_no_hostile_frame_reaching_a_live_session_proves_nothing():
    killed = [Sess("h", 1, 100.0, 150.0, faults=("hostile:huge_seq:9:0",))]
    assert invariants(hostile(sessions=killed)) == {"hostile_lost"}
    # ... unless the runner found them stored while their session was still open (a hand-off
    # after that check leaves none open at the end)
    assert hostile(sessions=killed, verified_open=2).ok


def test_a_redirect_not_refused_or_reaching_its_target_is_reported():
    wrong = Rec(DesiredState.STOPPED, "", stop_reason="user")
    assert invariants(hostile(redirect_record=wrong)) == {"refused"}
    assert invariants(hostile(trap_connections=1)) == {"refused"}
    assert invariants(hostile(redirects_served=0)) == {"refused"}


def test_the_breaker_stream_must_end_failed_within_its_bound():
    assert invariants(hostile(breaker_record=Rec())) == {"breaker"}
    assert invariants(hostile(breaker_sessions=8)) == {"breaker"}


def test_the_looping_streams_must_end_failed_within_the_same_bound():
    failed = Rec(desired_state=DesiredState.FAILED, lease_owner="")
    ok = {"creep": (failed, 7), "trickle": (failed, 3)}
    assert hostile(looping=ok).ok
    # a loop the breaker never stopped: still STARTED, or FAILED after too many sessions
    assert invariants(hostile(looping={**ok, "creep": (Rec(), 40)})) == {"breaker"}
    assert invariants(hostile(looping={**ok, "trickle": (failed, 8)})) == {"breaker"}


def test_an_unexplained_overlap_names_what_the_logs_need_to_be_read_against():
    # GIVEN a giver's session lingering 5 s after its hand-off's logged end (not explained)
    lingering = [Sess("s", 1, 100.0, 205.0), Sess("s", 2, 200.0)]
    announced = PlannedHandoff("s", epoch=1, prepared_at=199.8, ended_at=200.2)
    # WHEN it is reported
    verdict = check(sessions=lingering, handoffs=[announced], handoff_grace_seconds=0.5)
    (violation,) = (v.detail for v in verdict.violations)
    # THEN the report carries both sessions' times as the worker logs show them (UTC) and
    # the stream's hand-off windows, so the run can be read after its directory is gone
    assert "#1 00:01:40.000-00:03:25.000" in violation
    assert "#2 00:03:20.000--" in violation
    assert "e1 PREPARE 00:03:19.800 end 00:03:20.200" in violation
    assert "pauses: none" in violation


def test_an_abandoned_prepared_session_may_overlap_the_next_owner_within_the_takers_bound():
    # GIVEN a giver's session (1) that self-fenced mid-hand-off, the taker's prepared session
    # (2) opened after the PREPARE, and the next owner's session (3) once the giver's lease
    # was over, while the taker still waited for a COMMIT that could not come
    sessions = [Sess("s", 1, 100.0, 200.6), Sess("s", 2, 200.2, 206.5), Sess("s", 3, 203.0)]
    fell_back = PlannedHandoff("s", epoch=1, prepared_at=200.0, ended_at=200.6,
                               decision="ended_fenced")  # fmt: skip
    # WHEN the taker's session closed within its bound (twice the prepare bound, plus a close)
    verdict = check(sessions=sessions, handoffs=[fell_back], handoff_grace_seconds=8.0)
    # THEN both overlaps are the planned hand-off's, not a split brain
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 2
    # a taker whose hand-off decided a transfer may own the stream: a third session is not
    # excused
    transferred = replace(fell_back, decision="transfer")
    assert invariants(check(sessions=sessions, handoffs=[transferred],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
    # nor is a taker's session open past its bound
    late = [*sessions[:1], Sess("s", 2, 200.2, 209.0), sessions[2]]
    assert invariants(check(sessions=late, handoffs=[fell_back],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
    # nor a third session when the second was no hand-off's taker
    assert invariants(check(sessions=sessions, handoffs=[], handoff_grace_seconds=8.0)) == {
        "overlap"
    }


def test_a_prepared_session_of_a_taker_paused_mid_hand_off_may_overlap_until_it_self_fences():
    # GIVEN (chaos-010) a giver SIGKILLed right after its PREPARE (1), the taker's prepared
    # session (2), the next owner's session (3), and the taker SIGSTOPped for 8.9 s from 3.5 s
    # after its session opened: its wait for a COMMIT runs no timer while it is stopped
    sessions = [Sess("s", 1, 100.0, 203.0), Sess("s", 2, 202.84, 213.08), Sess("s", 3, 203.2)]
    killed = PlannedHandoff("s", epoch=2, prepared_at=202.75, taker="w1")
    paused_taker = [Pause("w1", 206.3, 215.2)]
    # WHEN checked with the taker's pause: THEN both overlaps are the hand-off's
    verdict = check(sessions=sessions, handoffs=[killed], pauses=paused_taker,
                    handoff_grace_seconds=8.0)  # fmt: skip
    assert verdict.ok, verdict.violations
    # another worker's pause explains nothing
    assert invariants(check(sessions=sessions, handoffs=[killed],
                            pauses=[Pause("w2", 206.3, 215.2)],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
    # nor does a pause that began after the taker's own bound had passed
    assert invariants(check(sessions=sessions, handoffs=[killed],
                            pauses=[Pause("w1", 211.5, 215.2)],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
    # nor a session that stayed open past the resume and the self-fence
    late = [*sessions[:1], Sess("s", 2, 202.84, 219.0), sessions[2]]
    assert invariants(check(sessions=late, handoffs=[killed], pauses=paused_taker,
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip


def test_a_transfer_slowed_by_throttling_overlaps_until_the_takers_bound():
    # GIVEN (seed 20240601, chaos-002) a giver that decided a transfer at 38.227 whose
    # throttled transfer write kept its session (1) open until 45.032, and the taker's
    # prepared session (2), abandoned for want of a COMMIT at 41.226
    # (and the taker's own session (3) once it acquired the stream later)
    sessions = [Sess("s", 1, 37.342, 45.032), Sess("s", 2, 37.879, 41.226), Sess("s", 3, 45.738)]
    transfer = PlannedHandoff("s", epoch=4, prepared_at=37.762, ended_at=38.227,
                              decision="transfer")  # fmt: skip
    # WHEN checked: THEN the pair is the planned hand-off's (the taker's bound holds it)
    verdict = check(sessions=sessions, handoffs=[transfer], handoff_grace_seconds=8.0)
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    # a fallback closes the giver's session at once: the same overlap is a violation there
    fallback = replace(transfer, decision="no_ready")
    assert invariants(check(sessions=sessions, handoffs=[fallback],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
    # and a taker's session open together with the giver past its bound is one too
    late = [Sess("s", 1, 37.342, 47.0), Sess("s", 2, 37.879, 46.5), Sess("s", 3, 47.5)]
    assert invariants(check(sessions=late, handoffs=[transfer],
                            handoff_grace_seconds=8.0)) == {"overlap"}  # fmt: skip
