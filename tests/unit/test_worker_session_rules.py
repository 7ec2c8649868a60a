"""Session decisions: exit plans, closes, backoff, hint triage (the worker lease's timing is
wsfleet.lease.WorkerLeaseTimer, tested with the liveness task in test_worker_liveness.py)."""

from __future__ import annotations

import random

import pytest

from wsfleet.hints import Hint
from wsfleet_worker.credentials import refresh_due
from wsfleet_worker.session_rules import (
    CloseAction,
    ErrorCategory,
    ExitReason,
    FinalWrite,
    IncompleteMessage,
    ReconnectPolicy,
    close_action,
    exit_plan,
    is_credential_refusal,
    is_empty_close,
    is_poison,
    last_error_text,
    supersedes,
    triage_hints,
)


# ---------------------------------------------------------------- exit plans
def test_fenced_sessions_abort_and_write_nothing():
    plan = exit_plan(ExitReason.FENCED)
    assert (plan.final_write, plan.flush, plan.abort, plan.hint) == (
        FinalWrite.NONE, False, True, False
    )


def test_stopped_sessions_flush_then_release_without_hint():
    plan = exit_plan(ExitReason.STOPPED)
    assert (plan.final_write, plan.flush, plan.hint, plan.close_code) == (
        FinalWrite.RELEASE, True, False, 1000
    )


def test_shutdown_flushes_releases_closes_1001_and_hints_a_peer():
    plan = exit_plan(ExitReason.SHUTDOWN)
    assert (plan.final_write, plan.flush, plan.hint, plan.close_code) == (
        FinalWrite.RELEASE, True, True, 1001
    )


def test_upstream_end_marks_the_connection_stopped():
    plan = exit_plan(ExitReason.UPSTREAM_CLOSED)
    assert (plan.final_write, plan.stop_reason, plan.hint) == (
        FinalWrite.MARK_STOPPED, "upstream_closed", False
    )


def test_a_crashed_session_hands_its_connection_over():
    plan = exit_plan(ExitReason.CRASHED)
    assert (plan.final_write, plan.hint) == (FinalWrite.RELEASE, True)


def test_every_reason_has_a_plan():
    for reason in ExitReason:
        assert exit_plan(reason) is not None


def test_first_reason_wins_except_fencing_which_always_wins():
    assert supersedes(ExitReason.STOPPED, None)
    assert not supersedes(ExitReason.SHUTDOWN, ExitReason.STOPPED)
    assert supersedes(ExitReason.FENCED, ExitReason.SHUTDOWN)
    assert not supersedes(ExitReason.FENCED, ExitReason.FENCED)
    assert not supersedes(ExitReason.STOPPED, ExitReason.FENCED)


# ---------------------------------------------------------------- upstream closes
@pytest.mark.parametrize("code", [1000, 1001, 1011, 1006, 4000, None])
def test_every_upstream_close_reconnects_by_default(code):
    assert close_action(code) is CloseAction.RECONNECT


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (1000, CloseAction.END),
        (1001, CloseAction.END),
        (1011, CloseAction.RECONNECT),
        (4000, CloseAction.RECONNECT),
        (None, CloseAction.RECONNECT),
    ],
)
def test_normal_close_final_makes_only_a_normal_close_end_the_stream(code, action):
    assert close_action(code, final_normal_close=True) is action


@pytest.mark.parametrize(
    ("code", "frames", "counted"),
    [(1000, 0, True), (1001, 0, True), (1000, 1, False), (1011, 0, False), (None, 0, False)],
)
def test_only_a_normal_close_before_any_frame_counts_towards_the_breaker(code, frames, counted):
    assert is_empty_close(code, frames) is counted


def test_reconnect_delays_grow_are_jittered_and_reset():
    policy = ReconnectPolicy(initial=0.1, factor=2.0, cap=1.0, rng=random.Random(1))
    delays = [policy.next_delay() for _ in range(8)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert policy.attempts == 8
    policy.reset()
    assert policy.attempts == 0
    assert policy.next_delay() <= 0.1


def test_only_a_connection_that_stayed_open_resets_the_backoff():
    # GIVEN a policy several attempts in
    policy = ReconnectPolicy(initial=0.1, cap=10.0, stable_seconds=10.0, rng=random.Random(1))
    for _ in range(4):
        policy.next_delay()
    # WHEN connections end after a moment (whatever they received)
    policy.connection_ended(0.05)
    policy.connection_ended(9.99)
    # THEN the backoff keeps growing
    assert policy.attempts == 4
    # WHEN one stayed open the stable time
    policy.connection_ended(10.0)
    # THEN the next trouble starts from the smallest delay
    assert policy.attempts == 0


# ---------------------------------------------------------------- incomplete messages
def test_an_incomplete_message_is_overdue_its_timeout_after_its_first_byte_however_it_trickles():
    message = IncompleteMessage(timeout=30.0)
    assert message.deadline is None and not message.overdue(10**6)
    message.observe(100.0, True)
    for now in (101.0, 110.0, 129.0):  # more bytes, still incomplete: the clock keeps running
        message.observe(now, True)
    assert message.deadline == 130.0
    assert not message.overdue(129.99) and message.overdue(130.0)


def test_a_completed_message_clears_the_clock_and_the_next_one_starts_its_own():
    message = IncompleteMessage(timeout=30.0)
    message.observe(100.0, True)
    message.observe(120.0, False)
    assert message.deadline is None and not message.overdue(500.0)
    message.observe(200.0, True)
    assert message.deadline == 230.0


def test_no_timeout_means_never_overdue():
    message = IncompleteMessage(timeout=None)
    message.observe(0.0, True)
    assert message.deadline is None and not message.overdue(10.0**9)


def test_the_message_timeout_close_counts_towards_the_breaker_and_names_itself():
    assert is_poison(False, 1008, worker_initiated=True)
    assert not is_poison(False, 1008, worker_initiated=False)
    assert last_error_text(ErrorCategory.CLOSED_BY_WORKER, 1008, "message timeout") == (
        "closed_by_worker (code 1008: message timeout)"
    )


# ---------------------------------------------------------------- hint triage
def body(pk: str) -> str:
    return Hint(pk).body()


def test_triage_acquires_new_hints_and_drops_duplicates_and_running():
    triage = triage_hints(
        [("r1", body("CONN#a")), ("r2", body("CONN#b")), ("r3", body("CONN#a")),
         ("r4", body("CONN#run"))],
        running={"CONN#run"},
        free_slots=10,
    )
    assert [(h.pk, r) for h, r in triage.acquire] == [("CONN#a", "r1"), ("CONN#b", "r2")]
    assert triage.drop == ["r3", "r4"]
    assert triage.release == []


def test_unparseable_hints_are_counted_and_dropped():
    triage = triage_hints(
        [("r1", "not json"), ("r2", '{"pk": "WORKER#x"}'), ("r3", "[]")],
        running=set(),
        free_slots=5,
    )
    assert (len(triage.invalid), triage.drop, triage.acquire) == (3, ["r1", "r2", "r3"], [])


def test_hints_over_capacity_are_released_for_a_peer():
    triage = triage_hints(
        [("r1", body("CONN#a")), ("r2", body("CONN#b")), ("r3", body("CONN#c"))],
        running=set(),
        free_slots=1,
    )
    assert [h.pk for h, _ in triage.acquire] == ["CONN#a"]
    assert triage.release == ["r2", "r3"]


def test_a_hostile_hint_is_dropped_with_an_excerpt_not_the_whole_body():
    # GIVEN a body that used to raise RecursionError out of Hint.parse and end the worker
    body = "[" * 5000
    # WHEN a batch holding it and a good hint is triaged
    triage = triage_hints([("r1", body), ("r2", Hint("CONN#a").body())], set(), free_slots=5)
    # THEN the poison is dropped, the good hint is still acted on, and the reason is short
    assert triage.drop == ["r1"]
    assert [receipt for _, receipt in triage.acquire] == ["r2"]
    assert len(triage.invalid) == 1 and len(triage.invalid[0]) < 200
# ------------------------------------------------------------------ last_error and the breaker


@pytest.mark.parametrize(
    ("category", "code", "reason", "expected"),
    [
        (ErrorCategory.CONNECT_FAILED, None, "", "connect_failed"),
        (ErrorCategory.HANDSHAKE_REJECTED, None, "", "handshake_rejected"),
        (ErrorCategory.CONNECTION_LOST, None, "", "connection_lost"),
        (ErrorCategory.UPSTREAM_CLOSED, 1011, "its words", "upstream_closed (code 1011)"),
        (ErrorCategory.CLOSED_BY_WORKER, 1009, "", "closed_by_worker (code 1009: message too big)"),
        (ErrorCategory.CLOSED_BY_WORKER, 1009, "over size limit",
         "closed_by_worker (code 1009: over size limit)"),
        (ErrorCategory.CLOSED_BY_WORKER, 4000, "", "closed_by_worker (code 4000)"),
    ],
)
def test_last_error_text_is_a_category_and_only_the_workers_own_close(
    category, code, reason, expected
):
    assert last_error_text(category, code, reason) == expected


@pytest.mark.parametrize(
    ("crashed", "code", "by_worker", "expected"),
    [
        (True, None, False, True),  # a session crash always counts
        (False, 1009, True, True),
        (False, 1007, True, True),
        (False, 1002, True, True),
        (False, 1009, False, False),  # the upstream sent 1009: its problem, keep retrying
        (False, 1011, True, False),  # our own internal error is not the input's fault
        (False, None, False, False),  # connect failure / outage: never counted
    ],
)
def test_is_poison(crashed, code, by_worker, expected):
    assert is_poison(crashed, code, worker_initiated=by_worker) is expected


# ---------------------------------------------------------------- credential refusals
@pytest.mark.parametrize(("status", "refusal"), [(401, True), (403, True), (404, False),
                                                 (429, False), (503, False)])
def test_only_401_and_403_make_the_worker_read_its_credential_again(status, refusal):
    assert is_credential_refusal(status) is refusal


def test_a_refused_credential_is_read_again_at_most_once_per_interval():
    assert refresh_due(None, 0.0, 30.0)
    assert not refresh_due(100.0, 129.0, 30.0)
    assert refresh_due(100.0, 130.0, 30.0)
