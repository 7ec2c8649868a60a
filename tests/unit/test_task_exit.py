"""The pure rules of crash failover from the ECS task exit event (wsfleet.task_exit)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from wsfleet.record import WorkerRecord
from wsfleet.task_exit import (
    ContainerStop,
    ExitKill,
    InvalidTaskEvent,
    candidate_worker_ids,
    container_stop,
    exit_kill_outcome,
    parse_task_event,
    ran_in,
    task_id_of,
    task_worker_id,
)

SAMPLE = Path(__file__).resolve().parents[2] / "events" / "ecs_task_stopped.json"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/wsfleet-worker/0123456789abcdef0123456789abcdef"
T0 = 1_800_000_000_000


def sample() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


def event(last: str = "STOPPED", *, name: str = "worker", runtime: str | None = "rt-1",
          version: int = 5, **detail: Any) -> dict[str, Any]:  # fmt: skip
    container: dict[str, Any] = {"name": name, "lastStatus": last, "exitCode": 137}
    if runtime:
        container["runtimeId"] = runtime
    return {
        "source": "aws.ecs",
        "detail-type": "ECS Task State Change",
        "time": "2027-01-15T08:00:00Z",
        "detail": {
            "taskArn": TASK,
            "clusterArn": "arn:aws:ecs:us-east-1:123456789012:cluster/wsfleet",
            "version": version,
            "lastStatus": "RUNNING",
            "desiredStatus": "STOPPED",
            "containers": [container],
            **detail,
        },
    }


def worker(**changes: Any) -> WorkerRecord:
    values: dict[str, Any] = {
        "worker_id": "w", "control_queue_url": "q", "started_at_ms": T0 - 1,
        "heartbeat_at_ms": T0, "expires_at_ms": T0 + 20_000, "task_arn": TASK,
        "container_runtime_id": "rt-1", **changes,
    }  # fmt: skip
    return WorkerRecord(**values)


def the_stop(**detail: Any) -> ContainerStop:
    stop = container_stop(parse_task_event(event(**detail)), "worker")
    assert stop is not None
    return stop


# ------------------------------------------------------------------ parsing
def test_the_sample_event_is_a_stop_of_the_worker_container():
    stop = container_stop(parse_task_event(sample()), "worker")
    assert stop is not None
    assert stop.task_arn.endswith("/" + stop.task_id)
    assert stop.exit_code == 137 and stop.runtime_id and stop.stopped_at_ms


def test_times_prefer_the_execution_stop_then_fall_back_to_the_envelope():
    parsed = parse_task_event(event(executionStoppedAt="2027-01-15T07:59:59.500Z"))
    assert parsed.changed_at_ms == parse_task_event(event()).changed_at_ms - 500
    assert parse_task_event(event(updatedAt="2027-01-15T08:00:00.250+00:00")).changed_at_ms == (
        parse_task_event(event()).changed_at_ms + 250
    )
    undated = event()
    del undated["time"]
    assert parse_task_event(undated).changed_at_ms is None
    assert parse_task_event(event(updatedAt="yesterday")).changed_at_ms is not None  # envelope


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.update(source="aws.ec2"), "not an aws.ecs"),
        (lambda e: e.update({"detail-type": "ECS Container Instance State Change"}), "not an"),
        (lambda e: e.update(detail=[]), "detail must be an object"),
        (lambda e: e["detail"].pop("taskArn"), "detail.taskArn"),
        (lambda e: e["detail"].update(taskArn="x" * 600), "longer than"),
        (lambda e: e["detail"].update(version=-1), "detail.version"),
        (lambda e: e["detail"].update(version=True), "detail.version"),
        (lambda e: e["detail"].update(containers={}), "detail.containers must be a list"),
        (lambda e: e["detail"].update(containers=[{}] * 21), "more than 20"),
        (lambda e: e["detail"]["containers"].append("x"), r"containers\[1\] must be an object"),
        (lambda e: e["detail"]["containers"][0].update(exitCode="137"), "exitCode"),
        (lambda e: e["detail"]["containers"][0].update(name=""), r"containers\[0\]\.name"),
        (lambda e: e["detail"]["containers"][0].update(runtimeId=5), "runtimeId"),
    ],
)
def test_hostile_events_are_refused_with_the_field_named(mutate, message):
    hostile = copy.deepcopy(event())
    mutate(hostile)
    with pytest.raises(InvalidTaskEvent, match=message):
        parse_task_event(hostile)


def test_not_an_object_is_refused():
    with pytest.raises(InvalidTaskEvent):
        parse_task_event(["not", "an", "event"])


# ------------------------------------------------------------------ has it stopped?
@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "STOPPING", "DEPROVISIONING"])
def test_desired_stopped_alone_is_not_a_stop(status):
    # GIVEN ECS asked the task to stop (SIGTERM: the worker drains and still streams)
    assert container_stop(parse_task_event(event(status)), "worker") is None


def test_only_the_worker_container_counts():
    sidecar_stopped = event(name="log-router")
    assert container_stop(parse_task_event(sidecar_stopped), "worker") is None
    assert container_stop(parse_task_event(sidecar_stopped), "log-router") is not None
    assert container_stop(parse_task_event(event(containers=[])), "worker") is None


# ------------------------------------------------------------------ which incarnations
def test_ids_made_in_ecs_name_their_task():
    assert task_id_of(TASK) == "0123456789abcdef0123456789abcdef"
    own = task_worker_id(TASK, "ip-10-0-1-2-7-a1b2c3")
    assert own == "0123456789abcdef0123456789abcdef.ip-10-0-1-2-7-a1b2c3"
    ids = [own, own + "+2", "fedcba.ip-10-0-1-3-7-d4e5f6", "w0"]
    assert candidate_worker_ids(ids, TASK) == ([own, own + "+2"], True)
    # ids that do not name tasks (local fleet, WORKER_ID set by hand): all are candidates
    assert candidate_worker_ids(["w0", "w1"], TASK) == (["w0", "w1"], False)


def test_ran_in_is_the_task_and_the_container_runtime():
    stop = the_stop()
    assert ran_in(worker(), stop)
    assert ran_in(worker(worker_id="w+2"), stop)  # a later incarnation of the same process
    assert not ran_in(worker(task_arn=TASK + "0"), stop)
    assert not ran_in(worker(task_arn=None), stop)
    assert not ran_in(worker(container_runtime_id="rt-2"), stop)  # ECS restarted the container


def test_without_runtime_ids_an_incarnation_started_after_the_stop_is_spared():
    stop = the_stop(runtime=None)
    assert stop.stopped_at_ms is not None
    assert ran_in(worker(container_runtime_id=None, started_at_ms=stop.stopped_at_ms), stop)
    assert not ran_in(worker(container_runtime_id=None, started_at_ms=stop.stopped_at_ms + 1), stop)
    assert ran_in(worker(started_at_ms=stop.stopped_at_ms - 5), stop)  # event without one
    undated = event(runtime=None)
    del undated["time"]
    blind = container_stop(parse_task_event(undated), "worker")
    assert blind is not None and not ran_in(worker(container_runtime_id=None), blind)


def test_duplicated_and_out_of_order_events_decide_the_same():
    # GIVEN the STOPPED event (version 5), a duplicate, and a late RUNNING one (version 3)
    first, again = the_stop(), the_stop()
    late = container_stop(parse_task_event(event("RUNNING", version=3)), "worker")
    # THEN the duplicate names the same incarnations and the older one names none
    assert first == again and late is None
    # AND once dead, the store's refusal is classified as already dead: nothing new happens
    assert exit_kill_outcome(worker(dead_at_ms=T0), first) is ExitKill.ALREADY_DEAD
    assert exit_kill_outcome(worker(container_runtime_id="rt-2"), first) is (
        ExitKill.NOT_THIS_CONTAINER
    )
    assert exit_kill_outcome(worker(), first) is ExitKill.NOT_THIS_CONTAINER  # alive: a race
    assert exit_kill_outcome(None, first) is ExitKill.GONE
    assert ExitKill.KILLED.dead and ExitKill.ALREADY_DEAD.dead and not ExitKill.GONE.dead
