"""Local ECS tasks: the exit event has the sample's shape and the template's rule takes it."""

from __future__ import annotations

import json
from pathlib import Path

from wsfleet.task_exit import container_stop, parse_task_event
from wsfleet_local.backend import find_template, load_template
from wsfleet_local.eventfilter import matches, parse_pattern
from wsfleet_local.stack import StackResolver, read_stack
from wsfleet_local.tasks import LocalTask, cluster_arn, exit_code_of, task_state_change_event

SAMPLE = json.loads((Path(find_template()).parent / "events" / "ecs_task_stopped.json").read_text())
CLUSTER = cluster_arn("us-east-1", "wsfleet-local")


def rule_pattern() -> dict:
    stack = read_stack(load_template(find_template()))
    (rule,) = stack.function("task_exit").rules
    resolver = StackResolver(
        stack_name="wsfleet-local", region="us-east-1", names={}, parameters={},
        overrides={}, attributes={("WorkerCluster", "Arn"): CLUSTER},
    )  # fmt: skip
    return parse_pattern(resolver.resolve(rule.pattern))


def test_the_local_event_has_the_samples_shape_and_means_the_same():
    task = LocalTask.new(CLUSTER)
    event = task_state_change_event(task, exit_code=137, stopped_at=1_800_000_000.5,
                                    region="us-east-1", event_id="e-1")  # fmt: skip
    assert set(event) == set(SAMPLE)
    assert set(event["detail"]) <= set(SAMPLE["detail"])
    (container,) = event["detail"]["containers"]
    assert set(container) <= set(SAMPLE["detail"]["containers"][0])
    stop = container_stop(parse_task_event(event), "worker")
    assert stop is not None
    assert (stop.task_arn, stop.runtime_id, stop.exit_code) == (
        task.task_arn, task.runtime_id, 137,
    )
    assert stop.stopped_at_ms == 1_800_000_000_500
    assert task.task_arn.startswith("arn:aws:ecs:us-east-1:123456789012:task/wsfleet-local-worker/")
    assert task.runtime_id.startswith(stop.task_id + "-")


def test_the_template_rule_takes_this_clusters_stopped_containers_only():
    pattern = rule_pattern()
    task = LocalTask.new(CLUSTER)
    assert matches(pattern, task_state_change_event(task, exit_code=137, stopped_at=0,
                                                    region="us-east-1"))  # fmt: skip
    elsewhere = LocalTask.new(cluster_arn("us-east-1", "another-stack"))
    assert not matches(pattern, task_state_change_event(elsewhere, exit_code=137, stopped_at=0,
                                                        region="us-east-1"))  # fmt: skip
    running = task_state_change_event(task, exit_code=None, stopped_at=0, region="us-east-1")
    running["detail"]["containers"][0]["lastStatus"] = "RUNNING"
    assert not matches(pattern, running)


def test_documents_of_the_metadata_endpoint_name_the_task():
    task = LocalTask.new(CLUSTER)
    container = task.container_document()
    assert container["DockerId"] == task.runtime_id
    assert container["Labels"]["com.amazonaws.ecs.task-arn"] == task.task_arn
    assert task.task_document()["TaskARN"] == task.task_arn
    assert (exit_code_of(-9), exit_code_of(-15), exit_code_of(3)) == (137, 143, 3)
