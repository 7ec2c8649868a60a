"""The trade-off sweep's models and rendering (bench/tradeoffs.py), on synthetic measurements:
no fleet runs, no timings asserted."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from bench import tradeoffs
from bench.tradeoffs import ROWS, Units, cost_model, schedule_delay

UNITS = Units(heartbeat_wcu=1, checkpoint_wcu=1, view_write_wcu=1, view_read_rcu=0.5,
              pass_rcu=10, sweep_rcu={10: 0.5, 1000: 8})  # fmt: skip
DEFAULTS = ROWS[0]


def test_cost_follows_each_cadence() -> None:
    base = cost_model(DEFAULTS, 10, UNITS)
    # a longer sweep and a longer pass read less; a shorter heartbeat writes more
    assert cost_model(replace(DEFAULTS, sweep=120), 10, UNITS)["read_units"] < base["read_units"]
    assert cost_model(replace(DEFAULTS, reconcile_pass=14), 10, UNITS)["read_units"] < base[
        "read_units"
    ]
    assert cost_model(replace(DEFAULTS, heartbeat=3), 10, UNITS)["write_units"] > base[
        "write_units"
    ]
    # the reconciler is paid per fleet: per connection it weighs far less at 1,000 per worker
    at_1000 = cost_model(DEFAULTS, 1000, UNITS)
    assert at_1000["write_units"] < base["write_units"]
    # (2 workers x (120 sweeps x 8 + 360 view reads x 0.5) + 360 passes x 10) / 2,000
    assert at_1000["read_units"] == pytest.approx((2 * (120 * 8 + 360 * 0.5) + 3600) / 2000,
                                                  abs=0.01)  # fmt: skip


def test_a_five_minute_schedule_runs_a_fifth_of_the_passes() -> None:
    every_minute = replace(DEFAULTS, sweep=1e9, heartbeat=1e9)
    every_five = replace(every_minute, schedule_minutes=5)
    no_view = replace(UNITS, view_read_rcu=0, sweep_rcu={10: 0, 1000: 0})
    ratio = (cost_model(every_five, 10, no_view)["read_units"]
             / cost_model(every_minute, 10, no_view)["read_units"])  # fmt: skip
    assert ratio == pytest.approx(57 / 300, rel=0.02)


def test_schedule_gap_delays_only_what_falls_in_it() -> None:
    # every minute: the passes never stop, nothing changes
    assert set(schedule_delay([3.0], pass_seconds=10, schedule_minutes=1, draws=20)) == {3.0}
    # every 5 minutes: passes cover about 57 s of 300, so most draws wait; none waits longer
    # than the gap, and none is faster than measured
    delayed = schedule_delay([3.0], pass_seconds=10, schedule_minutes=5)
    assert min(delayed) == pytest.approx(3.0)
    assert max(delayed) <= 3.0 + 300 - 57 + 10
    waited = sum(1 for v in delayed if v > 3.0 + 1e-9) / len(delayed)
    assert 0.6 < waited < 0.95


def synthetic_result() -> dict[str, Any]:
    measured = {
        row.name: {"failover_seconds": [row.lease * 0.8] * 30, "hint_loss_seconds":
                   [row.reconcile_pass * 1.5] * 10}
        for row in ROWS if row.modelled_from is None
    }  # fmt: skip
    recording = {"factor": 10, "connections_per_worker": 10, "workers": 2,
                 "window_seconds_production": 600, "steady_state": True,
                 "totals_per_connection_hour": {"read_units": 190.0,
                                                "write_units": 96.0}}  # fmt: skip
    result = {
        "dynamodb": "moto",
        "rows": [asdict(row) for row in ROWS],
        "measured": measured,
        "exit_event": {"failover_seconds": [0.5] * 30},
        "units_recording": recording,
        "units_1000_source": "coordination-cost-1000",
        "units": asdict(UNITS),
    }
    return json.loads(json.dumps(result))  # as results.json holds it


def test_table_rows_say_where_each_figure_came_from() -> None:
    result = synthetic_result()
    rows = {row["name"]: row for row in tradeoffs.table(result)}
    assert rows["defaults"]["timings_source"] == "measured"
    assert rows["longer sweep"]["failover_no_event"] == rows["defaults"]["failover_no_event"]
    assert "modelled" in rows["schedule every 5 min"]["timings_source"]
    # the exit event's figure is the one run, on every row
    assert {row["failover_event"]["p50"] for row in rows.values()} == {0.5}
    # the schedule gap lengthens the lease path's tail, never its best case
    assert rows["schedule every 5 min"]["failover_no_event"]["p99"] > rows["defaults"][
        "failover_no_event"
    ]["p99"]


def test_markdown_and_plot_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = synthetic_result()
    result["table"] = tradeoffs.table(result)
    machine = {"cores": 2, "cpu": "x", "commit": "abc", "load_average_at_start": [1, 1, 1]}
    text = tradeoffs.render_markdown(result, machine)
    for row in ROWS:
        assert f"| {row.name} |" in text
    assert "modelled" in text and "measured" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    tradeoffs.render_plot(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
