"""Worker configuration: the shared :class:`~wsfleet.settings.Settings` plus worker-only knobs.

Everything comes from the environment. The shared variables (lease, heartbeat, tables, queue,
MAX_CONNECTIONS, ...) are documented in :data:`wsfleet.settings.ENVIRONMENT`. The knobs below
only tune this process; their defaults are what production wants and tests shorten them:

=============================  =========  ===================================================
Variable                       Default    Meaning
=============================  =========  ===================================================
WORKER_HINT_WAIT_SECONDS       20         Hint-queue long-poll wait (SQS allows 0-20).
WORKER_CONTROL_WAIT_SECONDS    20         Control-queue long-poll wait.
WORKER_CONTROL_CHANNEL         true       Create and consume a control queue (false: STOP is
                                          only noticed by the next renewal).
WORKER_METRICS_FLUSH_SECONDS   60         EMF metrics are printed this often.
WORKER_IO_THREADS              16         Threads for DynamoDB/SQS lease calls.
WORKER_WRITE_THREADS           4          Message batches written concurrently.
WORKER_QUEUE_FRAMES            10000      Frames queued for writing (all connections) before
                                          sessions stop reading their sockets.
WORKER_SESSION_QUEUE_FRAMES    500        Frames one connection may have in flight.
WORKER_MAX_FRAME_BYTES         393216     Largest accepted frame (DynamoDB items max 400 KB).
=============================  =========  ===================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wsfleet.exceptions import ConfigurationError
from wsfleet.settings import Settings

__all__ = ["WORKER_ENVIRONMENT", "WorkerConfig"]

#: (variable, field, default) of every worker-only knob.
WORKER_ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    ("WORKER_HINT_WAIT_SECONDS", "hint_wait_seconds", "20"),
    ("WORKER_CONTROL_WAIT_SECONDS", "control_wait_seconds", "20"),
    ("WORKER_CONTROL_CHANNEL", "control_channel", "true"),
    ("WORKER_METRICS_FLUSH_SECONDS", "metrics_flush_seconds", "60"),
    ("WORKER_IO_THREADS", "io_threads", "16"),
    ("WORKER_WRITE_THREADS", "write_threads", "4"),
    ("WORKER_QUEUE_FRAMES", "queue_frames", "10000"),
    ("WORKER_SESSION_QUEUE_FRAMES", "session_queue_frames", "500"),
    ("WORKER_MAX_FRAME_BYTES", "max_frame_bytes", "393216"),
)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Settings for one worker process. Build with :meth:`from_env`."""

    settings: Settings = field(default_factory=Settings)
    hint_wait_seconds: int = 20
    control_wait_seconds: int = 20
    control_channel: bool = True
    metrics_flush_seconds: float = 60.0
    io_threads: int = 16
    write_threads: int = 4
    queue_frames: int = 10_000
    session_queue_frames: int = 500
    max_frame_bytes: int = 393_216

    def __post_init__(self) -> None:
        for name in ("hint_wait_seconds", "control_wait_seconds"):
            if not 0 <= getattr(self, name) <= 20:
                raise ConfigurationError(f"{name} must be between 0 and 20 (SQS long poll)")
        for name in ("io_threads", "write_threads", "queue_frames", "session_queue_frames"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")
        if self.metrics_flush_seconds <= 0:
            raise ConfigurationError("WORKER_METRICS_FLUSH_SECONDS must be positive")

    @property
    def heartbeat_ms(self) -> int:
        return int(self.settings.heartbeat_seconds * 1000)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerConfig:
        """Read the shared settings and the worker knobs; ``overrides`` win (tests)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"settings": Settings.from_env(env)}
        defaults = cls()
        for name, field_name, _default in WORKER_ENVIRONMENT:
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            kind = type(getattr(defaults, field_name))
            values[field_name] = _convert(name, raw, kind)
        values.update(overrides)
        return cls(**values)


def _convert(name: str, raw: str, kind: type) -> Any:
    if kind is bool:
        value = raw.strip().lower()
        if value in {"1", "true", "yes", "on"}:
            return True
        if value in {"0", "false", "no", "off"}:
            return False
        raise ConfigurationError(f"{name} must be true or false, got {raw!r}")
    try:
        return kind(float(raw)) if kind is int and "." in raw else kind(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None
