"""Local ECS tasks: each worker process is a "task" with a metadata endpoint, and its exit is
published as the ``ECS Task State Change`` event ECS would send.

On AWS a worker learns its task ARN and container runtime id from the task metadata endpoint
v4 (``ECS_CONTAINER_METADATA_URI_V4``), and when its container stops ECS sends EventBridge an
event that the template's rule hands to the task exit function (crash failover without
waiting for the lease, :mod:`wsfleet.task_exit`). Locally:

* :class:`MetadataServer` serves the two documents the worker reads
  (``GET /v4/<runtime id>`` for the container, ``GET /v4/<runtime id>/task`` for the task),
  one pair per :class:`LocalTask`, on 127.0.0.1;
* :class:`TaskExitWatcher` notices a worker process's exit (any: SIGKILL, a crash, the end of
  a drain) and delivers :func:`task_state_change_event` (the shape of
  ``events/ecs_task_stopped.json``) to the task exit function, if the template's rule pattern
  matches it (:mod:`wsfleet_local.eventfilter`), as EventBridge would.

The event builder is pure (ids and times are arguments), so a unit test compares it with the
sample key by key.

Example::

    server = MetadataServer().start()
    task = LocalTask.new(cluster_arn)
    env = {"ECS_CONTAINER_METADATA_URI_V4": server.register(task)}
    watcher = TaskExitWatcher(task_exit.invoke, pattern, region="us-east-1").start()
    watcher.watch(task, process.popen.poll)     # its exit becomes an event
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .eventfilter import matches, parse_pattern
from .serving import BackgroundLoop, ServerThread
from .stack import LOCAL_ACCOUNT_ID

__all__ = [
    "LocalTask",
    "MetadataServer",
    "TaskExitWatcher",
    "cluster_arn",
    "exit_code_of",
    "task_state_change_event",
]

logger = logging.getLogger(__name__)

#: How often the watcher looks for exited processes (the local exit event's own latency).
POLL_SECONDS = 0.05
TASK_ARN_LABEL = "com.amazonaws.ecs.task-arn"


def cluster_arn(region: str, stack_name: str) -> str:
    """The local worker cluster's ARN (what ``!GetAtt WorkerCluster.Arn`` resolves to)."""
    return f"arn:aws:ecs:{region}:{LOCAL_ACCOUNT_ID}:cluster/{stack_name}-worker"


def _iso(epoch_seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(epoch_seconds, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def exit_code_of(returncode: int | None) -> int | None:
    """A container's exit code as ECS reports it: a signal N becomes 128 + N (SIGKILL: 137).

    >>> exit_code_of(-9), exit_code_of(0), exit_code_of(None)
    (137, 0, None)
    """
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class LocalTask:
    """One local "task": a worker process's task ARN, container runtime id and start."""

    task_arn: str
    cluster_arn: str
    runtime_id: str
    container_name: str = "worker"
    started_at: float = field(default_factory=time.time)

    @classmethod
    def new(cls, cluster: str) -> LocalTask:
        """A fresh task in ``cluster``: a random 32-hex task id, a runtime id derived from it
        (``<task id>-<10 digits>``, the Fargate form)."""
        task_id = secrets.token_hex(16)
        prefix, _, name = cluster.partition(":cluster/")
        runtime_id = f"{task_id}-{secrets.randbelow(10**10):010d}"
        return cls(f"{prefix}:task/{name}/{task_id}", cluster, runtime_id)

    def container_document(self) -> dict[str, Any]:
        """``GET $ECS_CONTAINER_METADATA_URI_V4`` (the fields wsfleet and most tools read)."""
        return {
            "DockerId": self.runtime_id,
            "Name": self.container_name,
            "DockerName": f"ecs-{self.container_name}",
            "Labels": {
                "com.amazonaws.ecs.cluster": self.cluster_arn,
                "com.amazonaws.ecs.container-name": self.container_name,
                TASK_ARN_LABEL: self.task_arn,
            },
            "DesiredStatus": "RUNNING",
            "KnownStatus": "RUNNING",
            "StartedAt": _iso(self.started_at),
            "Type": "NORMAL",
        }

    def task_document(self) -> dict[str, Any]:
        """``GET $ECS_CONTAINER_METADATA_URI_V4/task``."""
        return {
            "Cluster": self.cluster_arn,
            "TaskARN": self.task_arn,
            "DesiredStatus": "RUNNING",
            "KnownStatus": "RUNNING",
            "LaunchType": "FARGATE",
            "Containers": [self.container_document()],
        }


def task_state_change_event(
    task: LocalTask,
    *,
    exit_code: int | None,
    stopped_at: float,
    region: str,
    event_id: str | None = None,
) -> dict[str, Any]:
    """The first ``ECS Task State Change`` event ECS sends when an essential container exits:
    the container STOPPED (with its exit code), the task still RUNNING, desired STOPPED."""
    stamp = _iso(stopped_at)
    container: dict[str, Any] = {
        "containerArn": f"{task.task_arn.replace(':task/', ':container/')}/{uuid.uuid4()}",
        "lastStatus": "STOPPED",
        "name": task.container_name,
        "runtimeId": task.runtime_id,
        "taskArn": task.task_arn,
        "cpu": "0",
    }
    if exit_code is not None:
        container["exitCode"] = exit_code
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": "ECS Task State Change",
        "source": "aws.ecs",
        "account": LOCAL_ACCOUNT_ID,
        "time": stamp[:19] + "Z",
        "region": region,
        "resources": [task.task_arn],
        "detail": {
            "clusterArn": task.cluster_arn,
            "containers": [container],
            "createdAt": _iso(task.started_at),
            "launchType": "FARGATE",
            "desiredStatus": "STOPPED",
            "lastStatus": "RUNNING",
            "startedAt": _iso(task.started_at),
            "stoppingAt": stamp,
            "stopCode": "EssentialContainerExited",
            "stoppedReason": "Essential container in task exited",
            "updatedAt": stamp,
            "taskArn": task.task_arn,
            "version": 3,
        },
    }


class MetadataServer(ServerThread):
    """The task metadata endpoint v4 for every local task, on 127.0.0.1 (a free port, bound
    at construction)."""

    def __init__(self) -> None:
        tasks: dict[str, LocalTask] = {}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = [part for part in self.path.split("?")[0].split("/") if part]
                with lock:
                    task = tasks.get(parts[1]) if len(parts) >= 2 and parts[0] == "v4" else None
                if task is None or len(parts) > 3 or (len(parts) == 3 and parts[2] != "task"):
                    self.send_error(404)
                    return
                document = task.task_document() if len(parts) == 3 else task.container_document()
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: one request per worker start

        super().__init__(ThreadingHTTPServer(("127.0.0.1", 0), Handler), name="ecs-metadata")
        self._tasks, self._lock = tasks, lock

    def register(self, task: LocalTask) -> str:
        """Serve ``task``'s documents; returns its ``ECS_CONTAINER_METADATA_URI_V4``."""
        with self._lock:
            self._tasks[task.runtime_id] = task
        return f"http://127.0.0.1:{self.port}/v4/{task.runtime_id}"


class TaskExitWatcher(BackgroundLoop):
    """Publishes each watched process's exit as its task's state change event.

    :param deliver: the task exit function's invoke (its return value is logged).
    :param pattern: the template's rule pattern, resolved (an event it does not match is
        dropped, as EventBridge drops it).
    :param region: the region events carry.

    ``stop()`` ends the watching: what exits afterwards (the fleet's own shutdown, say) is not
    sent.
    """

    thread_name = "task-exit-watcher"
    #: ``stop()`` waits for a delivery in flight (the task exit function's invoke).
    stop_timeout_seconds = 30.0

    def __init__(
        self,
        deliver: Callable[[dict[str, Any]], Any],
        pattern: Mapping[str, Any],
        *,
        region: str,
        on_event: Callable[[LocalTask, dict[str, Any], Any], None] | None = None,
    ) -> None:
        super().__init__()
        self._deliver = deliver
        self._pattern = parse_pattern(pattern)
        self._region = region
        self._on_event = on_event or (lambda task, event, result: None)
        self._watched: dict[str, tuple[LocalTask, Callable[[], int | None]]] = {}
        self._lock = threading.Lock()
        self.published = 0

    def watch(self, task: LocalTask, poll: Callable[[], int | None]) -> None:
        """Publish ``task``'s stop once ``poll()`` returns an exit code."""
        with self._lock:
            self._watched[task.runtime_id] = (task, poll)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            with self._lock:
                watched = list(self._watched.items())
            for runtime_id, (task, poll) in watched:
                code = poll()
                if code is None:
                    continue
                with self._lock:
                    self._watched.pop(runtime_id, None)
                self._publish(task, code)

    def _publish(self, task: LocalTask, returncode: int) -> None:
        event = task_state_change_event(
            task, exit_code=exit_code_of(returncode), stopped_at=time.time(), region=self._region
        )
        if not matches(self._pattern, event):
            return
        try:
            result = self._deliver(event)
        except Exception:  # a failed delivery costs this failover its speed, not the fleet
            logger.exception("task exit event not delivered", extra={"task": task.task_arn})
            result = None
        self.published += 1
        self._on_event(task, event, result)
