"""Chaos suite entry point: one seeded scenario over a local fleet (see chaos_runner).

Replay a failing run with the seed it prints: ``WSFLEET_CHAOS_SEED=<seed> make test`` or
``WSFLEET_CHAOS_SEED=<seed> .venv/bin/python -m pytest tests/chaos -m chaos -s``.
"""

from __future__ import annotations

import pytest
from chaos_runner import ChaosConfig, run_chaos

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]


def test_fleet_keeps_its_invariants_under_a_random_schedule_of_failures(tmp_path):
    # GIVEN a fleet of workers streaming ~50 upstreams, and a seeded schedule of crashes,
    # drains, paused owners, restarts, STOP/re-START and DynamoDB/SQS faults, poisoned queues
    # and forged STOPs, and hostile upstreams (bad seqs, maximum-size frames, a flood, a
    # refused redirect, a crash-looping stream)
    config = ChaosConfig.from_env(run_dir=tmp_path)

    # WHEN the schedule plays out and the fleet is healed
    report = run_chaos(config)

    # THEN every stream converged (the redirected one STOPPED, the crash-looping one FAILED),
    # nothing was lost or stored twice, fencing held, no worker died unbidden, poisoned queues
    # drained, no forged STOP applied and every hostile frame a live session got is stored
    print(report.summary())
    assert report.ok, (
        f"chaos invariants violated; replay with WSFLEET_CHAOS_SEED={config.seed}\n"
        + report.summary()
    )


def test_on_the_kinesis_sink_nothing_is_lost_and_every_duplicate_is_in_a_reported_window(
    tmp_path,
):
    # GIVEN the same fleet and schedule, its workers storing frames in a Kinesis stream
    # (at-least-once) with a small MESSAGE_REPLAY_WINDOW, and fewer streams to stay short
    config = ChaosConfig.from_env(run_dir=tmp_path, sink="kinesis", streams=24)

    # WHEN the schedule plays out and the fleet is healed
    report = run_chaos(config)

    # THEN the invariants hold as on the table, except that a seq may be stored twice: every
    # seq up to the checkpoint is in the stream, and every copy after the first lies inside a
    # replay window a connection view reported
    print(report.summary())
    assert report.ok, (
        f"chaos invariants violated on the kinesis sink; replay with "
        f"WSFLEET_CHAOS_SEED={config.seed} WSFLEET_CHAOS_SINK=kinesis\n" + report.summary()
    )
    assert report.verdict.figures["messages_checked"] > 0


def test_hand_offs_disrupted_midway_keep_the_invariants(tmp_path):
    # GIVEN a fleet whose drains are disrupted midway (issue #26): the giver SIGKILLed, a
    # taker SIGKILLed or SIGSTOPped, DynamoDB partitioned away, the takers' upstream sessions
    # muted; with upstream.handoff overlap (the default where frames carry a seq) these are
    # make-before-break hand-offs, in break mode the same drains break first
    config = ChaosConfig.from_env(
        run_dir=tmp_path, workers=5, streams=20, chaos_seconds=40.0, mean_gap=10.0, handoffs=5
    )

    # WHEN the schedule plays out and the fleet is healed
    report = run_chaos(config)

    # THEN the disrupted hand-offs happened, and every invariant held: converged, nothing lost
    # or stored twice, no write by anyone but its epoch's owner, every upstream session
    # attributed to the worker that opened it, and no two sessions of a stream open together
    # but a hand-off's giver and named taker, a prepared session within its bound, or a
    # paused worker's own
    print(report.summary())
    drains = [e for e in report.events if "hand-offs, then" in e]
    assert drains, report.summary()
    assert report.ok, (
        f"chaos invariants violated; replay with WSFLEET_CHAOS_SEED={config.seed}\n"
        + report.summary()
    )
    figures = report.verdict.figures
    assert figures["writes_by_non_owner"] == 0 and figures["writes_owner_checked"] > 0
    assert figures["sessions_attributed"] == figures["upstream_sessions"]
    assert figures["overlaps_of_planned_handoffs"] > 0
