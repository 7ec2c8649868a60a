"""The worker's ECS task identity (wsfleet_worker.task_identity), with the endpoint faked at
the fetch function: the documents are the metadata endpoint v4's shapes."""

from __future__ import annotations

from typing import Any

import pytest

from wsfleet_worker.task_identity import (
    MetadataError,
    TaskIdentity,
    discover,
    identity_from,
    worker_id_in_task,
)

BASE = "http://169.254.170.2/v4/0123abcd-1234567890"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/wsfleet/0123abcd"
CONTAINER = {
    "DockerId": "0123abcd-1234567890",
    "Name": "worker",
    "Labels": {"com.amazonaws.ecs.task-arn": TASK, "com.amazonaws.ecs.container-name": "worker"},
    "StartedAt": "2027-01-15T07:10:20.773Z",
}


def fetcher(documents: dict[str, Any]) -> tuple[Any, list[str]]:
    asked: list[str] = []

    def fetch(url: str) -> Any:
        asked.append(url)
        answer = documents[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return fetch, asked


def test_outside_ecs_there_is_no_identity_and_the_id_keeps_its_form():
    assert discover({}) is None
    assert worker_id_in_task(None, "host-7-abc", explicit=False) == "host-7-abc"


def test_the_container_document_is_enough_when_it_names_the_task():
    fetch, asked = fetcher({BASE: CONTAINER})
    identity = discover({"ECS_CONTAINER_METADATA_URI_V4": BASE + "/"}, fetch=fetch)
    assert identity == TaskIdentity(TASK, "0123abcd-1234567890", "worker")
    assert asked == [BASE]
    assert worker_id_in_task(identity, "ip-10-0-1-2-7-abc", explicit=False) == (
        "0123abcd.ip-10-0-1-2-7-abc"
    )
    assert worker_id_in_task(identity, "w0", explicit=True) == "w0"  # WORKER_ID wins


def test_the_task_document_fills_in_a_missing_label_and_failures_are_retried():
    unlabelled = {**CONTAINER, "Labels": {}}
    fetch, asked = fetcher({BASE: unlabelled, BASE + "/task": {"TaskARN": TASK}})
    identity = discover({"ECS_CONTAINER_METADATA_URI_V4": BASE}, fetch=fetch)
    assert identity is not None and identity.task_arn == TASK
    assert asked == [BASE, BASE + "/task"]
    fetch, asked = fetcher({BASE: OSError("connection refused")})
    with pytest.raises(MetadataError, match="connection refused"):
        discover({"ECS_CONTAINER_METADATA_URI_V4": BASE}, fetch=fetch, sleep=lambda _: None)
    assert len(asked) == 3


@pytest.mark.parametrize(
    "container",
    [[], {"Labels": "x"}, {"Labels": {"com.amazonaws.ecs.task-arn": "not-an-arn"}},
     {"Labels": {"com.amazonaws.ecs.task-arn": "arn:aws:ecs:r:1:task/" + "x" * 600}}],
)  # fmt: skip
def test_hostile_documents_give_no_identity(container):
    with pytest.raises(MetadataError):
        identity_from(container, {"TaskARN": 5})


def test_a_non_http_endpoint_is_refused():
    with pytest.raises(MetadataError, match="not an http URL"):
        discover({"ECS_CONTAINER_METADATA_URI_V4": "file:///etc/passwd"})


def test_the_worker_id_names_the_task_unless_set(monkeypatch):
    from wsfleet.settings import Settings
    from wsfleet_worker import task_identity
    from wsfleet_worker.config import WorkerConfig
    from wsfleet_worker.worker import in_task

    config = WorkerConfig(settings=Settings(worker_id="ip-10-0-1-2-7-abc"))
    monkeypatch.setattr(task_identity, "_get_json", lambda url: CONTAINER)
    env = {"ECS_CONTAINER_METADATA_URI_V4": BASE}
    # GIVEN a task: the id names it and the identity is kept for the worker item
    named = in_task(config, env)
    assert named.settings.worker_id == "0123abcd.ip-10-0-1-2-7-abc"
    assert named.task == TaskIdentity(TASK, "0123abcd-1234567890", "worker")
    # AND an explicit WORKER_ID is kept as is (the identity still goes to the item)
    explicit = in_task(config, {**env, "WORKER_ID": "ip-10-0-1-2-7-abc"})
    assert explicit.settings.worker_id == "ip-10-0-1-2-7-abc" and explicit.task is not None
    # AND outside ECS, or with an endpoint that fails, the config is unchanged
    assert in_task(config, {}) == config

    def refuse(url: str) -> None:
        raise OSError("refused")

    monkeypatch.setattr(task_identity, "_get_json", refuse)
    monkeypatch.setattr(task_identity.time, "sleep", lambda _: None)
    assert in_task(config, env) == config
