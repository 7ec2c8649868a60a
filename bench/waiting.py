"""Wait for a condition, never for a guessed number of seconds: the one poll loop of the tests,
the chaos runner and the benchmarks.

A fixed sleep is either too short on a loaded machine (a flaky failure) or too long everywhere
else (a slow suite); polling a condition up to a generous bound is neither. The bound is only a
safety net: a healthy run never gets near it, so it says nothing about speed (that is bench/'s
job).

Example::

    record = wait_until(lambda: store.get(pk), timeout=30, message="the record")
    await wait_until_async(lambda: not sim.open_sessions("s"), timeout=10)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["WaitTimeout", "wait_until", "wait_until_async"]

_T = TypeVar("_T")

#: How to say what was waited for: a text, or a function building one at the timeout (a log
#: tail, say, read only when it is needed).
Message = str | Callable[[], str]


class WaitTimeout(TimeoutError):
    """A condition was still false when the wait's bound ran out."""


def _timed_out(timeout: float, message: Message) -> WaitTimeout:
    text = message() if callable(message) else message
    return WaitTimeout(f"timed out after {timeout:g} s: {text}")


def wait_until(
    # _T | None: a condition that returns None until it holds still waits for a _T.
    condition: Callable[[], _T | None],
    message: Message = "condition not met",
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> _T:
    """Return the first truthy value of ``condition()``, polled every ``interval`` seconds;
    raise :class:`WaitTimeout` once ``timeout`` seconds pass without one. The condition is
    checked once more at the deadline, so a slow poll never loses a last chance."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, message)
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], _T | Awaitable[_T]],
    message: Message = "condition not met",
    *,
    # The same bound as the sync wait, so that its error names what was waited for.
    timeout: float = 30.0,  # noqa: ASYNC109
    interval: float = 0.01,
) -> _T:
    """:func:`wait_until` inside an event loop: the loop keeps running between polls, and the
    condition may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, message)
        await asyncio.sleep(interval)
