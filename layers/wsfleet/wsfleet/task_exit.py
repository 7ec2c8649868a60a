"""Crash failover from ECS's task exit event: the pure rules (no boto3, no clock, no I/O).

A worker killed by SIGKILL, the OOM killer or a lost host cannot retire its lease, so its
connections would stay dark until the lease expires (``LEASE_SECONDS``). ECS knows sooner: it
publishes an ``ECS Task State Change`` event to EventBridge as soon as a task's containers
stop. The task exit function (``functions/task_exit``) turns that event into a kill of the
incarnations that ran in the stopped container (a fenced conditional write of ``dead_at_ms``,
:meth:`wsfleet.store.LeaseStore.kill_exited_worker`) and hints their connections at once; the
normal takeover path then applies (a dead owner is taken over without waiting).

What this module decides:

* **Has the worker container stopped?** (:func:`container_stop`.) ECS first sets
  ``desiredStatus`` STOPPED and sends SIGTERM, and the worker drains; only the container's own
  ``lastStatus`` STOPPED says the process is gone. A task whose worker container still runs is
  never failed over this way, whatever else the event says.
* **Which incarnations ran in it?** (:func:`ran_in`.) A worker's identity is the task plus an
  incarnation made at process start (``<task_id>.<host>-<pid>-<random>``, then ``+2``, ``+3``
  for each new lease in the same process), and its worker item names the task ARN and the
  container's runtime id. ECS can restart a container inside the same task; the new container
  has a new runtime id, so a late event about the old one never kills the new one. Without a
  runtime id (on either side), an incarnation registered after the stop is left alone.
* **Ordering.** ECS delivers these events at least once and possibly out of order
  (``detail.version`` orders them). No state is kept to sort them: a container's STOPPED is
  final for its runtime id, and the kill is a conditional write that is a no-op on a dead or
  unrelated worker item, so a duplicate or a late event is harmless and an earlier
  (RUNNING) one arriving last changes nothing.

Only a stopped task is failed over this way: a task still running but cut off from DynamoDB
gets no such event, and waits out its lease and self-fences as before (docs/leases.md).

Example::

    >>> event = {"detail-type": "ECS Task State Change", "source": "aws.ecs",
    ...          "time": "2026-12-01T10:00:05Z", "detail": {
    ...     "taskArn": "arn:aws:ecs:us-east-1:123456789012:task/c/0123abcd", "version": 4,
    ...     "clusterArn": "arn:aws:ecs:us-east-1:123456789012:cluster/c",
    ...     "lastStatus": "RUNNING", "desiredStatus": "STOPPED",
    ...     "containers": [{"name": "worker", "lastStatus": "STOPPED", "runtimeId": "abc-1",
    ...                     "exitCode": 137}]}}
    >>> stop = container_stop(parse_task_event(event), "worker")
    >>> stop.task_id, stop.runtime_id, stop.exit_code
    ('0123abcd', 'abc-1', 137)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .record import WorkerRecord

__all__ = [
    "DETAIL_TYPE",
    "EVENT_SOURCE",
    "TASK_ID_SEPARATOR",
    "ContainerState",
    "ContainerStop",
    "ExitKill",
    "InvalidTaskEvent",
    "TaskStateChange",
    "candidate_worker_ids",
    "container_stop",
    "exit_kill_outcome",
    "parse_task_event",
    "ran_in",
    "task_id_of",
    "task_worker_id",
]

EVENT_SOURCE = "aws.ecs"
DETAIL_TYPE = "ECS Task State Change"
#: Separates the task id from the process part of a worker id: ``<task_id>.<host>-<pid>-<r>``.
TASK_ID_SEPARATOR = "."
STOPPED = "STOPPED"
#: Bounds on what is read from an event (every input is hostile): lengths and counts.
_MAX_ARN_CHARS = 512
_MAX_FIELD_CHARS = 256
_MAX_CONTAINERS = 20


class InvalidTaskEvent(ValueError):
    """The event is not a well-formed ECS Task State Change (the message says what is wrong)."""


@dataclass(frozen=True)
class ContainerState:
    """One entry of ``detail.containers``."""

    name: str
    last_status: str
    runtime_id: str | None = None
    exit_code: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class TaskStateChange:
    """The parts of an ``ECS Task State Change`` event the failover needs."""

    task_arn: str
    cluster_arn: str
    version: int
    last_status: str
    desired_status: str
    containers: tuple[ContainerState, ...]
    #: When ECS says the task's containers stopped (``executionStoppedAt``, else
    #: ``stoppingAt``/``updatedAt``/the envelope's ``time``), epoch ms; None if none is given.
    changed_at_ms: int | None
    stopped_reason: str | None = None


@dataclass(frozen=True)
class ContainerStop:
    """The worker container of ``task_arn`` has stopped: its process is gone."""

    task_arn: str
    cluster_arn: str
    container_name: str
    runtime_id: str | None
    exit_code: int | None
    version: int
    stopped_at_ms: int | None
    reason: str | None = None

    @property
    def task_id(self) -> str:
        return task_id_of(self.task_arn)


class ExitKill(StrEnum):
    """What :meth:`~wsfleet.store.LeaseStore.kill_exited_worker` found for one incarnation."""

    KILLED = "killed"  # dead from now on: its connections may be taken over at once
    ALREADY_DEAD = "already_dead"  # retired (a drain), killed by a peer, or a duplicate event
    NOT_THIS_CONTAINER = "not_this_container"  # another task, a restarted container, or newer
    GONE = "gone"  # no worker item (deleted by the reconciler)

    @property
    def dead(self) -> bool:
        """The incarnation is dead now: its remaining connections may be hinted."""
        return self in (ExitKill.KILLED, ExitKill.ALREADY_DEAD)


# ---------------------------------------------------------------------------- parsing


def _text(value: Any, where: str, *, required: bool = True, limit: int = _MAX_FIELD_CHARS) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise InvalidTaskEvent(f"{where} must be a non-empty string")
    if len(value) > limit:
        raise InvalidTaskEvent(f"{where} is longer than {limit} characters")
    return value


def _millis(value: Any) -> int | None:
    """An ECS timestamp (ISO 8601, ``Z`` or an offset) as epoch ms; None if absent or bad."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def _container(raw: Any, index: int) -> ContainerState:
    where = f"detail.containers[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidTaskEvent(f"{where} must be an object")
    exit_code = raw.get("exitCode")
    if isinstance(exit_code, bool) or not isinstance(exit_code, int | None):
        raise InvalidTaskEvent(f"{where}.exitCode must be an integer")
    runtime_id = _text(raw.get("runtimeId"), f"{where}.runtimeId", required=False)
    reason = _text(raw.get("reason"), f"{where}.reason", required=False, limit=1024)
    return ContainerState(
        name=_text(raw.get("name"), f"{where}.name"),
        last_status=_text(raw.get("lastStatus"), f"{where}.lastStatus"),
        runtime_id=runtime_id or None,
        exit_code=exit_code,
        reason=reason or None,
    )


def parse_task_event(event: Any) -> TaskStateChange:
    """Check and read an EventBridge ``ECS Task State Change`` event.

    Raises :class:`InvalidTaskEvent` naming the first field that is missing or malformed: the
    rule's pattern is configuration, this is code, so anything else that reaches the function
    is refused here rather than half-understood.
    """
    if not isinstance(event, Mapping):
        raise InvalidTaskEvent("the event must be an object")
    if event.get("source") != EVENT_SOURCE or event.get("detail-type") != DETAIL_TYPE:
        raise InvalidTaskEvent(f"not an {EVENT_SOURCE} {DETAIL_TYPE!r} event")
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise InvalidTaskEvent("detail must be an object")
    version = detail.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidTaskEvent("detail.version must be a non-negative integer")
    containers = detail.get("containers")
    if not isinstance(containers, list):
        raise InvalidTaskEvent("detail.containers must be a list")
    if len(containers) > _MAX_CONTAINERS:
        raise InvalidTaskEvent(f"detail.containers has more than {_MAX_CONTAINERS} entries")
    changed_at = next(
        (
            ms
            for name in ("executionStoppedAt", "stoppingAt", "updatedAt")
            if (ms := _millis(detail.get(name))) is not None
        ),
        _millis(event.get("time")),
    )
    reason = _text(detail.get("stoppedReason"), "detail.stoppedReason", required=False, limit=1024)
    return TaskStateChange(
        task_arn=_text(detail.get("taskArn"), "detail.taskArn", limit=_MAX_ARN_CHARS),
        cluster_arn=_text(detail.get("clusterArn"), "detail.clusterArn", limit=_MAX_ARN_CHARS),
        version=version,
        last_status=_text(detail.get("lastStatus"), "detail.lastStatus"),
        desired_status=_text(detail.get("desiredStatus"), "detail.desiredStatus"),
        containers=tuple(_container(raw, i) for i, raw in enumerate(containers)),
        changed_at_ms=changed_at,
        stopped_reason=reason or None,
    )


# ---------------------------------------------------------------------------- rules


def container_stop(change: TaskStateChange, container_name: str) -> ContainerStop | None:
    """The stop of the container named ``container_name``, or None while it has not stopped.

    Only the container's ``lastStatus`` counts: ``desiredStatus`` STOPPED alone means ECS has
    *asked* the task to stop (SIGTERM: the worker is draining, and still streams).
    """
    container = next((c for c in change.containers if c.name == container_name), None)
    if container is None or container.last_status != STOPPED:
        return None
    return ContainerStop(
        task_arn=change.task_arn,
        cluster_arn=change.cluster_arn,
        container_name=container.name,
        runtime_id=container.runtime_id,
        exit_code=container.exit_code,
        version=change.version,
        stopped_at_ms=change.changed_at_ms,
        reason=container.reason or change.stopped_reason,
    )


def task_id_of(task_arn: str) -> str:
    """The task id: the last segment of its ARN (both ARN formats end with it).

    >>> task_id_of("arn:aws:ecs:us-east-1:123456789012:task/wsfleet/0123abcd")
    '0123abcd'
    >>> task_id_of("arn:aws:ecs:us-east-1:123456789012:task/0123abcd")
    '0123abcd'
    """
    return task_arn.rsplit("/", 1)[-1]


def task_worker_id(task_arn: str, process_id: str) -> str:
    """A worker id that names its task: ``<task_id>.<process_id>``.

    >>> task_worker_id("arn:aws:ecs:r:1:task/c/0123abcd", "ip-10-0-0-1-7-a1b2c3")
    '0123abcd.ip-10-0-0-1-7-a1b2c3'
    """
    return f"{task_id_of(task_arn)}{TASK_ID_SEPARATOR}{process_id}"


def candidate_worker_ids(worker_ids: Iterable[str], task_arn: str) -> tuple[list[str], bool]:
    """The registered ids that name ``task_arn``'s task, and whether that was decidable by id.

    Ids made in ECS start with the task id (:func:`task_worker_id`): the matching ones are the
    candidates (``True``). If none does (ids set by an operator, or the local fleet's ``w0``),
    every id is a candidate (``False``): the caller reads their items and :func:`ran_in` decides
    by the task ARN stored in each.
    """
    ids = list(worker_ids)
    prefix = f"{task_id_of(task_arn)}{TASK_ID_SEPARATOR}"
    named = [worker_id for worker_id in ids if worker_id.startswith(prefix)]
    return (named, True) if named else (ids, False)


def ran_in(worker: WorkerRecord, stop: ContainerStop) -> bool:
    """Whether ``worker`` is an incarnation of the stopped container.

    Same task ARN, and then the same container runtime id when both sides know one (a
    container ECS restarted in the task has a new one); otherwise registered no later than
    the stop (an incarnation started after it belongs to a newer container). With neither to
    go by, no: that worker waits out its lease as before. The store's conditional write
    (:meth:`~wsfleet.store.LeaseStore.kill_exited_worker`) spells the same rule.
    """
    if worker.task_arn != stop.task_arn:
        return False
    if worker.container_runtime_id and stop.runtime_id:
        return worker.container_runtime_id == stop.runtime_id
    if stop.stopped_at_ms is None:
        return False
    return worker.started_at_ms <= stop.stopped_at_ms


def exit_kill_outcome(worker: WorkerRecord | None, stop: ContainerStop) -> ExitKill:
    """Classify the item a refused kill write saw (``None``: no item)."""
    if worker is None:
        return ExitKill.GONE
    if worker.dead and ran_in(worker, stop):
        return ExitKill.ALREADY_DEAD
    # Not this container's; or alive and matching, which only a refusal racing a change of
    # the item can show: either way nothing is hinted, and the lease path remains.
    return ExitKill.NOT_THIS_CONTAINER
