"""The one wall clock wsfleet reads.

Lease expiry is compared across machines, so it must be wall time (epoch milliseconds), not a
monotonic clock. Everything that needs "now" takes a ``Clock`` so tests can pin it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "now_ms"]

Clock = Callable[[], int]


def now_ms() -> int:
    """Current wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000
