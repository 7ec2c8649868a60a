"""Child processes of the local fleet: spawned so that none can outlive the supervisor.

Three rules make ``wsfleet local up`` leave nothing behind, however it ends:

* **Own session.** Every child runs in a new session (its own process group). Ctrl-C in the
  terminal then reaches only the supervisor, which stops the children *in order* (workers
  drain while DynamoDB and the upstream are still up, then the rest). Had the children
  shared the terminal's process group, the backend would exit at the same instant the
  workers start draining, and every release would fail.
* **Parent-death signal.** On Linux each child gets ``PR_SET_PDEATHSIG`` = SIGTERM, so even a
  SIGKILLed supervisor takes its children with it. The kernel ties that signal to the *thread*
  that forked, so every spawn runs on one long-lived spawner thread, never on a short-lived
  request thread.
* **Reaped and group-signalled.** :meth:`ChildProcess.stop` signals the whole process group
  (while its leader is alive, so the group id cannot have been reused), waits, escalates to
  SIGKILL after a bound, and reaps the child.

The child side is :func:`serve_until_stopped`: one JSON ready line on stdout, then serve until
SIGTERM/SIGINT or (when asked) EOF on stdin. :class:`StopSignals` is the one signal policy,
uvicorn's: the first signal asks for a graceful stop, a second sets ``force_exit`` (which every
wait of the shutdown honours) and restores the original handlers, so a third one is the
default action. Its handler only records the signal; the main thread waits in ``select`` on a
self-pipe, never on a lock a handler could need.

Example::

    child = spawn("sim", [sys.executable, "-m", "wsfleet_local.simulator"], capture_stdout=True)
    url = child.read_json_line(timeout_seconds=10)["url"]
    ...
    child.stop()
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import IO, Any, Self, TypeVar

from wsfleet.exceptions import WsfleetError

__all__ = [
    "ChildFailed",
    "ChildProcess",
    "ChildTimeout",
    "LineReader",
    "Service",
    "StopSignals",
    "pid_alive",
    "serve_until_stopped",
    "spawn",
]

_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsfleet-spawner")
_libc: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)


class ChildFailed(WsfleetError):
    """A child process failed to start, died early, or said something unexpected."""


class ChildTimeout(ChildFailed):
    """A child said nothing within the time it was given."""


class Service:
    """Something with ``start()`` and ``stop()`` (a child, a server thread, a fleet): ``with``
    starts it and stops it however the block ends. ``stop`` must be safe to call twice."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _die_with_parent() -> None:  # runs in the forked child, before exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def pid_alive(pid: int) -> bool:
    """True if a process with this id exists and is not a zombie (reads /proc where it exists:
    a zombie still answers ``kill(pid, 0)``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return not os.path.isdir("/proc")  # gone since the kill, or no /proc (macOS)
    except (OSError, IndexError):
        return True


class LineReader:
    """Read newline-terminated lines from a pipe with a deadline (no thread per pipe)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self._buffer = b""

    def readline(self, timeout_seconds: float) -> bytes | None:
        """The next line (without the newline); None on timeout; b"" only at EOF."""
        deadline = time.monotonic() + timeout_seconds
        with selectors.DefaultSelector() as selector:
            selector.register(self._pipe, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if not selector.select(remaining):
                    continue
                chunk = os.read(self._pipe.fileno(), 65536)
                if not chunk:
                    rest, self._buffer = self._buffer, b""
                    return rest
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


class ChildProcess:
    """A spawned child: its pid, its log file, its ready line, and an ordered stop."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path | None) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self._stdout = LineReader(popen.stdout) if popen.stdout is not None else None
        self.signals_sent: list[int] = []

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send_signal(self, signum: int) -> None:
        """Signal the child (not its group: SIGKILL of a worker must be exactly that)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)
                self.signals_sent.append(signum)

    def read_json_line(self, timeout_seconds: float) -> dict[str, Any]:
        """The child's next stdout line as JSON: how children announce they are ready."""
        if self._stdout is None:
            raise ChildFailed(f"{self.name}: stdout is not captured")
        line = self._stdout.readline(timeout_seconds)
        if line is None:
            raise ChildTimeout(f"{self.name}: no output within {timeout_seconds:.1f} s")
        if not line:
            code = self.popen.wait()
            hint = f" (see {self.log_path})" if self.log_path else ""
            raise ChildFailed(f"{self.name} exited with {code} before it was ready{hint}")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise ChildFailed(f"{self.name}: unexpected output {line!r}") from exc
        if not isinstance(value, dict):
            raise ChildFailed(f"{self.name}: unexpected output {line!r}")
        return value

    def close_stdin(self) -> None:
        """EOF on the child's stdin: how children that watch it (``--exit-on-stdin-eof``, the
        Lambda runtime) are asked to finish. Safe to call twice and without a stdin pipe."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def wait(self, timeout_seconds: float | None = None) -> int | None:
        """The exit code, or None if still running after ``timeout_seconds``."""
        try:
            return self.popen.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, signum: int = signal.SIGTERM, timeout_seconds: float = 10.0) -> int:
        """Signal the process group, wait up to the bound, then SIGKILL it; always reaps.

        A signal already sent is not sent again: many programs (the worker, uvicorn) treat a
        second SIGTERM as "stop draining, exit now". Safe to call twice and after an exit.
        """
        if self.alive():
            if signum not in self.signals_sent:
                self._signal_group(signum)
                self.signals_sent.append(signum)
            if self.wait(timeout_seconds) is None:
                self._signal_group(signal.SIGKILL)
        code = self.popen.wait()
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()
        return code

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signum)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log_path: Path | None = None,
    stdin_pipe: bool = False,
    capture_stdout: bool = False,
    inherit_stderr: bool = False,
) -> ChildProcess:
    """Start ``argv`` in its own session, dying with this process; output to ``log_path``.

    Without ``capture_stdout`` both stdout and stderr go to the log file (or /dev/null); with
    it, stdout is a pipe read by :meth:`ChildProcess.read_json_line`. ``inherit_stderr``
    leaves stderr on this process's own (where pytest captures it, say). ``cwd`` is for a
    ``-m`` module found from a directory, not installed (``python -m bench.faults``).
    """
    log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
    sink: Any = log if log is not None else subprocess.DEVNULL

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_stdout else sink,
            stderr=None if inherit_stderr else sink,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    try:
        popen = _spawner.submit(start).result()
    except OSError as exc:
        raise ChildFailed(f"cannot start {name}: {exc}") from exc
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor
    return ChildProcess(name, popen, log_path)


# =============================================================================================
# The child side: one signal policy, one stdin watcher, one ready line.
# =============================================================================================


class StopSignals:
    """SIGTERM/SIGINT as uvicorn's ``Server`` handles them; a context manager that installs
    the handlers on entry (main thread only) and restores the originals on exit.

    The first signal sets :attr:`should_exit`; a second one sets :attr:`force_exit` and
    restores the original handlers at once, so a third signal gets the default action. The
    main thread waits with :meth:`wait`; waits during the shutdown go through :meth:`join` /
    :meth:`sleep`, which return early once ``force_exit`` is set.

    The handler only *records*: it counts the signal and writes one byte to a self-pipe (the
    interpreter's wakeup fd too, see :func:`signal.set_wakeup_fd`, so a signal the kernel
    hands to another thread still wakes the waiting one). Python runs a handler in the main
    thread between two bytecodes of whatever it interrupted, and that may be the inside of
    a lock: a handler that sets a ``threading.Event`` can block forever on the Event's own
    lock when the interrupted code is that Event's ``wait`` (issue #28). Nothing here takes
    a lock in the handler; ``tests/unit/test_signal_handlers.py`` checks every handler in
    the tree for that.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    #: How often a shutdown wait looks at ``force_exit`` when it cannot wait on the pipe.
    POLL_SECONDS = 0.1

    def __init__(self) -> None:
        self._signals = 0  # written by the handler only
        self._requested = False  # request_stop(): a stop asked for by code, not by a signal
        self._originals: dict[int, Any] = {}
        self._wakeup_fd_before: int | None = None
        self._read_fd, self._write_fd = os.pipe()
        for fd in (self._read_fd, self._write_fd):
            os.set_blocking(fd, False)

    @property
    def should_exit(self) -> bool:
        """A stop was asked: one signal, or :meth:`request_stop`."""
        return self._signals > 0 or self._requested

    @property
    def force_exit(self) -> bool:
        """A second signal arrived: every shutdown wait ends now."""
        return self._signals > 1

    def __enter__(self) -> StopSignals:
        for signum in self.SIGNALS:
            self._originals[signum] = signal.signal(signum, self._handle)
        # The wakeup fd is one per process: take it only when nobody else (an asyncio loop
        # in this thread) has; without it a wait still polls, every POLL_SECONDS.
        before = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        if before == -1:
            self._wakeup_fd_before = before
        else:
            signal.set_wakeup_fd(before)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()
        if self._wakeup_fd_before is not None:
            signal.set_wakeup_fd(self._wakeup_fd_before)
            self._wakeup_fd_before = None
        fds, self._read_fd, self._write_fd = (self._read_fd, self._write_fd), -1, -1
        for fd in fds:  # a late wake() now writes to -1, never to a reused descriptor
            with contextlib.suppress(OSError):
                os.close(fd)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Record, wake, nothing else: no lock, no logging, no print, no raise.
        self._signals += 1
        if self._signals > 1:
            self.restore()
        self.wake()

    def wake(self) -> None:
        """Wake the thread in :meth:`wait` / :meth:`pause` (say, work it waits for is done).
        Any thread may call it; so does the handler."""
        with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
            os.write(self._write_fd, b"\0")

    def request_stop(self) -> None:
        """Ask for a graceful stop as a first signal would; any thread may call it."""
        self._requested = True
        self.wake()

    def restore(self) -> None:
        """Put the original handlers back. Safe to call twice."""
        originals, self._originals = self._originals, {}
        for signum, handler in originals.items():
            signal.signal(signum, handler)

    def pause(self, timeout_seconds: float | None, *, fds: Sequence[int] = ()) -> list[int]:
        """Block until the next wake (a signal, :meth:`wake`), a byte on one of ``fds``, or
        the timeout; returns the ``fds`` that are readable. For one thread at a time.

        The caller looks at :attr:`should_exit` / :attr:`force_exit` *before* it pauses: a
        signal in between has left its byte in the pipe, so the pause returns at once.
        """
        if self._wakeup_fd_before is None:  # no wakeup fd: a signal may land elsewhere
            poll = self.POLL_SECONDS
            timeout_seconds = poll if timeout_seconds is None else min(timeout_seconds, poll)
        ready, _, _ = select.select([self._read_fd, *fds], [], [], timeout_seconds)
        if self._read_fd in ready:
            with contextlib.suppress(OSError):
                os.read(self._read_fd, 4096)
        return [fd for fd in ready if fd != self._read_fd]

    def wait(self, timeout_seconds: float | None = None) -> bool:
        """Block until a stop is asked or the timeout; returns :attr:`should_exit`."""
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while not self.should_exit:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.pause(left)
        return self.should_exit

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; return early once ``force_exit`` is set."""
        deadline = time.monotonic() + seconds
        while not self.force_exit and (left := deadline - time.monotonic()) > 0:
            self.pause(left)

    def run(self, work: Callable[[], _T], *, name: str) -> _T | None:
        """``work()`` on a daemon thread while this (main) thread waits for signals: its
        result, or None when a stop was asked first. For start-up work a signal must not
        have to wait for (the backend's moto warm-up and provisioning): the thread is left
        to die with the process. ``work``'s exception is raised here."""
        results: list[_T] = []
        failures: list[BaseException] = []

        def target() -> None:
            try:
                results.append(work())
            except BaseException as exc:
                failures.append(exc)
            self.wake()  # after the result: the waiter below looks at it when it wakes

        threading.Thread(target=target, name=name, daemon=True).start()
        while not (results or failures or self.should_exit):
            self.pause(None)
        if failures:
            raise failures[0]
        return results[0] if results and not self.should_exit else None

    def join(self, thread: threading.Thread, timeout_seconds: float) -> None:
        """``thread.join(timeout_seconds)`` that gives up once ``force_exit`` is set."""
        deadline = time.monotonic() + timeout_seconds
        while thread.is_alive() and not self.force_exit:
            if (left := deadline - time.monotonic()) <= 0:
                return
            thread.join(min(left, self.POLL_SECONDS))


def _stdin_closed(fd: int) -> bool:
    """Read what ``select`` found waiting on ``fd`` (a pipe from the parent); True at EOF."""
    try:
        return not os.read(fd, 4096)
    except OSError:
        return True


def serve_until_stopped(
    ready: Mapping[str, Any], stop: StopSignals, *, exit_on_stdin_eof: bool = False
) -> None:
    """Announce ``ready`` as one JSON line on stdout, then block until a stop is asked.

    After the line, stdout is pointed at stderr: the parent reads exactly one line, and a
    later print into an unread pipe would fill it and block the child. With
    ``exit_on_stdin_eof`` an EOF on stdin (the parent closed it, or died) also stops.
    The main thread waits in ``select`` on the signal pipe (and stdin), never on a lock.

    Example (a child's ``main``)::

        with StopSignals() as stop, MyServer() as server:
            serve_until_stopped({"url": server.url}, stop, exit_on_stdin_eof=True)
    """
    sys.stdout.write(json.dumps(dict(ready)) + "\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    fds = (sys.stdin.fileno(),) if exit_on_stdin_eof else ()
    while not stop.should_exit:
        if any(_stdin_closed(fd) for fd in stop.pause(None, fds=fds)):
            stop.request_stop()
