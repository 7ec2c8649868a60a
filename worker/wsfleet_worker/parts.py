"""What every role of a worker acts through: its id, the lease store, the thread pools, its
metrics and logger, and the clock.

The roles (:mod:`.liveness`, :mod:`.taking`, :mod:`.rebalancing`, :mod:`.sweep`) each take one
:class:`WorkerParts`, built once by :class:`~wsfleet_worker.worker.Worker`, and keep it
through :class:`WorkerRole` under the names their code uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wsfleet.clock import Clock, now_ms
from wsfleet.store import LeaseStore

from .observability import WorkerMetrics
from .offload import Offloader

__all__ = ["WorkerParts", "WorkerRole"]


@dataclass(frozen=True, kw_only=True)
class WorkerParts:
    """The shared means of a worker's roles.

    :param leases: the lease store (the liveness task gets the one renewals go through, see
        :meth:`~wsfleet_worker.worker.Worker.from_config`).
    :param offloader: the thread pools every blocking call runs on.
    :param clock: wall clock in epoch ms, injectable for tests.
    """

    worker_id: str
    leases: LeaseStore
    offloader: Offloader
    metrics: WorkerMetrics
    logger: Any
    clock: Clock = now_ms


class WorkerRole:
    """Base of a role: the parts as attributes."""

    def __init__(self, parts: WorkerParts) -> None:
        self.worker_id = parts.worker_id
        self._leases = parts.leases
        self._offloader = parts.offloader
        self._metrics = parts.metrics
        self._logger = parts.logger
        self._clock = parts.clock
