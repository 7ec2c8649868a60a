"""The control channel: STOP delivered straight to the worker that owns a connection.

Each worker creates its own SQS queue named ``<prefix><worker-id>`` at start (tagged with its
worker id), registers it in its worker item, and deletes it on a graceful exit. The stream
notifier looks up the owner's worker item and sends a :class:`StopCommand` there, so STOP takes
effect in milliseconds instead of at the next heartbeat.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from .record import CONNECTION_PREFIX

__all__ = ["QUEUE_NAME_LIMIT", "WORKER_ID_TAG", "StopCommand", "control_queue_name"]

#: SQS queue names: 1-80 characters of [A-Za-z0-9_-].
QUEUE_NAME_LIMIT = 80
#: Tag on each control queue naming its worker, so orphaned queues can be traced back.
WORKER_ID_TAG = "wsfleet:worker_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def control_queue_name(prefix: str, worker_id: str) -> str:
    """A valid, deterministic SQS queue name for a worker's control queue.

    Characters SQS refuses become ``-``; names too long keep their start and gain a short hash
    so two long worker ids never collide.

    >>> control_queue_name("app-ctl-", "ip-10-0-0-1.ec2.internal-7-ab12cd")
    'app-ctl-ip-10-0-0-1-ec2-internal-7-ab12cd'
    """
    name = prefix + _UNSAFE.sub("-", worker_id)
    if len(name) <= QUEUE_NAME_LIMIT:
        return name
    digest = hashlib.sha256(worker_id.encode()).hexdigest()[:10]
    return f"{name[:QUEUE_NAME_LIMIT - 11]}-{digest}"


@dataclass(frozen=True)
class StopCommand:
    """Close connection ``pk`` if you still hold it under ``epoch``."""

    pk: str
    epoch: int

    def body(self) -> str:
        command = {"type": "STOP", "pk": self.pk, "epoch": self.epoch}
        return json.dumps(command, separators=(",", ":"))

    @classmethod
    def parse(cls, body: str) -> StopCommand:
        """ValueError for anything that is not a well-formed STOP command."""
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ValueError(f"control message is not JSON: {exc}") from None
        if not isinstance(payload, dict) or payload.get("type") != "STOP":
            raise ValueError("control message is not a STOP")
        pk, epoch = payload.get("pk"), payload.get("epoch")
        if not isinstance(pk, str) or not pk.startswith(CONNECTION_PREFIX):
            raise ValueError("STOP has no connection pk")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ValueError("STOP has no integer epoch")
        return cls(pk, epoch)
