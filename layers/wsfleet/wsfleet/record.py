"""The items wsfleet keeps in the connections table.

* A **connection item** (``pk = "CONN#<connection_id>"``) is both the desired state of one
  upstream stream and its lease: who holds it, until when, under which epoch, and how far the
  durable checkpoint (``last_seq``) has got.
* A **worker item** (``pk = "WORKER#<worker_id>"``) registers a live worker and the control
  queue that STOP notifications for its connections are sent to. It has no ``desired_state``,
  so it never appears in the orphan GSI.

Records are immutable values; converting to and from plain DynamoDB items (already
deserialized to Python types) is all this module does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "CONNECTION_ID_PATTERN",
    "CONNECTION_PREFIX",
    "WORKER_PREFIX",
    "ConnectionRecord",
    "DesiredState",
    "WorkerRecord",
    "connection_id_from_pk",
    "connection_pk",
    "is_valid_connection_id",
    "worker_pk",
]

CONNECTION_PREFIX = "CONN#"
WORKER_PREFIX = "WORKER#"
CONNECTION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class DesiredState(StrEnum):
    """What the API asked for. The lease says what is actually happening."""

    STARTED = "STARTED"
    STOPPED = "STOPPED"
    #: Terminal until a new START: the crash-loop breaker tripped (see
    #: :func:`wsfleet.lease.breaker_verdict`); ``stop_reason`` and ``last_error`` say why.
    FAILED = "FAILED"


def is_valid_connection_id(connection_id: str) -> bool:
    """Connection ids are 1-128 characters of ``[A-Za-z0-9._:-]``."""
    return bool(CONNECTION_ID_PATTERN.fullmatch(connection_id))


def connection_pk(connection_id: str) -> str:
    """``"abc"`` -> ``"CONN#abc"``."""
    return f"{CONNECTION_PREFIX}{connection_id}"


def connection_id_from_pk(pk: str) -> str:
    """``"CONN#abc"`` -> ``"abc"``; raises ValueError for any other key."""
    if not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"not a connection key: {pk!r}")
    return pk[len(CONNECTION_PREFIX):]


def worker_pk(worker_id: str) -> str:
    """``"w1"`` -> ``"WORKER#w1"``."""
    return f"{WORKER_PREFIX}{worker_id}"


def _int(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = item.get(name)
    return default if value is None else int(value)


def _opt_str(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value)


@dataclass(frozen=True, kw_only=True)
class ConnectionRecord:
    """One connection item. ``lease_owner == ""`` and ``lease_expires_at_ms == 0`` mean free."""

    pk: str
    desired_state: DesiredState
    ws_url: str
    last_seq: int = 0
    lease_owner: str = ""
    lease_expires_at_ms: int = 0
    lease_epoch: int = 0
    created_at_ms: int = 0
    updated_at_ms: int = 0
    stop_reason: str | None = None
    last_error: str | None = None
    resume: bool = True
    #: Crash-loop breaker: failures counted so far, all at checkpoint ``failure_seq``. Kept on
    #: the item (not in a worker) so the count survives hand-overs between workers.
    failure_count: int = 0
    failure_seq: int | None = None

    @property
    def connection_id(self) -> str:
        return connection_id_from_pk(self.pk)

    @classmethod
    def new(cls, connection_id: str, ws_url: str, now_ms: int) -> ConnectionRecord:
        """A freshly STARTED connection with no lease and nothing received yet."""
        return cls(
            pk=connection_pk(connection_id),
            desired_state=DesiredState.STARTED,
            ws_url=ws_url,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
        )

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ConnectionRecord:
        """Build from a deserialized DynamoDB item (numbers may be ``Decimal``)."""
        return cls(
            pk=str(item["pk"]),
            desired_state=DesiredState(item.get("desired_state", DesiredState.STOPPED)),
            ws_url=str(item.get("ws_url", "")),
            last_seq=_int(item, "last_seq"),
            lease_owner=str(item.get("lease_owner", "")),
            lease_expires_at_ms=_int(item, "lease_expires_at_ms"),
            lease_epoch=_int(item, "lease_epoch"),
            created_at_ms=_int(item, "created_at_ms"),
            updated_at_ms=_int(item, "updated_at_ms"),
            stop_reason=_opt_str(item, "stop_reason"),
            last_error=_opt_str(item, "last_error"),
            resume=bool(item.get("resume", True)),
            failure_count=_int(item, "failure_count"),
            failure_seq=None if item.get("failure_seq") is None else int(item["failure_seq"]),
        )

    def to_item(self) -> dict[str, Any]:
        """A plain item for PutItem; ``None`` fields are left out rather than stored as NULL."""
        item = asdict(self)
        item["desired_state"] = str(self.desired_state)
        return {k: v for k, v in item.items() if v is not None}

    def with_changes(self, **changes: Any) -> ConnectionRecord:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class WorkerRecord:
    """A live worker and where to reach it. ``expires_at_ms`` is renewed with its heartbeat."""

    worker_id: str
    control_queue_url: str
    started_at_ms: int
    heartbeat_at_ms: int
    expires_at_ms: int
    connection_count: int = 0

    @property
    def pk(self) -> str:
        return worker_pk(self.worker_id)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> WorkerRecord:
        return cls(
            worker_id=str(item["worker_id"]),
            control_queue_url=str(item.get("control_queue_url", "")),
            started_at_ms=_int(item, "started_at_ms"),
            heartbeat_at_ms=_int(item, "heartbeat_at_ms"),
            expires_at_ms=_int(item, "expires_at_ms"),
            connection_count=_int(item, "connection_count"),
        )

    def to_item(self) -> dict[str, Any]:
        return {"pk": self.pk, **asdict(self)}
