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
