"""Retries as two small pieces: a classifier and a delay generator.

``backoff()`` yields "full jitter" exponential delays (AWS Architecture Blog, *Exponential
Backoff And Jitter*): ``uniform(0, min(cap, base * factor**n))``. The caller sleeps, retries,
and starts a fresh generator after a success so the delay resets.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from botocore.exceptions import (
    ClientError,
    ConnectionError as BotoConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

__all__ = ["THROTTLING_CODES", "backoff", "is_ambiguous", "is_throttling"]

THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "Throttling",
    "TooManyRequestsException",
    "RequestThrottled",
    "RequestThrottledException",
})


def backoff(
    *,
    initial: float = 0.05,
    factor: float = 2.0,
    cap: float = 5.0,
    rng: random.Random | None = None,
) -> Iterator[float]:
    """Endless full-jitter exponential delays in seconds.

    >>> delays = backoff(initial=1, cap=4, rng=random.Random(0))
    >>> all(0 <= next(delays) <= 4 for _ in range(10))
    True
    """
    draw = (rng or random).uniform
    ceiling = initial
    while True:
        yield draw(0, ceiling)
        ceiling = min(cap, ceiling * factor)


def is_throttling(exc: BaseException) -> bool:
    """DynamoDB/SQS asked us to slow down."""
    return (
        isinstance(exc, ClientError)
        and exc.response.get("Error", {}).get("Code") in THROTTLING_CODES
    )


def is_ambiguous(exc: BaseException) -> bool:
    """The write may or may not have happened: timeouts, dropped connections, 5xx.

    After such a failure the only honest next step is to read the item and look. Throttling
    is not ambiguous: a throttled request was refused before it was applied.
    """
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, BotoConnectionError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500
    return False
