"""Small doubles the worker's tests share (unit and in-process integration ones): an async
test runner and a recording logger. It lives in tests/, which pytest puts on ``sys.path`` for
tests/conftest.py, so both tiers import it by name.

Example::

    @sync
    async def test_something():
        logger = Logger()
        ...
        assert logger.count("hint failed") == 1
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Logger", "sync"]


def sync(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test body in a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


class Logger:
    """Stands in for the Powertools logger: every call at any level is kept as
    ``(level, message, extra)``."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        def log(message: str, *args: Any, extra: Any = None, **kwargs: Any) -> None:
            self.lines.append((level, message, extra or {}))

        return log

    def messages(self) -> list[str]:
        return [message for _, message, _ in self.lines]

    def count(self, message: str) -> int:
        return self.messages().count(message)

    def extras(self, message: str) -> list[dict[str, Any]]:
        """The ``extra`` of every line logged with ``message``, in order."""
        return [extra for _, text, extra in self.lines if text == message]
