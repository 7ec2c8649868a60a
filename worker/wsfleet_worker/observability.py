"""Logs and metrics of the worker: Powertools JSON logs and CloudWatch EMF on stdout.

Metrics are aggregated in memory and printed as one EMF document per interval (Fargate's
awslogs driver ships stdout; CloudWatch extracts the metrics). Per-event EMF lines would cost a
log line per frame, so counters are summed, and latency-like values keep their maximum (and
sample count) per interval.

Every metric carries exactly one dimension, ``ServiceName`` (SERVICE_NAME), which is what the
ECS autoscaling policy on ``ActiveConnections`` selects on.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import (
    AmazonCloudWatchEMFProvider,
)

__all__ = ["COUNTERS", "GAUGES", "MAXIMA", "WorkerMetrics", "make_logger"]

#: Summed per interval (unit Count). The list documents them; any name may be counted.
COUNTERS = (
    "MessagesReceived",
    "MessagesWritten",
    "MessageWriteRequests",
    "MessagesRejected",
    "InvalidFrames",
    "NoSeqFrames",
    "DuplicateFrames",
    "LeaseLost",
    "SelfFenced",  # sessions fenced because the worker lease was over (either cause below)
    "WorkerSelfFenced",  # the worker lease's self-fence deadline passed without a renewal
    "WorkerDead",  # a renewal was refused: a peer killed the worker lease (or its item is gone)
    "FencedFramesDropped",
    "AcquireConflicts",
    "EarlyHintWaits",
    "Acquired",
    "Reconnects",
    "RenewFailures",  # worker lease renewals that failed and were retried
    "CheckpointWrites",
    "CheckpointFailures",
    "FinalWriteRetries",
    "SweepStops",
    "SweepReleases",
    "SweepFenced",
    "SweepFailures",
    "InvalidHints",
    "HintFailures",
    "StopCommands",
    "InvalidControlMessages",
    "ControlMessageFailures",
    "UnconfirmedStops",
    "ResumeGaps",  # resumes whose first frame skipped past the checkpoint (resume none, ...)
    "ResumeGapFrames",  # frames skipped by those resumes: what the upstream never delivered
    "GapWriteFailures",  # gap totals that could not be stored yet (retried)
    "CredentialFailures",  # connects whose secret could not be read (counted by the breaker)
    "MessageTimeouts",  # connections failed (1008) for a message incomplete too long
    "CredentialRefreshes",  # secrets read again after a 401/403 handshake (rotation)
    "RebalanceGiven",  # connections handed off to a less loaded peer
    "RebalanceFailures",  # fleet view reads that failed, hand-off sends that raised
    "HandoffHints",  # hand-offs received on the control queue
    "HandoffMessages",  # make-before-break PREPARE/READY/DECLINE/COMMIT received
    "HandoffOverlaps",  # giver: moves that ended in a transfer (make-before-break)
    "HandoffBreaks",  # giver: overlap moves that fell back to break-before-make
    "HandoffsTransferred",  # giver sessions whose transfer write landed
    "HandoffsAdopted",  # taker: prepared sessions that came to own their connection
    "HandoffDeclines",  # taker: PREPAREs declined (full, draining, moved, budget, no frame)
    "HandoffBufferFull",  # taker: prepared sessions over their frame or byte budget
    "UnconfirmedHandoffs",  # PREPARE/COMMIT not backed by the record (stale or forged)
    "PlacementDeferrals",  # hint-queue receives delayed because this worker is over its share
)
#: Last value per interval (unit Count).
GAUGES = ("ActiveConnections", "QueuedFrames")
#: Maximum per interval (unit Milliseconds).
#: CheckpointLagMs: receipt of a frame -> a checkpoint covering it stored (so up to about
#: CHECKPOINT_SECONDS). RenewLatenessMs: a worker lease renewal's completion -> when it was due.
MAXIMA = ("CheckpointLagMs", "RenewLatenessMs", "FlushLatencyMs")


def make_logger(service_name: str, worker_id: str) -> Logger:
    """A JSON logger on stdout that stamps every line with ``worker_id``.

    Callers add ``connection_id`` and ``epoch`` per line (``extra=``). Never pass an upstream
    URL unredacted (see :func:`wsfleet.upstream_url.redact_url`).
    """
    logger = Logger(
        service=service_name,
        level=os.environ.get("POWERTOOLS_LOG_LEVEL") or os.environ.get("LOG_LEVEL") or "INFO",
        logger_handler=logging.StreamHandler(sys.stdout),
    )
    logger.append_keys(worker_id=worker_id)
    return logger


class WorkerMetrics:
    """Thread-safe in-memory aggregation, printed as EMF by :meth:`flush`.

    >>> m = WorkerMetrics("wsfleet-worker", namespace="wsfleet", emit=lambda doc: None)
    >>> m.count("MessagesReceived", 3); m.observe("RenewLatenessMs", 12)
    >>> m.snapshot()["MessagesReceived"]
    3
    """

    def __init__(
        self,
        service_name: str,
        *,
        namespace: str | None = None,
        emit: Any = None,
    ) -> None:
        self.service_name = service_name
        self.namespace = namespace or os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "wsfleet"
        self._lock = threading.Lock()
        self._counters: Counter[str] = Counter()
        self._gauges: dict[str, float] = {}
        self._maxima: dict[str, float] = {}
        self._samples: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()  # since start, never reset (status, tests, bench)
        self.peaks: dict[str, float] = {}  # maxima since start
        self._emit = emit

    def count(self, name: str, value: int = 1) -> None:
        with self._lock:
            self._counters[name] += value
            self.totals[name] += value

    def gauge(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def observe(self, name: str, value: float) -> None:
        """Keep the interval's maximum of a latency-like value."""
        with self._lock:
            if value > self._maxima.get(name, float("-inf")):
                self._maxima[name] = value
            self._samples[name] += 1
            if value > self.peaks.get(name, float("-inf")):
                self.peaks[name] = value

    def snapshot(self) -> dict[str, float]:
        """The current interval's values (not reset)."""
        with self._lock:
            return {**self._counters, **self._gauges, **self._maxima}

    def flush(self) -> dict[str, Any] | None:
        """Print one EMF document with everything since the last flush, then reset."""
        with self._lock:
            counters, gauges, maxima = dict(self._counters), dict(self._gauges), dict(self._maxima)
            samples = dict(self._samples)
            self._counters.clear()
            self._maxima.clear()
            self._samples.clear()
        if not (counters or gauges or maxima):
            return None
        provider = AmazonCloudWatchEMFProvider(
            namespace=self.namespace,
            service="",  # no implicit "service" dimension: ServiceName is the only one
            default_dimensions={"ServiceName": self.service_name},
        )
        for name, count in sorted(counters.items()):
            provider.add_metric(name=name, unit="Count", value=count)
        for name, level in gauges.items():
            provider.add_metric(name=name, unit="Count", value=level)
        for name, peak in maxima.items():
            provider.add_metric(name=name, unit="Milliseconds", value=peak)
            provider.add_metadata(key=f"{name}Samples", value=samples.get(name, 0))
        document: dict[str, Any] = dict(provider.serialize_metric_set())
        if self._emit is not None:
            self._emit(document)
        else:
            import json

            sys.stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        return document
