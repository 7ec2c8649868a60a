"""The task exit function's handler on the moto server: what it does for events that need
nothing, for hostile ones, and for a task with two incarnations of one process."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.handler_loader import lambda_context, load_function

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

SAMPLE = json.loads(
    (Path(__file__).resolve().parents[2] / "events" / "ecs_task_stopped.json").read_text()
)


@pytest.fixture
def invoke(aws: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    module = load_function("task_exit")
    # The delayed copies stay out of sight while a test reads the originals (on a slow machine
    # a 1 s delay could end mid-read); test_each_hint_has_a_delayed_copy looks at them.
    monkeypatch.setattr(module, "COPY_DELAY_SECONDS", 300)

    def run(event: Any) -> dict[str, Any]:
        module.reset_dependencies()
        try:
            return dict(module.lambda_handler(event, lambda_context("task_exit")))
        finally:
            module.reset_dependencies()

    return run


def register(store: DynamoDBLeaseStore, worker_id: str, **identity: Any) -> None:
    now = now_ms()
    store.register_worker(WorkerRecord(
        worker_id=worker_id, control_queue_url="", started_at_ms=now - 1_000,
        heartbeat_at_ms=now, expires_at_ms=now + 60_000, **identity,
    ))  # fmt: skip


def test_events_that_need_nothing_write_nothing(aws, invoke):
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    detail = SAMPLE["detail"]
    register(store, "w1", task_arn=detail["taskArn"],
             container_runtime_id=detail["containers"][0]["runtimeId"])  # fmt: skip
    # GIVEN a draining task (desired STOPPED, the container still RUNNING), a sidecar's stop,
    # and hostile or foreign events
    draining = copy.deepcopy(SAMPLE)
    draining["detail"]["containers"][0]["lastStatus"] = "RUNNING"
    sidecar = copy.deepcopy(SAMPLE)
    sidecar["detail"]["containers"][0]["name"] = "log-router"
    hostile = copy.deepcopy(SAMPLE)
    hostile["detail"]["containers"] = "all of them"
    # THEN none kills w1; the hostile ones are refused with the field named, without raising
    assert invoke(draining)["outcome"] == "not_stopped"
    assert invoke(sidecar)["outcome"] == "not_stopped"
    refused = invoke(hostile)
    assert (refused["outcome"], refused["error"]) == (
        "invalid", "detail.containers must be a list",
    )
    assert invoke({"source": "aws.s3"})["outcome"] == "invalid"
    assert invoke([])["outcome"] == "invalid"
    assert not store.get_worker("w1", consistent=True).dead


def test_every_incarnation_of_the_stopped_container_dies_and_only_those(aws, invoke):
    # GIVEN a process that started over under +2 (both registered in task T, container rt),
    # a restarted container of T (new runtime id), and a worker of another task
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    detail = SAMPLE["detail"]
    task, runtime = detail["taskArn"], detail["containers"][0]["runtimeId"]
    task_id = task.rsplit("/", 1)[-1]
    first, second = f"{task_id}.h-1-aaa", f"{task_id}.h-1-aaa+2"
    register(store, first, task_arn=task, container_runtime_id=runtime)
    register(store, second, task_arn=task, container_runtime_id=runtime)
    register(store, f"{task_id}.h-9-bbb", task_arn=task, container_runtime_id=runtime + "-new")
    register(store, "elsewhere.h-2-ccc", task_arn=task + "0", container_runtime_id=runtime)
    for cid, owner in (("a", first), ("b", second), ("c", second)):
        store.start(cid, "wss://up.example/s")
        store.acquire(f"CONN#{cid}", owner)
    sqs = boto3.client("sqs")

    # WHEN the exit event arrives
    report = invoke(SAMPLE)

    # THEN both incarnations are dead, their three connections hinted; the others live on
    assert report["killed"] == sorted([first, second])
    assert report["spared"] == [] and report["hints_sent"] == 3
    assert not store.get_worker(f"{task_id}.h-9-bbb", consistent=True).dead
    assert not store.get_worker("elsewhere.h-2-ccc", consistent=True).dead
    bodies = [
        json.loads(m["Body"])["pk"]
        for m in sqs.receive_message(QueueUrl=aws.hint_queue_url, MaxNumberOfMessages=10)[
            "Messages"
        ]
    ]
    assert sorted(bodies) == ["CONN#a", "CONN#b", "CONN#c"]


def test_many_connections_are_hinted_in_parallel_chunks(aws, invoke):
    # GIVEN the stopped container's incarnation owning more connections than one chunk
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    detail = SAMPLE["detail"]
    register(store, "w1", task_arn=detail["taskArn"],
             container_runtime_id=detail["containers"][0]["runtimeId"])  # fmt: skip
    module = load_function("task_exit")
    count = module.HINT_CHUNK + 7
    for i in range(count):
        store.start(f"m{i:03d}", "wss://up.example/s")
        store.acquire(f"CONN#m{i:03d}", "w1")
    # WHEN the exit event arrives
    report = invoke(SAMPLE)
    # THEN every connection is hinted, once
    assert (report["killed"], report["hints_sent"]) == (["w1"], count)
    sqs = boto3.client("sqs")
    seen: list[str] = []
    while batch := sqs.receive_message(QueueUrl=aws.hint_queue_url, MaxNumberOfMessages=10,
                                       VisibilityTimeout=60).get("Messages", []):  # fmt: skip
        seen += [json.loads(m["Body"])["pk"] for m in batch]
    assert sorted(seen) == [f"CONN#m{i:03d}" for i in range(count)]


def test_each_hint_has_a_delayed_copy_for_the_ones_a_dead_poll_swallows(aws, invoke):
    # GIVEN the stopped container's incarnation owning three connections
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    detail = SAMPLE["detail"]
    register(store, "w1", task_arn=detail["taskArn"],
             container_runtime_id=detail["containers"][0]["runtimeId"])  # fmt: skip
    for cid in ("a", "b", "c"):
        store.start(cid, "wss://up.example/s")
        store.acquire(f"CONN#{cid}", "w1")
    # WHEN the exit event arrives
    report = invoke(SAMPLE)
    # THEN three hints go out now and three copies wait on the queue, delayed
    assert (report["hints_sent"], report["copies_sent"]) == (3, 3)
    attributes = boto3.client("sqs").get_queue_attributes(
        QueueUrl=aws.hint_queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "3"
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "3"


def test_copies_that_cannot_be_sent_are_logged_and_the_originals_still_count(
    aws, invoke, monkeypatch
):
    # GIVEN the stopped incarnation owning two connections, and SQS refusing every delayed send
    from wsfleet.hint_sender import HintSender

    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    detail = SAMPLE["detail"]
    register(store, "w1", task_arn=detail["taskArn"],
             container_runtime_id=detail["containers"][0]["runtimeId"])  # fmt: skip
    for cid in ("a", "b"):
        store.start(cid, "wss://up.example/s")
        store.acquire(f"CONN#{cid}", "w1")
    send_many = HintSender.send_many

    def no_delayed(self: HintSender, hints: Any) -> list[Any]:
        hints = list(hints)
        if hints and hints[0].delay_seconds:
            return hints
        return send_many(self, hints)

    monkeypatch.setattr(HintSender, "send_many", no_delayed)
    warnings: list[tuple[str, dict[str, Any]]] = []
    module = load_function("task_exit")  # the module invoke runs (cached once imported)
    monkeypatch.setattr(
        module.logger, "warning", lambda message, **kw: warnings.append((message, kw["extra"]))
    )
    # WHEN the exit event arrives
    report = invoke(SAMPLE)
    # THEN the hints went out, no copy did, and the loss is in the log
    assert (report["hints_sent"], report["copies_sent"]) == (2, 0)
    assert [(m, e["failed"], e["of"]) for m, e in warnings] == [
        ("delayed hint copies not sent", 2, 2)
    ]
