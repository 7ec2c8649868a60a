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

from .bodies import connection_pk_field, decode_object, epoch_field
from .record import ConnectionRecord, DesiredState

__all__ = [
    "QUEUE_NAME_LIMIT",
    "WORKER_ID_TAG",
    "StopCommand",
    "control_queue_name",
    "stop_confirmed",
]

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
        payload = decode_object(body, what="control message")
        if payload.get("type") != "STOP":
            raise ValueError("control message is not a STOP")
        pk = connection_pk_field(payload, what="STOP")
        epoch = epoch_field(payload, what="STOP", required=True)
        assert epoch is not None
        return cls(pk, epoch)


def stop_confirmed(command: StopCommand, record: ConnectionRecord | None) -> bool:
    """Whether the connection record backs a STOP command (read with a consistent GetItem).

    A control queue is reachable by whoever may send to it, so a STOP is a hint to look, not an
    order: the session closes only if the record says so - the item is gone (DELETE), or it is
    STOPPED under the epoch the command names. Anything else (STARTED, or STOPPED under
    another epoch: a stale or forged command) leaves the stream running; the lease renewal
    still notices a real STOP within one heartbeat.

    >>> from wsfleet.record import ConnectionRecord, DesiredState
    >>> rec = ConnectionRecord(
    ...     pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="", lease_epoch=3
    ... )
    >>> stop_confirmed(StopCommand("CONN#a", 3), rec)
    False
    """
    if record is None:
        return True
    return (
        record.pk == command.pk
        and record.desired_state is DesiredState.STOPPED
        and record.lease_epoch == command.epoch
    )
