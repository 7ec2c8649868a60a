"""Make-before-break's pure rules (docs/handoff.md sections 2-4): the mode, the giver's
step-4 decision and fallbacks, the taker's buffer and wait bounds, the two confirmations."""

from __future__ import annotations

import itertools

import pytest

from wsfleet.lease import (
    HandoffStep,
    commit_confirmed,
    giver_verdict,
    handoff_mode,
    overlap_ready,
    prepare_confirmed,
    prepared_resume_seq,
    taker_verdict,
)
from wsfleet.record import ConnectionRecord, DesiredState
from wsfleet.upstream_options import HandoffMode, parse_upstream_options


def test_overlap_only_with_a_usable_seq_and_unless_the_connection_says_break():
    for option, usable in itertools.product([None, *HandoffMode], [True, False]):
        expected = (
            HandoffMode.OVERLAP
            if usable and option is not HandoffMode.BREAK
            else HandoffMode.BREAK
        )
        assert handoff_mode(option, usable_seq=usable) is expected, (option, usable)


@pytest.mark.parametrize(
    ("durable", "first_seq", "ready"),
    [(0, 1, True), (40, 41, True), (40, 1, True), (40, 42, False), (0, 2, False)],
)
def test_overlap_ready_is_first_seq_at_most_durable_plus_one(durable, first_seq, ready):
    assert overlap_ready(durable, first_seq) is ready


@pytest.mark.parametrize(
    ("durable", "checkpoint", "resume"),
    [(40, 12, 40), (13, 12, 13), (12, 12, 13), (0, 12, 13), (0, 0, 1), (1, 0, 1)],
)
def test_a_prepared_session_resumes_at_the_givers_last_stored_frame(durable, checkpoint, resume):
    # A replaying upstream sends that frame at once: the taker's first numbered frame (its
    # READY) comes with the connect, not at the stream's next frame; never below the record's
    # own resume point
    assert prepared_resume_seq(durable, checkpoint) == resume
    if durable >= checkpoint:  # (a giver has stored at least its record's checkpoint)
        assert overlap_ready(durable, resume)  # that first frame overlaps what was stored


def giver(**changes):
    inputs = dict(durable=10, first_seq=None, declined=False, session_live=True,
                  deadline_ms=5_000, now_ms=1_000)
    inputs.update(changes)
    return giver_verdict(**inputs)


def test_giver_waits_for_ready_then_transfers_once_its_stored_frames_reach_the_takers():
    assert giver().step is HandoffStep.WAIT
    assert giver(first_seq=12).step is HandoffStep.WAIT  # 11 not stored yet: catch up
    assert giver(first_seq=12, durable=11).step is HandoffStep.TRANSFER
    assert giver(first_seq=3).step is HandoffStep.TRANSFER  # a replaying taker starts lower
    # the giver's session was cut when the taker's opened (cut_first), but the taker holds
    # everything above what the giver stored: still a transfer, nothing lost
    assert giver(first_seq=11, session_live=False).step is HandoffStep.TRANSFER


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"declined": True, "first_seq": 5}, "declined"),
        ({"session_live": False}, "giver_session_ended"),
        ({"session_live": False, "first_seq": 12}, "giver_session_ended"),  # cannot catch up
        ({"now_ms": 5_000}, "no_ready"),
        ({"now_ms": 9_000, "first_seq": 50}, "behind"),
    ],
)
def test_giver_fallbacks_break(changes, reason):
    verdict = giver(**changes)
    assert (verdict.step, verdict.reason) == (HandoffStep.BREAK, reason)


def taker(**changes):
    inputs = dict(buffered_frames=0, buffered_bytes=0, max_frames=100, max_bytes=1000,
                  deadline_ms=5_000, now_ms=0)
    inputs.update(changes)
    return taker_verdict(**inputs)


def test_taker_buffers_within_both_budgets_and_the_bound():
    assert taker(buffered_frames=99, buffered_bytes=999).step is HandoffStep.WAIT
    assert taker(buffered_frames=100).step is HandoffStep.DECLINE
    assert taker(buffered_bytes=1000).reason == "budget"
    assert (taker(now_ms=5_000).step, taker(now_ms=5_000).reason) == (
        HandoffStep.ABANDON, "no_commit")


def record(**changes):
    base = dict(pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="wss://x",
                lease_owner="g", lease_epoch=3)
    base.update(changes)
    return ConnectionRecord(**base)


@pytest.mark.parametrize(
    ("rec", "confirmed"),
    [
        (record(), True),
        (None, False),
        (record(lease_epoch=4), False),  # stale PREPARE
        (record(lease_owner="x"), False),  # forged giver
        (record(lease_owner=""), False),  # released meanwhile
        (record(pk="CONN#b"), False),
        (record(desired_state=DesiredState.STOPPED), False),
        (record(upstream=parse_upstream_options({"handoff": "break"}, secret_prefixes=())),
         False),
        (record(upstream=parse_upstream_options({"handoff": "overlap"}, secret_prefixes=())),
         True),
    ],
)
def test_a_prepare_is_confirmed_only_by_the_record(rec, confirmed):
    assert prepare_confirmed(rec, "CONN#a", 3, "g") is confirmed


@pytest.mark.parametrize(
    ("rec", "confirmed"),
    [
        (record(lease_owner="t", lease_epoch=4), True),
        (record(), False),  # the transfer did not land (a forged or early COMMIT)
        (record(lease_owner="t", lease_epoch=5), False),  # moved on since
        (record(lease_owner="t", lease_epoch=4, desired_state=DesiredState.STOPPED), False),
        (None, False),
    ],
)
def test_a_commit_is_confirmed_only_by_the_record(rec, confirmed):
    assert commit_confirmed(rec, "t", 4) is confirmed


def test_the_examples_in_the_hand_off_modules_hold():
    import doctest

    from wsfleet import control, lease
    from wsfleet_worker import handover

    for module in (lease, control, handover):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_a_drain_spreads_over_the_peers_room_and_breaks_what_does_not_fit():
    from wsfleet_worker.handover import Peer, drain_prepare_seconds, plan_drain

    peers = [Peer("a", "qa", 3), Peer("b", "qb", 1), Peer("c", "qc", 0)]
    plan = plan_drain([f"p{i}" for i in range(6)], peers)
    assert sorted(plan) == ["p0", "p1", "p2", "p3"]  # room for four: two break
    assert [p.worker_id for p in plan.values()].count("a") == 3
    assert plan_drain(["p0"], []) == {}
    # the giver's bound in a drain leaves half the drain to the break path
    assert drain_prepare_seconds(20, 3) == 3
    assert drain_prepare_seconds(4, 3) == 2
    assert drain_prepare_seconds(20, 0) == 0
