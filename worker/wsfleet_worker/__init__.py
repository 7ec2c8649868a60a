"""wsfleet Fargate worker: SQS hints, lease acquisition, the worker lease and WebSocket sessions.

Run it with ``python -m wsfleet_worker`` (configuration only from the environment; see
:mod:`wsfleet.settings` and :mod:`wsfleet_worker.config`). The health check is
``python -m wsfleet_worker.health``.

Layout, sans-I/O core first:

* :mod:`.frames`, :mod:`.checkpoint`, :mod:`.session_rules` - pure decisions (frame parsing,
  resume URLs, checkpoint rule, exit plans, backoff, hint triage); the lease rules and the
  worker lease's timing are :mod:`wsfleet.lease`;
* :mod:`.session` - one connection as one task group;
* :mod:`.flusher` - one BatchWriteItem writer for all sessions;
* :mod:`.liveness` - the worker's one lease: renewal and self-fence;
* :mod:`.sqs_consumer` - the one SQS receive loop, under :mod:`.poller` (the hint queue) and
  :mod:`.control_channel` (the worker's STOP queue);
* :mod:`.taking` - the lease taker: free slots, acquire, hand back; :mod:`.outbox` - the
  hints this worker sends;
* :mod:`.sweep` - the worker's own connections in gsi_owner against its sessions;
* :mod:`.parts` - what every role above acts through (id, store, pools, metrics, clock);
* :mod:`.worker` - builds the parts, start, run, graceful shutdown;
  :mod:`.health` - container health check.

Names resolve lazily so ``python -m wsfleet_worker.health`` does not import boto3.
"""

from __future__ import annotations

from typing import Any

from wsfleet.lazy_exports import resolve_export

_EXPORTS = {
    "CheckpointTracker": "checkpoint",
    "ExitReason": "session_rules",
    "Frame": "frames",
    "FrameKind": "frames",
    "Session": "session",
    "Worker": "worker",
    "WorkerConfig": "config",
    "main": "worker",
    "parse_frame": "frames",
    "resume_url": "frames",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return resolve_export(__name__, _EXPORTS, name)
