"""Child processes of the local fleet: ready lines, ordered stops, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from fleet_helpers import wait_until

from wsfleet_local.procs import ChildFailed, StopSignals, pid_alive, spawn

pytestmark = pytest.mark.integration

# Counts SIGTERMs into a file and exits on the second one after a short "drain".
DRAINER = textwrap.dedent(
    """
    import json, signal, sys, time
    count = 0
    def on_term(signum, frame):
        global count
        count += 1
        open(sys.argv[1], "w").write(str(count))
    signal.signal(signal.SIGTERM, on_term)
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.time() + 30
    while time.time() < deadline and count == 0:
        time.sleep(0.01)
    time.sleep(0.3)  # the drain: stop() below finds it still running, a 2nd signal would count
    sys.exit(0)
    """
)


def test_ready_line_and_a_single_sigterm(tmp_path):
    counter = tmp_path / "terms"
    child = spawn("drainer", [sys.executable, "-c", DRAINER, str(counter)],
                  log_path=tmp_path / "drainer.log", capture_stdout=True)  # fmt: skip
    assert child.read_json_line(10) == {"ready": True}
    child.send_signal(signal.SIGTERM)  # e.g. the demo's "deploy"
    assert child.stop(signal.SIGTERM, 10) == 0  # a later stop() must not signal again
    assert counter.read_text() == "1"
    assert not pid_alive(child.pid)


def test_a_child_that_dies_before_its_ready_line_is_reported(tmp_path):
    child = spawn("quitter", [sys.executable, "-c", "import sys; sys.exit(3)"],
                  log_path=tmp_path / "q.log", capture_stdout=True)  # fmt: skip
    with pytest.raises(ChildFailed, match="exited with 3"):
        child.read_json_line(10)


def test_stop_escalates_to_sigkill(tmp_path):
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('{}', flush=True); time.sleep(60)")  # fmt: skip
    child = spawn("stubborn", [sys.executable, "-c", stubborn], log_path=tmp_path / "s.log",
                  capture_stdout=True)  # fmt: skip
    assert child.read_json_line(10) == {}  # its handler is in place
    assert child.stop(signal.SIGTERM, 0.5) == -signal.SIGKILL


# Serves until stopped, then "drains" for up to 10 minutes in waits that honour force_exit.
FORCED = textwrap.dedent(
    """
    import json, signal, sys
    from wsfleet_local.procs import StopSignals, serve_until_stopped
    with StopSignals() as stop:
        serve_until_stopped({"ready": True}, stop)
        print("draining", flush=True)  # stdout now goes to the log (stderr)
        stop.sleep(600)
        print(json.dumps({"force_exit": stop.force_exit,
                          "restored": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}),
              flush=True)
    """
)


def test_a_second_sigterm_forces_the_exit_and_restores_the_handlers(tmp_path):
    # GIVEN a child served by serve_until_stopped, draining after a first SIGTERM
    log = tmp_path / "forced.log"
    child = spawn("forced", [sys.executable, "-c", FORCED], log_path=log, capture_stdout=True)
    try:
        assert child.read_json_line(30) == {"ready": True}
        child.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in log.read_text(), timeout=30, message=log.read_text)

        # WHEN a second SIGTERM arrives
        child.popen.send_signal(signal.SIGTERM)

        # THEN the drain's wait ends at once, the original handler is back, and it exits 0
        assert child.wait(60) == 0
    finally:
        child.stop(signal.SIGKILL)
    assert json.loads(log.read_text().splitlines()[-1]) == {"force_exit": True, "restored": True}


SUPERVISOR = textwrap.dedent(
    """
    import json, sys, time
    from wsfleet_local.procs import spawn
    child = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    print(json.dumps({"child": child.pid}), flush=True)
    time.sleep(60)
    """
)


def test_children_die_with_a_sigkilled_supervisor():
    # GIVEN a supervisor that spawned a child WHEN the supervisor is SIGKILLed
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE)
    child_pid = json.loads(supervisor.stdout.readline())["child"]
    assert pid_alive(child_pid)
    supervisor.kill()
    supervisor.wait()
    supervisor.stdout.close()
    # THEN the child gets its parent-death signal and goes away (init reaps it)
    wait_until(lambda: not pid_alive(child_pid), timeout=30, message="the orphan still runs")


def test_the_handler_only_records_and_the_waits_wake_on_it():
    # GIVEN the policy installed in this (main) thread
    original = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        # WHEN one signal arrives, the stop is only asked: wait() returns it, nothing raised
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(timeout_seconds=10)
        assert stop.should_exit and not stop.force_exit
        # AND a second one forces: a long sleep() of the shutdown returns at once
        os.kill(os.getpid(), signal.SIGTERM)
        stop.sleep(600)
        assert stop.force_exit
        # AND the original handler is back already (a third signal: the default action)
        assert signal.getsignal(signal.SIGTERM) is original
    assert signal.getsignal(signal.SIGTERM) is original


def test_a_signal_wakes_a_waiting_main_thread_even_when_another_thread_receives_it():
    # GIVEN a main thread waiting with no timeout, and a busy second thread
    busy = threading.Event()
    spinner = threading.Thread(target=lambda: busy.wait(30), daemon=True)
    spinner.start()
    with StopSignals() as stop:
        # WHEN the signal is sent to the other thread only (the kernel may pick any thread)
        threading.Timer(0.2, signal.pthread_kill, (spinner.ident, signal.SIGTERM)).start()
        # THEN the wait returns (the wakeup fd woke it), not only after some poll
        assert stop.wait(timeout_seconds=30)
    busy.set()


def test_run_gives_the_work_s_result_or_none_once_a_stop_is_asked():
    with StopSignals() as stop:
        # GIVEN start-up work on a thread WHEN it ends first THEN its result
        assert stop.run(lambda: 42, name="quick") == 42
        # WHEN a signal arrives while the work still runs THEN the wait ends without it
        release = threading.Event()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        assert stop.run(lambda: release.wait(60), name="blocked") is None
        release.set()
        assert stop.should_exit
