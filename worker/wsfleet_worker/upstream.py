"""Opening upstream WebSocket connections cheaply.

A worker holds thousands of connections, so per-connection costs matter more than features:

* ``compression=None``: a permessage-deflate context costs hundreds of KB per connection.
* one shared TLS context for every ``wss://`` connection (asyncio would otherwise build, and
  load the CA bundle into, a new one per connection).
* ``max_queue`` small: frames are handed to the write queue at once, so a deep per-connection
  buffer only adds memory. ``max_size`` bounds one frame (DynamoDB items are <= 400 KB).
* ``write_limit`` small: the worker sends nothing but pongs and close frames.

Errors: :func:`is_permanent` separates URLs that can never work from transient failures.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidURI

from .frames import redact_url

__all__ = ["Connector", "describe_error", "is_permanent", "make_connector"]

Connector = Callable[[str], Awaitable[ClientConnection]]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


@cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def make_connector(
    *,
    max_frame_bytes: int = 393_216,
    max_queue: int = 4,
    open_timeout: float = 10.0,
    ping_interval: float | None = 20.0,
    close_timeout: float = 2.0,
) -> Connector:
    """A coroutine function ``connect(url) -> ClientConnection`` with wsfleet's limits."""

    async def open_connection(url: str) -> ClientConnection:
        options: dict[str, Any] = {}
        if url.lower().startswith("wss:"):
            options["ssl"] = _tls_context()
        return await connect(
            url,
            compression=None,
            max_size=max_frame_bytes,
            max_queue=max_queue,
            write_limit=4096,
            open_timeout=open_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_interval,
            close_timeout=close_timeout,
            user_agent_header="wsfleet-worker",
            **options,
        )

    return open_connection


def is_permanent(exc: BaseException) -> bool:
    """True for connect failures that retrying cannot fix (a malformed ``ws_url``)."""
    return isinstance(exc, (InvalidURI, ValueError)) and not isinstance(exc, OSError)


def describe_error(exc: BaseException) -> str:
    """A short description for logs and ``last_error``; URLs in it are redacted.

    >>> describe_error(ValueError("wss://u:pw@h/s?token=x isn't valid"))
    "ValueError: wss://h/s isn't valid"
    """
    text = _URL.sub(lambda m: redact_url(m.group(0)), str(exc))
    return f"{type(exc).__name__}: {text}"[:300]
