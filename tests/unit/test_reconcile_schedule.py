"""Pass timing: passes on a fixed grid, as many as fit before the Lambda timeout.

The grid and the "one more pass?" rule are pure (wsfleet.reconcile); the loop that applies them
(``run_passes`` in the reconciler handler) is driven here with a fake clock, so no test sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from wsfleet.control_janitor import CleanupReport
from wsfleet.reconcile import next_pass_at_ms, should_run_another_pass
from wsfleet_local.handler_loader import load_function


def test_next_pass_is_the_next_grid_slot() -> None:
    assert next_pass_at_ms(1_000, 10_000, 1_000) == 11_000
    assert next_pass_at_ms(1_000, 10_000, 10_999) == 11_000
    assert next_pass_at_ms(1_000, 10_000, 11_000) == 21_000
    # a pass that overran two slots skips them instead of running back to back
    assert next_pass_at_ms(1_000, 10_000, 33_000) == 41_000
    # a clock that went backwards still gives a slot after now
    assert next_pass_at_ms(1_000, 10_000, 500) == 11_000
    with pytest.raises(ValueError):
        next_pass_at_ms(0, 0, 0)


def test_another_pass_runs_only_if_it_ends_a_margin_before_the_timeout() -> None:
    fits = {"wait_ms": 9_000, "expected_pass_ms": 1_000, "margin_ms": 3_000}
    assert should_run_another_pass(remaining_ms=13_000, **fits)
    assert not should_run_another_pass(remaining_ms=12_999, **fits)


@dataclass
class FakeClock:
    now_ms: int = 0
    sleeps: list[float] = field(default_factory=list)

    def monotonic_ms(self) -> int:
        return self.now_ms

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_ms += round(seconds * 1000)


@dataclass
class FakeReconciler:
    """Stands in for Reconciler: each pass 'takes' pass_ms on the fake clock."""

    clock: FakeClock
    pass_ms: int
    pass_interval_ms: int = 10_000
    started: list[int] = field(default_factory=list)

    def run_pass(self):  # -> PassReport
        reconciler_app = load_function("reconciler")
        self.started.append(self.clock.now_ms)
        self.clock.now_ms += self.pass_ms
        return reconciler_app.PassReport(
            self.clock.now_ms,
            self.pass_ms,
            reconciler_app.HintReport(),
            CleanupReport(),
        )


def run(timeout_ms: int, pass_ms: int) -> tuple[FakeReconciler, FakeClock]:
    reconciler_app = load_function("reconciler")
    clock = FakeClock()
    reconciler = FakeReconciler(clock, pass_ms)
    reports = list(
        reconciler_app.run_passes(
            reconciler,  # type: ignore[arg-type]
            lambda: timeout_ms - clock.now_ms,
            sleep=clock.sleep,
            monotonic_ms=clock.monotonic_ms,
            margin_ms=3_000,
        )
    )
    assert len(reports) == len(reconciler.started)
    return reconciler, clock


def test_a_one_minute_invocation_runs_a_pass_every_interval_until_the_margin() -> None:
    # GIVEN a 60 s timeout, 10 s passes that take 400 ms, a 3 s margin
    reconciler, clock = run(timeout_ms=60_000, pass_ms=400)
    # THEN passes start on the grid 0, 10, ..., 50 s (the one at 50 s ends at 50.4 s,
    # well before 57 s) and no pass is started that would end inside the margin
    assert reconciler.started == [0, 10_000, 20_000, 30_000, 40_000, 50_000]
    assert clock.now_ms == 50_400


def test_the_first_pass_always_runs_even_with_little_time_left() -> None:
    reconciler, clock = run(timeout_ms=2_000, pass_ms=500)
    assert reconciler.started == [0]
    assert clock.sleeps == []


def test_slow_passes_skip_grid_slots() -> None:
    # 12 s passes overrun their slot: each next pass starts at the next free slot (20 s, 40 s);
    # one at 60 s would end at 72 s, past the timeout.
    reconciler, clock = run(timeout_ms=60_000, pass_ms=12_000)
    assert reconciler.started == [0, 20_000, 40_000]
    assert clock.now_ms == 52_000
