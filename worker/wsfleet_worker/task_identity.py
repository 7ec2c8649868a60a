"""Which ECS task and container this worker process runs in, read once at start.

The task exit function (``functions/task_exit``) kills the incarnations of a container ECS says
has stopped: it finds them by the task ARN and the container's runtime id stored in their
worker items (:mod:`wsfleet.task_exit`). Both come from the ECS task metadata endpoint v4,
whose URL ECS puts in ``ECS_CONTAINER_METADATA_URI_V4`` of every container (Fargate platform
1.4.0 and later, EC2 agent 1.39.0 and later):

* ``GET $ECS_CONTAINER_METADATA_URI_V4``: this container (``DockerId``, which events call
  ``runtimeId``; ``Labels["com.amazonaws.ecs.task-arn"]``; ``StartedAt``);
* ``GET $ECS_CONTAINER_METADATA_URI_V4/task``: the task (``TaskARN``), read only if the
  container's labels lack the task ARN.

Outside ECS (no such variable) there is no identity and the worker id keeps its usual form; in
ECS the id names the task (``<task_id>.<host>-<pid>-<random>``), unless ``WORKER_ID`` is set.
An endpoint that does not answer, or answers nonsense, costs the fast failover of this
process only (its connections wait out the lease after a crash, as before): it is logged, and
the worker starts anyway. The endpoint is link-local and answers in milliseconds, so the
short timeout and few attempts bound the start delay to a few seconds at worst.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from wsfleet.task_exit import task_worker_id

__all__ = ["METADATA_VARIABLE", "TaskIdentity", "discover", "identity_from", "worker_id_in_task"]

METADATA_VARIABLE = "ECS_CONTAINER_METADATA_URI_V4"
TASK_ARN_LABEL = "com.amazonaws.ecs.task-arn"
_TIMEOUT_SECONDS = 1.0
_ATTEMPTS = 3
#: Metadata documents are a few KB; anything far larger is not the endpoint.
_MAX_BYTES = 1_048_576
_MAX_FIELD_CHARS = 512

Fetch = Callable[[str], Any]


class MetadataError(Exception):
    """The metadata endpoint did not give a usable answer (the message says why)."""


@dataclass(frozen=True)
class TaskIdentity:
    """The task and container this process runs in."""

    task_arn: str
    container_runtime_id: str | None = None
    container_name: str | None = None


def _field(document: Mapping[str, Any], name: str) -> str | None:
    value = document.get(name)
    if isinstance(value, str) and 0 < len(value) <= _MAX_FIELD_CHARS:
        return value
    return None


def identity_from(container: Any, task: Any = None) -> TaskIdentity:
    """Build the identity from the container document (and the task document, if read).

    Pure: the documents in, the identity out; MetadataError if there is no task ARN.
    """
    if not isinstance(container, Mapping):
        raise MetadataError("the container metadata is not a JSON object")
    labels = container.get("Labels")
    task_arn = _field(labels, TASK_ARN_LABEL) if isinstance(labels, Mapping) else None
    if task_arn is None and isinstance(task, Mapping):
        task_arn = _field(task, "TaskARN")
    if task_arn is None or ":task/" not in task_arn:
        raise MetadataError("the metadata names no task ARN")
    return TaskIdentity(
        task_arn=task_arn,
        container_runtime_id=_field(container, "DockerId"),
        container_name=_field(container, "Name"),
    )


def _get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS) as response:
        body = response.read(_MAX_BYTES + 1)
    if len(body) > _MAX_BYTES:
        raise MetadataError("the metadata document is too large")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise MetadataError(f"the metadata is not JSON: {exc}") from exc


def discover(
    environ: Mapping[str, str],
    *,
    fetch: Fetch | None = None,
    sleep: Callable[[float], None] | None = None,
) -> TaskIdentity | None:
    """The identity from the metadata endpoint, or None outside ECS.

    Raises MetadataError when ``ECS_CONTAINER_METADATA_URI_V4`` is set but no usable answer
    came after a few attempts (the caller logs it and runs without).
    """
    base = environ.get(METADATA_VARIABLE, "").rstrip("/")
    if not base:
        return None
    if not base.startswith(("http://", "https://")):
        raise MetadataError(f"{METADATA_VARIABLE} is not an http URL")
    fetch = fetch or _get_json
    sleep = sleep or time.sleep
    error: Exception | None = None
    for attempt in range(_ATTEMPTS):
        if attempt:
            sleep(0.2 * attempt)
        try:
            container = fetch(base)
            task = None
            labels = container.get("Labels") if isinstance(container, Mapping) else None
            if not (isinstance(labels, Mapping) and _field(labels, TASK_ARN_LABEL)):
                task = fetch(f"{base}/task")
            return identity_from(container, task)
        except (OSError, urllib.error.URLError, MetadataError, ValueError) as exc:
            error = exc
    raise MetadataError(f"task metadata unavailable: {error}") from error


def worker_id_in_task(identity: TaskIdentity | None, process_id: str, *, explicit: bool) -> str:
    """The worker id: ``<task_id>.<process_id>`` in a task, unless set explicitly
    (``WORKER_ID``) or outside ECS, where it stays ``process_id``."""
    if identity is None or explicit:
        return process_id
    return task_worker_id(identity.task_arn, process_id)
