"""`wsfleet local up` options that reach the worker processes (no fleet is started here).

The fleet gives each process exactly what the template or an option says (it strips every
wsfleet variable from the shell), so a worker setting a local user needs must be an option.
"""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import wsfleet_local.fleet as fleet_module
from wsfleet_local.cli import app
from wsfleet_local.fleet import _FUNCTION_VARIABLES, FleetError


def fleet_arguments(monkeypatch: pytest.MonkeyPatch, *options: str) -> tuple[Any, dict[str, Any]]:
    """Run `local up` with ``options`` up to the point it builds the fleet; its arguments."""
    captured: dict[str, Any] = {}

    class Recorder:
        def __init__(self, **kwargs: Any) -> None:
            captured.update(kwargs)
            raise FleetError("recorded; not starting")

    monkeypatch.setattr(fleet_module, "LocalFleet", Recorder)
    result = CliRunner().invoke(app, ["local", "up", "--workers", "0", *options])
    return result, captured


def test_secret_cache_seconds_reaches_every_worker(monkeypatch):
    # Issue #23: the shell's WORKER_SECRET_CACHE_SECONDS is stripped, and there was no option.
    assert "WORKER_SECRET_CACHE_SECONDS" in _FUNCTION_VARIABLES
    result, arguments = fleet_arguments(monkeypatch, "--secret-cache-seconds", "0")
    assert "recorded" in result.output
    assert arguments["extra_worker_env"] == {"WORKER_SECRET_CACHE_SECONDS": "0"}
    _, arguments = fleet_arguments(monkeypatch, "--secret-cache-seconds", "2.5")
    assert arguments["extra_worker_env"] == {"WORKER_SECRET_CACHE_SECONDS": "2.5"}


def test_without_the_option_the_workers_keep_their_default(monkeypatch):
    _, arguments = fleet_arguments(monkeypatch)
    assert arguments["extra_worker_env"] == {}


def test_a_negative_cache_time_is_refused_before_anything_starts(monkeypatch):
    result, arguments = fleet_arguments(monkeypatch, "--secret-cache-seconds", "-1")
    assert result.exit_code == 2 and arguments == {}
