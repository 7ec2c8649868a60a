"""Local fleet timings: the Settings rules are checked before anything starts."""

from __future__ import annotations

import pytest

from wsfleet.exceptions import ConfigurationError
from wsfleet_local.fleet import FleetTimings


def test_defaults_are_short_and_valid():
    timings = FleetTimings()
    assert (timings.lease_seconds, timings.heartbeat_seconds) == (4.0, 1.0)
    assert timings.margin_seconds == 1.0 and timings.pass_seconds == 1.0


def test_margin_and_pass_shrink_with_a_tight_lease():
    timings = FleetTimings(lease_seconds=2, heartbeat_seconds=1)
    assert timings.margin_seconds == 0.5 and timings.pass_seconds == 0.5


def test_explicit_values_win():
    timings = FleetTimings(lease_safety_margin_seconds=2, reconcile_pass_seconds=0.25)
    assert timings.margin_seconds == 2 and timings.pass_seconds == 0.25


@pytest.mark.parametrize(
    "settings",
    [
        {"lease_seconds": 3, "heartbeat_seconds": 2},  # lease < 2 heartbeats
        {"reconcile_pass_seconds": 3},  # pass not shorter than lease - heartbeat
        {"lease_safety_margin_seconds": 3},  # fence margin too wide
    ],
)
def test_invalid_timings_are_refused(settings):
    with pytest.raises(ConfigurationError):
        FleetTimings(**settings)
