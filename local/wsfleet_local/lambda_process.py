"""Local Lambda execution environments: one child process per function, invoked over a pipe.

Why a process per function rather than calling the handlers on threads of the supervisor:

* **Environment.** Each Lambda has its own environment variables (``POWERTOOLS_SERVICE_NAME``,
  the router's ``ALLOWED_UPSTREAM_HOSTS``, the reconciler's pass settings). One process has
  one ``os.environ``; three handlers sharing it would each see the others' settings.
* **Powertools state.** ``Metrics`` instances share one metric set per process, so a router and
  a notifier flushing concurrently in one process would mix (and race on) each other's
  metrics. Lambda never runs two invocations in one environment at a time; neither does this.
* **Output.** Handlers log JSON and print EMF metrics to stdout. In a child, stdout is the
  function's log file (its "CloudWatch log group") and the console stays readable.

The child (``python -m wsfleet_local.lambda_process NAME``) imports the handler through
:func:`wsfleet_local.handler_loader.load_function`, announces ``{"ready": true}``, then serves one
invocation at a time: a JSON line ``{"event": ..., "timeout_ms": ...}`` on stdin, a JSON line
``{"result": ...}`` or ``{"error": {"errorType", "errorMessage"}}`` back on a private copy of
its stdout. An invocation that outlives its timeout gets the environment killed and replaced,
as Lambda does.

Example::

    router = FunctionProcess("router", env=os.environ, log_path=Path("router.log")).start()
    response = router.invoke(api_event)          # the handler's return value
    router.stop()
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wsfleet.exceptions import WsfleetError

from .procs import ChildFailed, ChildProcess, ChildTimeout, spawn

__all__ = ["FunctionError", "FunctionProcess", "FunctionTimeout", "main"]

#: A cold start imports boto3 and Powertools: about a second, much more on a loaded machine.
START_TIMEOUT_SECONDS = 60.0
#: Extra wait beyond the function timeout before the environment is declared hung.
TIMEOUT_GRACE_SECONDS = 2.0


class FunctionError(WsfleetError):
    """The handler raised (``error_type`` is its exception class, as Lambda reports it)."""

    def __init__(self, function: str, error_type: str, message: str) -> None:
        super().__init__(f"{function}: {error_type}: {message}")
        self.function = function
        self.error_type = error_type
        self.error_message = message


class FunctionTimeout(FunctionError):
    """The invocation did not finish within the function's timeout; the environment was reset."""

    def __init__(self, function: str, timeout_seconds: float) -> None:
        super().__init__(
            function, "Sandbox.Timedout", f"Task timed out after {timeout_seconds:.2f} seconds"
        )


class FunctionProcess:
    """One warm execution environment of function ``name`` (functions/<name>/app.py).

    Invocations are serialised (one at a time, as in one Lambda environment); callers on
    several threads simply queue. ``env`` is the complete environment of the child.
    """

    def __init__(
        self,
        name: str,
        *,
        env: Mapping[str, str],
        log_path: Path | None = None,
        handler: str = "app.lambda_handler",
        timeout_seconds: float = 10.0,
        memory_mb: int = 256,
    ) -> None:
        self.name = name
        self.timeout_seconds = timeout_seconds
        self._env = {**env, "PYTHONUNBUFFERED": "1"}
        self._log_path = log_path
        self._handler = handler
        self._memory_mb = memory_mb
        self._lock = threading.Lock()
        self._child: ChildProcess | None = None
        self._closed = False
        self.invocations = 0
        self.errors = 0

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> FunctionProcess:
        """Spawn the environment and wait for its cold start. Returns self."""
        with self._lock:
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        command = [
            sys.executable,
            "-m",
            "wsfleet_local.lambda_process",
            self.name,
            self._handler,
            str(self._memory_mb),
        ]
        child = spawn(
            f"function {self.name}",
            command,
            env=self._env,
            log_path=self._log_path,
            stdin_pipe=True,
            capture_stdout=True,
        )
        try:
            ready = child.read_json_line(START_TIMEOUT_SECONDS)
            if not ready.get("ready"):
                error = ready.get("error") or {}
                raise FunctionError(
                    self.name,
                    error.get("errorType", "Runtime.ImportModuleError"),
                    error.get("errorMessage", repr(ready)),
                )
        except BaseException:
            child.stop(timeout_seconds=1)
            raise
        self._child = child

    def invoke(self, event: Any, *, timeout_seconds: float | None = None) -> Any:
        """Run the handler on ``event``; its return value, or FunctionError / FunctionTimeout."""
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        request = json.dumps({"event": event, "timeout_ms": int(timeout * 1000)}) + "\n"
        with self._lock:
            if self._closed:
                raise FunctionError(self.name, "Runtime.Closed", "the environment was stopped")
            if self._child is None or not self._child.alive():
                self._start_locked()  # a crashed or timed-out environment: cold start again
            child = self._child
            assert child is not None and child.popen.stdin is not None
            self.invocations += 1
            try:
                child.popen.stdin.write(request.encode())
                child.popen.stdin.flush()
                line = child.read_json_line(timeout + TIMEOUT_GRACE_SECONDS)
            except (ChildFailed, OSError) as exc:  # OSError: a broken pipe, the environment died
                self._discard_locked()
                self.errors += 1
                if isinstance(exc, ChildTimeout):
                    raise FunctionTimeout(self.name, timeout) from exc
                raise FunctionError(self.name, "Runtime.ExitError", str(exc)) from exc
        if "error" in line:
            self.errors += 1
            error = line["error"]
            raise FunctionError(self.name, error["errorType"], error["errorMessage"])
        return line.get("result")

    def _discard_locked(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop(timeout_seconds=1)

    def kill(self) -> None:
        """SIGKILL the environment now, even mid-invocation (the caller then sees an error)."""
        child = self._child
        if child is not None:
            child.send_signal(signal.SIGKILL)

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Close the environment (EOF on its stdin ends it). Safe to call twice."""
        with self._lock:
            self._closed = True
            child, self._child = self._child, None
        if child is None:
            return
        child.close_stdin()
        child.wait(timeout_seconds)
        child.stop(timeout_seconds=1)  # SIGTERM only if EOF did not end it; always reaps


# ----------------------------------------------------------------------------------------------
# The child side.


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "errorType": type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_exception(exc),
    }


def _serve(name: str, handler_path: str, memory_mb: int, replies: Any) -> int:
    from .handler_loader import lambda_context, load_function

    module_file, _, attribute = handler_path.rpartition(".")
    try:
        if module_file != "app":
            raise ImportError(f"only app.<handler> is supported, got {handler_path}")
        handler = getattr(load_function(name), attribute)
    except Exception as exc:
        traceback.print_exc()
        replies.write(json.dumps({"ready": False, "error": _error(exc)}) + "\n")
        return 1
    replies.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        context = lambda_context(name, timeout_ms=int(request["timeout_ms"]), memory_mb=memory_mb)
        started = time.monotonic()
        try:
            text = json.dumps({"result": handler(request["event"], context)})
        except Exception as exc:
            traceback.print_exc()
            text = json.dumps({"error": _error(exc)})
        except BaseException as exc:  # SystemExit in a handler ends the environment, as in Lambda
            replies.write(json.dumps({"error": _error(exc)}) + "\n")
            raise
        elapsed_ms = (time.monotonic() - started) * 1000
        print(
            f"REPORT RequestId: {context.aws_request_id} Duration: {elapsed_ms:.2f} ms",
            file=sys.stderr,
        )
        replies.write(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m wsfleet_local.lambda_process NAME [HANDLER [MEMORY_MB]]`` (FunctionProcess runs
    it)."""
    parser = argparse.ArgumentParser(prog="python -m wsfleet_local.lambda_process")
    parser.add_argument("name", help="the directory under functions/")
    parser.add_argument("handler", nargs="?", default="app.lambda_handler")
    parser.add_argument("memory_mb", nargs="?", type=int, default=256)
    args = parser.parse_args(argv)
    # Keep the real stdout for replies; everything the handler prints goes to stderr (the log).
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return _serve(args.name, args.handler, args.memory_mb, replies)


if __name__ == "__main__":
    raise SystemExit(main())
