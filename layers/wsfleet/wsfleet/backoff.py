"""Retry delays: a pure generator (the classifiers of AWS errors are in :mod:`wsfleet.aws`).

``backoff()`` yields "full jitter" exponential delays (AWS Architecture Blog, *Exponential
Backoff And Jitter*): ``uniform(0, min(cap, base * factor**n))``. The caller sleeps, retries,
and starts a fresh generator after a success so the delay resets.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["backoff"]


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
