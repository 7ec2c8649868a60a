"""Container health check: is the worker's event loop still turning?

The worker touches HEALTH_FILE on every housekeeping tick (once per HEARTBEAT_EVERY) from the
event loop itself, so a stale file means the loop is blocked or dead, not merely that some
connection is unhappy. ECS runs::

    python -m wsfleet_worker.health

which exits 0 if the file was touched within 3 heartbeats and 1 otherwise. It imports nothing
heavy (no boto3) so it is cheap to run every few seconds.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from wsfleet.settings import Settings

__all__ = ["STALE_AFTER_HEARTBEATS", "is_fresh", "main", "touch"]

STALE_AFTER_HEARTBEATS = 3


def touch(path: str | os.PathLike[str]) -> None:
    """Mark the worker alive now (creates the file if needed)."""
    Path(path).touch()


def is_fresh(
    path: str | os.PathLike[str], max_age_seconds: float, *, now: float | None = None
) -> bool:
    """True if ``path`` exists and was modified less than ``max_age_seconds`` ago."""
    try:
        modified = os.stat(path).st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - modified < max_age_seconds


def main(argv: list[str] | None = None) -> int:
    """Exit status for the health check: 0 healthy, 1 stale or missing."""
    settings = Settings.from_env()
    if is_fresh(settings.health_file, STALE_AFTER_HEARTBEATS * settings.heartbeat_seconds):
        return 0
    print(f"unhealthy: {settings.health_file} missing or older than "
          f"{STALE_AFTER_HEARTBEATS} heartbeats", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
