"""Worker configuration: the shared :class:`~wsfleet.settings.Settings` plus worker-only knobs.

Everything comes from the environment. Every variable, the worker-only knobs included, is
listed once in :data:`wsfleet.settings.ENVIRONMENT` (the README's configuration table); the
knobs are its ``scope="worker"`` entries (:data:`WORKER_ENVIRONMENT`) and are parsed by the same
:func:`wsfleet.settings.read_environment` as the shared settings. This module only adds their
typed fields and the checks that concern this process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wsfleet.exceptions import ConfigurationError
from wsfleet.settings import ENVIRONMENT, EnvVar, Settings, read_environment

from .task_identity import TaskIdentity

__all__ = ["WORKER_ENVIRONMENT", "WorkerConfig"]

#: The entries of :data:`wsfleet.settings.ENVIRONMENT` that fill :class:`WorkerConfig`.
WORKER_ENVIRONMENT: tuple[EnvVar, ...] = tuple(v for v in ENVIRONMENT if v.scope == "worker")

_VARIABLE_OF_FIELD = {v.field: v.name for v in WORKER_ENVIRONMENT}

#: SQS accepts long-poll waits of 0 to 20 seconds.
_LONG_POLL_LIMIT_SECONDS = 20


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Settings for one worker process. Build with :meth:`from_env`."""

    settings: Settings = field(default_factory=Settings)
    hint_wait_seconds: int = 20
    control_wait_seconds: int = 20
    control_channel: bool = True
    metrics_flush_seconds: float = 60.0
    sweep_seconds: float = 30.0
    io_threads: int = 16
    write_threads: int = 4
    queue_frames: int = 10_000
    session_queue_frames: int = 500
    max_frame_bytes: int = 393_216
    queue_bytes: int = 128 * 1024 * 1024
    session_queue_bytes: int = 4 * 1024 * 1024
    max_seq_jump: int = 1_000_000
    message_timeout_seconds: float = 30.0
    breaker_max_failures: int = 5
    breaker_window_seconds: float = 600.0
    secret_cache_seconds: float = 60.0
    handoff_prepare_seconds: float = 3.0
    handoff_buffer_frames: int = 10_000
    #: The ECS task and container this process runs in (read from the task metadata
    #: endpoint at start, :mod:`wsfleet_worker.task_identity`); None outside ECS.
    task: TaskIdentity | None = None

    def __post_init__(self) -> None:
        for name in ("hint_wait_seconds", "control_wait_seconds"):
            value = getattr(self, name)
            if not 0 <= value <= _LONG_POLL_LIMIT_SECONDS:
                raise ConfigurationError(
                    f"{_VARIABLE_OF_FIELD[name]} must be between 0 and "
                    f"{_LONG_POLL_LIMIT_SECONDS} (SQS long poll), got {value}"
                )
        for name in (
            "io_threads", "write_threads", "queue_frames", "session_queue_frames",
            "max_frame_bytes", "queue_bytes", "session_queue_bytes", "handoff_buffer_frames",
        ):
            value = getattr(self, name)
            if value < 1:
                raise ConfigurationError(
                    f"{_VARIABLE_OF_FIELD[name]} must be at least 1, got {value}"
                )
        if self.max_seq_jump < 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['max_seq_jump']} must be 0 (off) or more, "
                f"got {self.max_seq_jump}"
            )
        if self.breaker_window_seconds < 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['breaker_window_seconds']} must be 0 (off) or more, "
                f"got {self.breaker_window_seconds}"
            )
        if self.message_timeout_seconds < 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['message_timeout_seconds']} must be 0 (off) or more, "
                f"got {self.message_timeout_seconds}"
            )
        if self.secret_cache_seconds < 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['secret_cache_seconds']} must be 0 (off) or more, "
                f"got {self.secret_cache_seconds}"
            )
        if self.handoff_prepare_seconds < 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['handoff_prepare_seconds']} must be 0 (off) or more, "
                f"got {self.handoff_prepare_seconds}"
            )
        if self.sweep_seconds <= 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['sweep_seconds']} must be positive, got {self.sweep_seconds}"
            )
        if self.metrics_flush_seconds <= 0:
            raise ConfigurationError(
                f"{_VARIABLE_OF_FIELD['metrics_flush_seconds']} must be positive, "
                f"got {self.metrics_flush_seconds}"
            )

    @property
    def heartbeat_ms(self) -> int:
        return int(self.settings.heartbeat_seconds * 1000)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerConfig:
        """Read the shared settings and the worker knobs; ``overrides`` win (tests)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "settings": Settings.from_env(env),
            **read_environment(cls, "worker", env),
        }
        return cls(**{**values, **overrides})
