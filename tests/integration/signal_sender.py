"""Run a local process with SIGTERM, then SIGINT, sent to it at random points of its run.

``python tests/integration/signal_sender.py PLAN -m MODULE ARGS...`` (or ``ENTRY
module:function ARGS...``) runs the module as ``python -m`` would, in this process, and sends
the process its own signals (``os.kill``, as a supervisor's ``kill`` would arrive). PLAN is
JSON: ``{"after": [a1, a2], "events": [n1, n2], "fallback": f}``.

A signal sent from outside at a random *time* almost always finds a server's main thread
asleep, and races hide in the few microseconds it is awake (issue #28: a handler that needed
the lock the interrupted ``Event.wait`` held). So each signal is armed ``a`` seconds after
the start (the first) or after the first signal (the second), then sent at the ``n``-th event
of the main thread's profile hook (a call or return, Python or C) from then on: a random
point of the code the main thread runs, the waits' own bookkeeping included. A main thread
that runs nothing (blocked in ``select``) gets it from a clock thread ``f`` seconds after the
arming instead. Each send is logged on stderr as ``signal-sender: SIGTERM at <time.time()>``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Sender:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.sent = 0
        self.armed = False
        self.countdown = 0
        self._once = threading.Lock()  # never blocks: acquire(False), the loser sends nothing

    def send(self, index: int) -> None:
        """Send signal ``index`` unless it was sent; the lock only decides who sends (it is
        released before the kill: the target's handler may run right after it, here)."""
        if self.sent != index or not self._once.acquire(blocking=False):
            return
        try:
            mine = self.sent == index
            if mine:
                self.armed = False
                self.sent = index + 1
        finally:
            self._once.release()
        if mine:
            sys.stderr.write(f"signal-sender: {SIGNALS[index].name} at {time.time():.6f}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), SIGNALS[index])

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if self.armed:
            self.countdown -= 1
            if self.countdown <= 0:
                self.send(self.sent)

    def clock(self) -> None:
        for index in range(len(SIGNALS)):
            time.sleep(self.plan["after"][index])
            self.countdown = self.plan["events"][index]
            self.armed = True
            deadline = time.monotonic() + self.plan["fallback"]
            while self.sent <= index and time.monotonic() < deadline:
                time.sleep(0.005)
            self.send(index)


def main() -> None:
    plan = json.loads(sys.argv[1])
    how, target, *args = sys.argv[2:]
    sender = Sender(plan)
    sys.path[0] = os.getcwd()  # as `python -m` and a console script see it, not this folder
    threading.Thread(target=sender.clock, name="signal-sender", daemon=True).start()
    sys.setprofile(sender.profile)  # this (main) thread only
    if how == "-m":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        module, function = target.split(":")
        sys.argv = [module, *args]
        sys.exit(getattr(importlib.import_module(module), function)())


if __name__ == "__main__":
    main()
