"""The local reconcile schedule: Scheduler-shaped events, one short invocation per tick."""

from __future__ import annotations

import json
from pathlib import Path

from wsfleet_local.backend import find_template
from wsfleet_local.lambda_process import FunctionError
from wsfleet_local.scheduler import ONE_PASS_TIMEOUT_SECONDS, ReconcileScheduler

SAMPLE = json.loads(
    (Path(find_template()).parent / "events" / "scheduler_reconcile.json").read_text()
)


def test_each_run_sends_a_fresh_scheduler_event_with_a_one_pass_timeout():
    calls = []

    def invoke(event, *, timeout_seconds):
        calls.append((event, timeout_seconds))
        return {"passes": 1}

    scheduler = ReconcileScheduler(
        invoke, interval_seconds=1, schedule_name="s-reconcile", event_template=SAMPLE
    )
    assert scheduler.run_once() == {"passes": 1}
    scheduler.run_once()
    (first, timeout), (second, _) = calls
    assert timeout == ONE_PASS_TIMEOUT_SECONDS
    assert set(first) == set(SAMPLE) and first["source"] == "aws.scheduler"
    assert first["id"] != second["id"]
    assert first["resources"][0].endswith(":schedule/default/s-reconcile")


def test_a_failed_run_is_counted_and_the_schedule_goes_on():
    def invoke(event, *, timeout_seconds):
        raise FunctionError("reconciler", "RuntimeError", "boom")

    scheduler = ReconcileScheduler(invoke, interval_seconds=1)
    assert scheduler.run_once() is None
    assert (scheduler.invocations, scheduler.failures) == (1, 1)


def test_start_and_stop_run_on_a_background_thread():
    import threading

    ran = threading.Event()

    def invoke(event, *, timeout_seconds):
        ran.set()

    scheduler = ReconcileScheduler(invoke, interval_seconds=0.05).start()
    assert ran.wait(5)
    scheduler.stop()
    count = scheduler.invocations
    ran.clear()
    assert not ran.wait(0.3)  # no invocation after stop() returned
    assert scheduler.invocations == count
