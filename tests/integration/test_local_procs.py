"""Child processes of the local fleet: ready lines, ordered stops, no orphans."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from wsfleet_local.procs import ChildProcessError_, pid_alive, spawn

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
    time.sleep(0.3)  # the drain
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
    with pytest.raises(ChildProcessError_, match="exited with 3"):
        child.read_json_line(10)


def test_stop_escalates_to_sigkill(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    child = spawn("stubborn", [sys.executable, "-c", stubborn], log_path=tmp_path / "s.log")
    time.sleep(0.5)  # let it install its handler
    assert child.stop(signal.SIGTERM, 0.5) == -signal.SIGKILL


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
    deadline = time.monotonic() + 10
    while pid_alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child_pid)
