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
    Adoption,
    ForgedStop,
    Pause,
    PlannedHandoff,
    Sample,
    SocketOpen,
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
    """A simulator session, with who opened it (``by``, ``epoch``, ``prepared``): ``check``
    logs its socket-open line unless the test gives its own."""

    stream_id: str
    session_id: int
    opened_at: float
    closed_at: float | None = None
    gap: int = 0
    faults: tuple[str, ...] = field(default_factory=tuple)
    by: str = "w0"
    epoch: int = 1
    prepared: bool = False
    port: int = 0  # the client port (0: 40000 + session_id)

    @property
    def peer(self) -> str:
        return f"127.0.0.1:{self.port or 40000 + self.session_id}"


def opened(session: Sess, *, at: float | None = None) -> SocketOpen:
    """The line ``session.by`` logged before its handshake (1 ms before the upstream saw it)."""
    return SocketOpen(session.by, session.stream_id, session.epoch, session.peer,
                      session.opened_at - 0.001 if at is None else at,
                      prepared=session.prepared)  # fmt: skip


def item(seq: int, epoch: int = 2, received: float = 500.0, data: str | None = None) -> dict:
    return {"seq": seq, "sk": f"{seq:020d}", "message_data": data or f"s:{seq}",
            "lease_epoch": epoch, "received_at_ms": int(received * 1000)}  # fmt: skip


def check(**overrides):
    base = dict(
        expected_states={"s": "STARTED"},
        final_records={"s": Rec()},
        live_workers={"w1"},
        worker_records={"w1": LIVE_W1},
        sessions=[Sess("s", 1, 100.0, 200.0), Sess("s", 2, 200.5, by="w1", epoch=2)],
        items={"s": [item(1, 1, 150.0), item(2, 2, 300.0), item(3, 2, 301.0)]},
        samples=[Sample(150.0, "s", 1, "w0", 0, "STARTED"),
                 Sample(250.0, "s", 2, "w1", 2, "STARTED")],
        pauses=[],
        resume_grace_seconds=3.0,
        end_time=END,
    )  # fmt: skip
    base.update(overrides)
    base.setdefault("opens", [opened(s) for s in base["sessions"]])
    return check_history(**base)


def check_8s(**overrides):
    """:func:`check` with the chaos run's taker bound (twice the prepare bound, plus a close)."""
    return check(handoff_grace_seconds=8.0, **overrides)


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


#: A make-before-break pair: the giver w0's session (1, epoch 1) and the prepared session (2)
#: of the taker w1 its PREPARE named, open together for 0.3 s.
GIVER = Sess("s", 1, 100.0, 200.3)
TAKER = Sess("s", 2, 200.0, by="w1", prepared=True)
ANNOUNCED = PlannedHandoff("s", epoch=1, prepared_at=199.8, ended_at=200.25, decision="transfer",
                           taker="w1", giver="w0")  # fmt: skip


def test_a_planned_handoffs_overlap_is_told_from_a_split_brain():
    # GIVEN the giver's session and the taker's prepared one open together for 0.3 s
    mbb = [GIVER, TAKER]
    # WHEN the giver announced the hand-off (PREPARE) to that taker before the taker's
    # session opened, and the two closed within the hand-off's end plus a close: planned
    verdict = check(sessions=mbb, handoffs=[ANNOUNCED], handoff_grace_seconds=0.5)
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    assert verdict.figures["planned_handoffs_announced"] == 1
    # the same overlap without the announcement is a split brain
    assert invariants(check(sessions=mbb)) == {"overlap"}
    # announced only after the second session had opened: it does not explain it
    late = replace(ANNOUNCED, prepared_at=200.1)
    assert invariants(check(sessions=mbb, handoffs=[late], handoff_grace_seconds=0.5)) == {
        "overlap"
    }
    # a hand-off of another stream, or of another epoch, explains nothing here
    for other in (replace(ANNOUNCED, stream_id="t"), replace(ANNOUNCED, epoch=2)):
        assert invariants(check(sessions=mbb, handoffs=[other], handoff_grace_seconds=0.5)) == {
            "overlap"
        }


def test_two_workers_sessions_overlapping_are_a_split_brain_unless_they_are_the_handoffs_pair():
    # GIVEN the same hand-off (w0 -> w1) announced, and the overlap within its window
    def judged(giver: Sess, taker: Sess) -> set[str]:
        return invariants(check(sessions=[giver, taker], handoffs=[ANNOUNCED],
                                handoff_grace_seconds=0.5))  # fmt: skip

    assert judged(GIVER, TAKER) == set()
    # WHEN the newer session is another worker's (w2: not the taker the PREPARE named)
    # THEN it is a split brain
    assert judged(GIVER, replace(TAKER, by="w2")) == {"overlap"}
    # nor may the taker open an owner's session (not prepared) beside the giver's
    assert judged(GIVER, replace(TAKER, prepared=False)) == {"overlap"}
    # nor is the older session anyone's but the giver's (the prepared session may meet only
    # a later epoch's owner: the giver's lease is over then)
    assert judged(replace(GIVER, by="w3"), TAKER) == {"overlap"}


def test_a_planned_overlap_that_outlasts_its_handoff_is_a_violation():
    # the giver's session stays open 5 s after its fallback: not the planned window, and the
    # taker's prepared session, within its own bound, is no excuse for the giver's
    lingering = [replace(GIVER, closed_at=205.0), TAKER]
    fell_back = replace(ANNOUNCED, ended_at=200.2, decision="no_ready")
    verdict = check_8s(sessions=lingering, handoffs=[fell_back])
    assert invariants(verdict) == {"overlap"}
    # a giver that died mid-hand-off (end unknown): bounded from the PREPARE instead
    unknown = replace(ANNOUNCED, ended_at=None, decision=None)
    assert check(sessions=[replace(GIVER, closed_at=201.0), TAKER],
                 handoffs=[unknown], handoff_grace_seconds=1.5).ok  # fmt: skip
    assert not check(sessions=lingering, handoffs=[unknown], handoff_grace_seconds=1.5).ok


def test_a_third_workers_session_during_a_handoff_is_a_split_brain():
    # GIVEN the hand-off's pair, and w2's owner session opened beside the giver's
    three = [GIVER, TAKER, Sess("s", 3, 200.1, 200.2, by="w2", epoch=2)]
    verdict = check(sessions=three, handoffs=[ANNOUNCED], handoff_grace_seconds=0.5)
    # THEN the pair is planned; w2's beside the prepared session (which owns nothing, within
    # its bound) is allowed; w2's beside the giver's owner session is a split brain
    assert invariants(verdict) == {"overlap"}
    assert verdict.figures["overlaps"] == 3
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    assert verdict.figures["overlaps_of_prepared_sessions"] == 1
    (violation,) = verdict.violations
    assert "sessions 1 and 3" in violation.detail


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
    brief = [Sess("s", 1, 100.0, 200.05), Sess("s", 2, 200.0, by="w1", epoch=2)]
    assert invariants(check(sessions=brief)) == {"overlap"}
    assert check(sessions=brief).figures["overlaps"] == 1
    touching = [Sess("s", 1, 100.0, 200.0), Sess("s", 2, 200.0, by="w1", epoch=2)]
    assert check(sessions=touching).ok
    long = [Sess("s", 1, 100.0, 230.0), Sess("s", 2, 200.0, by="w1", epoch=2)]
    assert invariants(check(sessions=long)) == {"overlap"}
    # the older session's worker (w0) was SIGSTOPped before the newer one opened, and its
    # session closed within the grace after it resumed: a zombie, not a split brain
    paused = [Pause("w0", 190.0, 228.0)]
    verdict = check(sessions=long, pauses=paused)
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_paused_owners"] == 1
    # an incarnation of the paused process (started over after a lost lease) is that process
    reborn = [replace(long[0], by="w0+2"), long[1]]
    assert check(sessions=reborn, pauses=paused).ok
    # closed beyond the bound (resumed 220.0 + 3.0 grace < 230.0): a split brain
    too_late = [Pause("w0", 190.0, 220.0)]
    assert invariants(check(sessions=long, pauses=too_late)) == {"overlap"}
    # another worker's pause explains nothing: not the newer session's worker's
    assert invariants(check(sessions=long, pauses=[Pause("w1", 190.0, 228.0)])) == {"overlap"}
    # nor a third worker's
    assert invariants(check(sessions=long, pauses=[Pause("w7", 190.0, 228.0)])) == {"overlap"}


def test_every_session_is_attributed_to_the_worker_that_logged_its_socket_first():
    # GIVEN w0's session (1) and then w1's (2) from the same client port (used again), and
    # w2's session (3) opened beside w1's while w1 was SIGSTOPped
    one = Sess("s", 1, 100.0, 150.0)
    two = Sess("s", 2, 200.0, 215.0, by="w1", epoch=2, port=40001)
    three = Sess("s", 3, 210.0, by="w2", epoch=3)
    sessions, opens = [one, two, three], [opened(one), opened(two), opened(three)]
    paused = [Pause("w1", 205.0, 214.0)]
    # WHEN each session is joined with the line its worker logged last for that address
    # before the session opened: THEN session 2 is w1's, and w1's pause explains the overlap
    verdict = check(sessions=sessions, opens=opens, pauses=paused)
    assert verdict.ok, verdict.violations
    assert verdict.figures["sessions_attributed"] == 3
    assert verdict.figures["overlaps_of_paused_owners"] == 1
    # were w1's line logged only after its session opened (a worker logs it before its
    # handshake), session 2 would be w0's (the earlier line): unexplained, w0 was not paused
    late = [opened(one), opened(two, at=200.5), opened(three)]
    verdict = check(sessions=sessions, opens=late, pauses=paused)
    assert invariants(verdict) == {"overlap"}
    assert "by w0 e1" in verdict.violations[0].detail
    # a session no line names at all is reported, and so is any overlap of it
    verdict = check(sessions=sessions, opens=[opened(three)], pauses=paused)
    assert invariants(verdict) == {"attributed", "overlap"}
    assert verdict.figures["overlaps_unattributed"] == 1
    # a line for another stream from the same address names nobody here
    foreign = [replace(opened(one), stream_id="t"), *opens[1:]]
    assert invariants(check(sessions=sessions, opens=foreign, pauses=paused)) == {"attributed"}


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
    lingering = [replace(GIVER, closed_at=205.0), TAKER]
    fell_back = replace(ANNOUNCED, ended_at=200.2, decision="no_ready")
    # WHEN it is reported
    verdict = check(sessions=lingering, handoffs=[fell_back], handoff_grace_seconds=0.5)
    (violation,) = (v.detail for v in verdict.violations)
    # THEN the report carries both sessions' times as the worker logs show them (UTC), their
    # client addresses and who opened them, and the stream's hand-off windows, so the run can
    # be read after its directory is gone
    assert "#1 00:01:40.000-00:03:25.000" in violation
    assert "peer=127.0.0.1:40001 by w0 e1" in violation
    assert "#2 00:03:20.000--" in violation
    assert "by w1 e1 prepared" in violation
    assert "e1 w0->w1 PREPARE 00:03:19.800 end 00:03:20.200 no_ready" in violation
    assert "pauses: none" in violation


def test_an_abandoned_prepared_session_may_overlap_the_next_owner_within_the_takers_bound():
    # GIVEN a giver's session (1, w0) that self-fenced mid-hand-off, the taker's prepared
    # session (2, w1) opened after the PREPARE, and the next owner's session (3, w2) once the
    # giver's lease was over, while the taker still waited for a COMMIT that could not come
    sessions = [Sess("s", 1, 100.0, 200.6), Sess("s", 2, 200.2, 206.5, by="w1", prepared=True),
                Sess("s", 3, 203.0, by="w2", epoch=2)]  # fmt: skip
    fell_back = PlannedHandoff("s", epoch=1, prepared_at=200.0, ended_at=200.6,
                               decision="ended_fenced", taker="w1", giver="w0")  # fmt: skip
    # WHEN the taker's session closed within its bound (twice the prepare bound, plus a close)
    verdict = check_8s(sessions=sessions, handoffs=[fell_back])
    # THEN the pair is the hand-off's and the prepared session beside the next owner's is
    # allowed: it owned nothing
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    assert verdict.figures["overlaps_of_prepared_sessions"] == 1
    # once its worker adopted it, it is an owner's: beside another owner's, a split brain
    adopted = [Adoption("w1", "s", 2, 204.0)]
    assert invariants(check_8s(sessions=sessions, handoffs=[fell_back],
                               adoptions=adopted)) == {"overlap"}  # fmt: skip
    # (an adoption by another worker, or outside the session, says nothing of this one)
    for other in (Adoption("w2", "s", 2, 204.0), Adoption("w1", "s", 2, 207.0)):
        assert check_8s(sessions=sessions, handoffs=[fell_back], adoptions=[other]).ok  # fmt: skip
    # nor may a taker's session stay open past its bound
    late = [*sessions[:1], replace(sessions[1], closed_at=209.0), sessions[2]]
    assert invariants(check_8s(sessions=late, handoffs=[fell_back])) == {"overlap"}  # fmt: skip
    # nor does a prepared session of no hand-off naming its worker explain anything
    for handoffs in ([], [replace(fell_back, taker="w5")]):
        assert invariants(check_8s(sessions=sessions, handoffs=handoffs)) == {"overlap"}


def test_a_prepared_session_of_a_taker_paused_mid_hand_off_may_overlap_until_it_self_fences():
    # GIVEN (chaos-010) a giver (w0) SIGKILLed right after its PREPARE (1), the taker's (w1)
    # prepared session (2), the next owner's (w2) session (3), and the taker SIGSTOPped for
    # 8.9 s from 3.5 s after its session opened: its wait for a COMMIT runs no timer meanwhile
    sessions = [Sess("s", 1, 100.0, 203.0, epoch=2),
                Sess("s", 2, 202.84, 213.08, by="w1", epoch=2, prepared=True),
                Sess("s", 3, 203.2, by="w2", epoch=3)]  # fmt: skip
    killed = PlannedHandoff("s", epoch=2, prepared_at=202.75, taker="w1", giver="w0")
    paused_taker = [Pause("w1", 206.3, 215.2)]
    # WHEN checked with the taker's pause: THEN both overlaps are explained
    verdict = check_8s(sessions=sessions, handoffs=[killed], pauses=paused_taker)  # fmt: skip
    assert verdict.ok, verdict.violations
    # another worker's pause explains nothing (the next owner's, w2, included)
    for other in ("w2", "w9"):
        assert invariants(check_8s(sessions=sessions, handoffs=[killed],
                                pauses=[Pause(other, 206.3, 215.2)])) == {"overlap"}  # fmt: skip
    # nor does a pause that began after the taker's own bound had passed
    assert invariants(check_8s(sessions=sessions, handoffs=[killed],
                            pauses=[Pause("w1", 211.5, 215.2)])) == {"overlap"}  # fmt: skip
    # nor a session that stayed open past the resume and the self-fence
    late = [*sessions[:1], replace(sessions[1], closed_at=219.0), sessions[2]]
    assert invariants(check_8s(sessions=late, handoffs=[killed],
                               pauses=paused_taker)) == {"overlap"}  # fmt: skip


def test_a_transfer_slowed_by_throttling_overlaps_until_the_takers_bound():
    # GIVEN (seed 20240601, chaos-002) a giver (w0) that decided a transfer at 38.227 whose
    # throttled transfer write kept its session (1) open until 45.032, and the taker's (w1)
    # prepared session (2), abandoned for want of a COMMIT at 41.226 (and the taker's own
    # session (3) once it acquired the stream later)
    sessions = [Sess("s", 1, 37.342, 45.032, epoch=4),
                Sess("s", 2, 37.879, 41.226, by="w1", epoch=4, prepared=True),
                Sess("s", 3, 45.738, by="w1", epoch=5)]  # fmt: skip
    transfer = PlannedHandoff("s", epoch=4, prepared_at=37.762, ended_at=38.227,
                              decision="transfer", taker="w1", giver="w0")  # fmt: skip
    # WHEN checked: THEN the pair is the planned hand-off's (the taker's bound holds it)
    verdict = check_8s(sessions=sessions, handoffs=[transfer])
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 1
    # a fallback closes the giver's session at once: the same overlap is a violation there
    fallback = replace(transfer, decision="no_ready")
    assert invariants(check_8s(sessions=sessions, handoffs=[fallback])) == {"overlap"}  # fmt: skip
    # and a taker's session open together with the giver past its bound is one too
    late = [replace(sessions[0], closed_at=47.0), replace(sessions[1], closed_at=46.5),
            replace(sessions[2], opened_at=47.5)]  # fmt: skip
    assert invariants(check_8s(sessions=late, handoffs=[transfer])) == {"overlap"}  # fmt: skip


def test_an_adopted_session_is_its_takers_as_an_owner_and_may_give_the_stream_on():
    # GIVEN (seed 20240601, chaos-000) w0's prepared session (2) of a hand-off from w3 (1),
    # adopted under epoch 2, and later the giver of a hand-off of epoch 2 to w4 (3)
    sessions = [Sess("s", 1, 100.0, 125.3, by="w3"),
                Sess("s", 2, 125.0, 135.4, by="w0", prepared=True),
                Sess("s", 3, 134.0, by="w4", epoch=2, prepared=True)]  # fmt: skip
    first = PlannedHandoff("s", epoch=1, prepared_at=124.9, ended_at=125.2, decision="transfer",
                           taker="w0", giver="w3")  # fmt: skip
    second = PlannedHandoff("s", epoch=2, prepared_at=133.9, ended_at=134.1,
                            decision="transfer", taker="w4", giver="w0")  # fmt: skip
    adopted = [Adoption("w0", "s", 2, 125.4)]
    # WHEN checked with w0's adoption: THEN both pairs are planned hand-offs
    verdict = check_8s(sessions=sessions, handoffs=[first, second], adoptions=adopted,
                    final_records={"s": Rec(lease_owner="w4")},
                    worker_records={"w4": LIVE_W1}, live_workers={"w4"})  # fmt: skip
    assert verdict.ok, verdict.violations
    assert verdict.figures["overlaps_of_planned_handoffs"] == 2
    # without the adoption, session 2 is still only a prepared one: it gives nothing on
    verdict = check_8s(sessions=sessions, handoffs=[first, second],
                    final_records={"s": Rec(lease_owner="w4")},
                    worker_records={"w4": LIVE_W1}, live_workers={"w4"})  # fmt: skip
    assert invariants(verdict) == {"overlap"}
    # nor does an adoption logged only after the next hand-off's session opened
    late = [Adoption("w0", "s", 2, 134.5)]
    verdict = check_8s(sessions=sessions, handoffs=[first, second], adoptions=late,
                    final_records={"s": Rec(lease_owner="w4")},
                    worker_records={"w4": LIVE_W1}, live_workers={"w4"})  # fmt: skip
    assert invariants(verdict) == {"overlap"}


def test_a_handoffs_pair_stays_open_while_both_sides_are_paused_until_they_self_fence():
    # GIVEN (seed 20240601, chaos-000) a giver (w2+2) that decided a transfer, and was
    # SIGSTOPped in its transfer, and a taker (w4-r1) SIGSTOPped while it waited for the COMMIT:
    # neither runs a timer, and both sessions stay open until each resumed and self-fenced
    sessions = [Sess("s", 1, 108.784, 124.229, by="w2+2", epoch=4),
                Sess("s", 2, 110.645, 121.487, by="w4-r1", epoch=4, prepared=True),
                Sess("s", 3, 130.637, by="w2+3", epoch=5)]  # (the next owner's)  # fmt: skip
    transfer = PlannedHandoff("s", epoch=4, prepared_at=110.631, ended_at=111.334,
                              decision="transfer", taker="w4-r1", giver="w2+2")  # fmt: skip
    both = [Pause("w4-r1", 111.2, 118.6), Pause("w2", 112.7, 121.5)]

    def judged(pauses: list[Pause]) -> set[str]:
        return invariants(check_8s(sessions=sessions, handoffs=[transfer], pauses=pauses))

    # WHEN checked with the two pauses: THEN the pair is the hand-off's
    assert judged(both) == set()
    # the giver's pause alone already explains it (its session closed within its resume);
    # the taker's alone does too (its prepared session closed within its own)
    assert judged(both[1:]) == set() and judged(both[:1]) == set()
    # without them it is a pair that outlasted its hand-off
    assert judged([]) == {"overlap"}
    # another worker's pauses explain nothing, nor do pauses that began after each side's
    # own bound (the giver's close after its decision, the taker's bound)
    assert judged([Pause("w7", 111.2, 118.6), Pause("w8", 112.7, 121.5)]) == {"overlap"}
    assert judged([Pause("w4-r1", 118.7, 120.0), Pause("w2", 118.7, 121.5)]) == {"overlap"}
