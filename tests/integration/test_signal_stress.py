"""Issue #28: SIGTERM, then SIGINT, at random moments, to every kind of long-running local
process; each one must exit within its documented bound (README "Stopping local processes"):
gracefully after the first signal, at once after the second, leaving no child behind.

Each trial runs the process under ``signal_sender.py``, which arms the first signal at a random
time (start-up included) and sends it at a random point of the code the main thread then runs
(its n-th call or return), or from a clock when the main thread runs nothing; the second one
likewise after a random gap. Points of code, not only points of time: a server's main thread
sleeps almost always, and a deadlock like the one of issue #28 (a handler that sets the
``threading.Event`` whose ``wait`` it interrupted, inside that Event's lock) lives in the few
microseconds it is awake. Against the code before the fix, 4 of 30 simulator trials hung.

``WSFLEET_SIGNAL_TRIALS`` (default 6) is the number of trials per kind of process; the whole
fleet (``wsfleet local up``, ``wsfleet demo``) gets a quarter of it, at least one. The long
run, hundreds of trials::

    WSFLEET_SIGNAL_TRIALS=100 .venv/bin/python -m pytest tests/integration/test_signal_stress.py

``WSFLEET_SIGNAL_SEED`` replays a run's draws (the failure message prints the seed).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FAST_WORKER_ENV

from wsfleet_local.procs import pid_alive, spawn

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = "wsfleet_local.cli:main"  # the `wsfleet` console script
TRIALS = int(os.environ.get("WSFLEET_SIGNAL_TRIALS", "6"))
FLEET_TRIALS = max(1, TRIALS // 4)
SEED = int(os.environ.get("WSFLEET_SIGNAL_SEED", str(random.SystemRandom().randrange(10**6))))
#: Trials of one kind run this many at a time (2 shared cores: more would only measure load).
PARALLEL = 3
#: pytest-timeout's bound for one test, grown with its trials (the suite's 300 s is for one).
#: Generous: a trial of a child takes about 3 s, of a worker 6 s, of a whole fleet 40 s.
CHILD_TIMEOUT = pytest.mark.timeout(120 + 10 * TRIALS)
FLEET_TIMEOUT = pytest.mark.timeout(180 + 90 * FLEET_TRIALS)

# The documented bounds (README "Stopping local processes"), in seconds.
#: A child process (backend, simulator, fault proxy) after its first signal.
CHILD_GRACEFUL_SECONDS = 10.0
#: A worker after its first signal: its drain (DRAIN_TIMEOUT_SECONDS) plus the cleanup.
WORKER_GRACEFUL_SECONDS = float(FAST_WORKER_ENV["DRAIN_TIMEOUT_SECONDS"]) + 10.0
#: Any process after a second signal.
FORCED_SECONDS = 10.0
#: The fleet supervisor after a second Ctrl-C: every child killed, then at most 10 s more.
FLEET_FORCED_SECONDS = 25.0


@dataclass(frozen=True)
class Kind:
    """One kind of long-running process and when to signal it."""

    name: str
    #: What signal_sender runs: ``["-m", module, args...]`` or ``["ENTRY", "mod:func", args...]``.
    target: list[str]
    #: The first signal is armed uniformly in [0, first_signal_window] s after the start.
    first_signal_window: float
    #: The second one, uniformly in [0, second_signal_gap] s after the first.
    second_signal_gap: float
    graceful_seconds: float
    forced_seconds: float
    env: Mapping[str, str] | None = None
    #: Where the fleet keeps its children's pids, if it has children.
    has_children: bool = False


@dataclass
class Trial:
    kind: str
    number: int
    plan: dict[str, Any]
    log: Path
    exit_code: int | None = None
    signals_sent: int = 0
    problem: str | None = None

    def __str__(self) -> str:
        return (
            f"{self.kind}#{self.number} plan {self.plan}: {self.signals_sent} signal(s) sent, "
            f"exit {self.exit_code}: {self.problem} (log {self.log})"
        )


def _children_of(pid: int) -> set[int]:
    """Direct children of ``pid`` (the fleet spawns every process itself)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


SENDER = str(Path(__file__).with_name("signal_sender.py"))
#: A main thread that runs nothing gets its signal this long after the arming (signal_sender).
FALLBACK_SECONDS = 1.5


def _log_uniform(rng: random.Random, high: int) -> int:
    return int(math.exp(rng.uniform(0, math.log(high))))


def _sent_at(log: Path) -> list[float]:
    """When signal_sender sent each signal (time.time()), from the child's log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("signal-sender: ")]  # fmt: skip


def run_trial(kind: Kind, number: int, rng: random.Random, log_dir: Path) -> Trial:
    after = [rng.uniform(0, kind.first_signal_window), rng.uniform(0, kind.second_signal_gap)]
    events = [_log_uniform(rng, 3000), _log_uniform(rng, 3000)]
    plan = {"after": after, "events": events, "fallback": FALLBACK_SECONDS}
    trial = Trial(kind.name, number, plan=plan, log=log_dir / f"{kind.name}-{number}.log")
    env = {
        **os.environ,
        **(kind.env or {}),
        "WORKER_ID": f"{kind.name}-{number}-{SEED}",  # read by workers only
        "HEALTH_FILE": str(log_dir / f"{kind.name}-{number}.health"),
    }
    argv = [sys.executable, SENDER, json.dumps(plan), *kind.target]
    child = spawn(kind.name, argv, env=env, cwd=REPO, log_path=trial.log)
    limit = time.monotonic() + sum(after) + 2 * FALLBACK_SECONDS + kind.graceful_seconds + 5
    children: set[int] = set()
    try:
        while (code := child.wait(0.1)) is None and time.monotonic() < limit:
            children |= _children_of(child.pid)
        exited = time.time()
        sent = _sent_at(trial.log)
        trial.exit_code, trial.signals_sent = code, len(sent)
        if code is None:
            trial.problem = f"still running {time.time() - sent[-1]:.0f} s after its last signal"
        elif not sent:
            trial.problem = "exited before any signal"
        elif len(sent) == 1 and exited - sent[0] > kind.graceful_seconds:
            trial.problem = f"took {exited - sent[0]:.1f} s after one signal"
        elif len(sent) == 2 and exited - sent[1] > kind.forced_seconds:
            trial.problem = f"took {exited - sent[1]:.1f} s after the second signal"
        if code is not None and kind.has_children:
            deadline = time.monotonic() + kind.forced_seconds
            while (alive := [p for p in children if pid_alive(p)]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive:
                trial.problem = f"left {len(alive)} process(es) behind: {alive}"
        return trial
    finally:
        child.stop(signal.SIGKILL, 5)  # a hung trial must not outlive the test
        for pid in children:
            if pid_alive(pid):
                with contextlib.suppress(OSError):  # each child leads its own process group
                    os.killpg(pid, signal.SIGKILL)


def run_trials(kind: Kind, trials: int, log_dir: Path) -> list[Trial]:
    rng = random.Random(f"{SEED}-{kind.name}")
    draws = [random.Random(rng.random()) for _ in range(trials)]
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return list(pool.map(lambda n: run_trial(kind, n, draws[n], log_dir), range(trials)))


def assert_all_exited(trials: list[Trial]) -> None:
    failed = [t for t in trials if t.problem is not None]
    assert not failed, f"seed {SEED}; {len(failed)} of {len(trials)} trials failed:\n" + "\n".join(
        str(t) for t in failed
    )


# --------------------------------------------------------------------------- the kinds


def _module(name: str, *args: str) -> list[str]:
    return ["-m", name, *args]


CHILD_KINDS = {
    # `make local-backend` (on a free port: 4566 may be taken on a shared machine)
    "backend": Kind(
        "backend", _module("wsfleet_local.backend", "--port", "0", "--create-resources", "sig"),
        first_signal_window=3.0, second_signal_gap=1.0,
        graceful_seconds=CHILD_GRACEFUL_SECONDS, forced_seconds=FORCED_SECONDS,
    ),
    "simulator": Kind(
        "simulator", _module("wsfleet_local.simulator", "--rate", "200"),
        first_signal_window=2.5, second_signal_gap=1.0,
        graceful_seconds=CHILD_GRACEFUL_SECONDS, forced_seconds=FORCED_SECONDS,
    ),
    "fault-proxy": Kind(
        "fault-proxy", _module("bench.faults", "--upstream", "http://127.0.0.1:9"),
        first_signal_window=2.5, second_signal_gap=1.0,
        graceful_seconds=CHILD_GRACEFUL_SECONDS, forced_seconds=FORCED_SECONDS,
    ),
}  # fmt: skip


@CHILD_TIMEOUT
@pytest.mark.parametrize("name", sorted(CHILD_KINDS))
def test_a_local_child_exits_within_its_bound_whenever_signalled(name, tmp_path):
    # GIVEN one kind of local child WHEN it gets SIGTERM then SIGINT at random moments
    trials = run_trials(CHILD_KINDS[name], TRIALS, tmp_path)
    # THEN every trial's process exited within its bound
    assert_all_exited(trials)


@pytest.fixture
def worker_env(aws) -> dict[str, str]:
    return {**FAST_WORKER_ENV, **aws.env(), "CONTROL_QUEUE_PREFIX": f"ctl-{SEED}-"}


@CHILD_TIMEOUT
def test_a_worker_exits_within_its_bound_whenever_signalled(worker_env, tmp_path):
    # GIVEN workers on the embedded backend (asyncio's signal handling, not StopSignals)
    kind = Kind(
        "worker", _module("wsfleet_worker"), env=worker_env,
        first_signal_window=4.0, second_signal_gap=3.0,
        graceful_seconds=WORKER_GRACEFUL_SECONDS, forced_seconds=FORCED_SECONDS,
    )  # fmt: skip
    # WHEN each gets SIGTERM then SIGINT at random moments THEN each exits within its bound
    assert_all_exited(run_trials(kind, TRIALS, tmp_path))


def _fleet_kind(name: str, target: list[str], first_signal_window: float = 20.0) -> Kind:
    return Kind(
        name, target, first_signal_window=first_signal_window, second_signal_gap=4.0,
        graceful_seconds=60.0, forced_seconds=FLEET_FORCED_SECONDS, has_children=True,
    )  # fmt: skip


@FLEET_TIMEOUT
def test_wsfleet_local_up_leaves_nothing_behind_whenever_signalled(tmp_path):
    # GIVEN `wsfleet local up` (what `make up` runs): backend, simulator, Lambdas, 2 workers
    kind = _fleet_kind(
        "local-up", ["ENTRY", CLI, "local", "up", "--workers", "2", "--port", "0"]
    )
    # WHEN it gets SIGTERM then SIGINT (Ctrl-C) at random moments, start-up included
    # THEN it exits within its bound and every process it started is gone
    assert_all_exited(run_trials(kind, FLEET_TRIALS, tmp_path))


@FLEET_TIMEOUT
def test_wsfleet_demo_leaves_nothing_behind_whenever_signalled(tmp_path):
    # GIVEN `wsfleet demo` (what `make demo` runs)
    # (the whole demo took 17.8 s on a quiet machine: a later first signal could find it done)
    kind = _fleet_kind(
        "demo", ["ENTRY", CLI, "demo", "--workers", "2", "--streams", "4"],
        first_signal_window=8.0,
    )
    # WHEN it gets SIGTERM then SIGINT at random moments THEN nothing is left behind
    assert_all_exited(run_trials(kind, FLEET_TRIALS, tmp_path))
