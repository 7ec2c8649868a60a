"""Blocking boto3 calls, run off the event loop on bounded thread pools.

boto3 is synchronous. Calling it on the event loop would stall every connection of the worker
for the length of each HTTP round trip (the article's worker did exactly that). Small
pools keep the kinds of work from starving each other:

* ``lease``: one thread for the worker lease's renewal alone. Every connection lives by it, so
  it must never queue behind anything: not behind a thousand releases of a drain, a burst of
  checkpoints or acquires on ``io``, nor behind message writes.
* ``io``: connection-item writes and reads (acquire, checkpoint, release, sweep reads).
* ``sqs``: SQS sends and deletes (hints for released connections, acknowledged hint and
  control messages). During a drain, a worker with a thousand connections queues a thousand
  releases on ``io``; the hints for those already released must not wait behind the rest.
* ``write``: message batches (BatchWriteItem), bounded so a burst of frames cannot take every
  thread.
* ``poll``: SQS long polls, which park a thread for up to 20 s each. Each runs on its own
  daemon thread: at exit the interpreter joins pool threads, and a process that has finished
  draining must not wait up to 20 s for a receive whose answer it no longer wants.

A call cancelled on the loop side still finishes in its thread; callers treat the outcome as
unknown, which every wsfleet write tolerates (conditional or idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["Offloader"]

_T = TypeVar("_T")


class Offloader:
    """Bounded thread pools and ``await``-able helpers to run calls on them."""

    def __init__(
        self, *, io_threads: int = 16, write_threads: int = 4, sqs_threads: int = 4
    ) -> None:
        self._lease = ThreadPoolExecutor(1, thread_name_prefix="wsfleet-lease")
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="wsfleet-io")
        self._write = ThreadPoolExecutor(write_threads, thread_name_prefix="wsfleet-write")
        self._sqs = ThreadPoolExecutor(sqs_threads, thread_name_prefix="wsfleet-sqs")

    @staticmethod
    async def _run(
        pool: ThreadPoolExecutor, fn: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    async def lease(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """The worker lease's renewal (a pool of its own; see the module docstring)."""
        return await self._run(self._lease, fn, *args, **kwargs)

    async def io(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self._run(self._io, fn, *args, **kwargs)

    async def write(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self._run(self._write, fn, *args, **kwargs)

    async def sqs(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self._run(self._sqs, fn, *args, **kwargs)

    async def poll(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run a long poll on a fresh daemon thread (never joined at exit)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def settle(outcome: Callable[[], None]) -> None:
            if not future.done():
                outcome()

        def target() -> None:
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine
                error = exc
                _call_soon(loop, settle, lambda: future.set_exception(error))
            else:
                _call_soon(loop, settle, lambda: future.set_result(result))

        threading.Thread(target=target, name="wsfleet-poll", daemon=True).start()
        return await future

    def shutdown(self) -> None:
        """Stop accepting work; calls still running are not waited for."""
        for pool in (self._lease, self._io, self._write, self._sqs):
            pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(fn, *args)
