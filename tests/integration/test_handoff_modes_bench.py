"""Issue #26's 0-loss row is a real check: break-before-make fails it on a live-only upstream.

The bench's own run (bench/handoff_modes.py), small and on the moto server: one live-only
stream per hand-off mode (``upstream.handoff: break`` and, where the checkout has it,
``overlap``) through two SIGTERM drains, then the figures the bench reports. A stream whose
upstream cannot replay loses what is produced between the giver's close and the taker's first
frame when the overlap is off; the 0-loss row must say so, or it proves nothing about the
overlap mode that has to pass it. Nothing is timed: the figures are seqs in the messages table.
"""

from __future__ import annotations

import pytest

from bench.handoff_modes import loses_nothing, run_handoff_modes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_break_mode_fails_the_zero_loss_row_that_overlap_mode_must_pass(tmp_path):
    # GIVEN live-only streams at 100 frames/s (a hand-off of a few hundred ms loses frames)
    # WHEN worker 0, then worker 1, drain on SIGTERM (fresh peers ready)
    result = run_handoff_modes(
        run_dir=tmp_path, rate=100.0, behaviours=("live",), per_cohort=1, dynamodb="moto"
    )
    assert "error" not in result, result
    cohorts = result["cohorts"]

    # THEN with the overlap off the stream moved and lost frames: the 0-loss row fails it
    broken = cohorts["live/break"]
    assert broken["moves"] >= 1, broken
    assert broken["frames_lost"] > 0 and not loses_nothing(broken), broken
    # AND it reports exactly what it lost, and the upstream never saw two of its sessions
    assert broken["gap_frames_reported"] == broken["frames_lost"], broken
    assert broken["upstream_overlaps"] == 0, broken
    # AND the same drains with make-before-break on lose nothing
    assert loses_nothing(cohorts["live/overlap"]), cohorts["live/overlap"]
