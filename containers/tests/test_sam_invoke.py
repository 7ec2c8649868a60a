"""Every sample in events/ under `sam local invoke`, in the Lambda runtime's container (the
stand-in image), against `make local-backend` on the host: the README's "Invoke one function
with sam local" as a SAM team runs it. Each answer is checked as the README documents it (the
expectations are tests/integration/test_sample_events.py's, which runs the same samples
in-process): status and body for the API samples, the effect in the tables and queues for the
stream, schedule and task-exit samples.

What only this finds: a dependency missing from the built function or layer, a handler path
the template wires wrongly, an environment variable env.json or the template does not pass,
the containers not reaching the backend.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
import test_sample_events as samples
from harness import EVENTS, Invocation, LocalBackend, sam_invoke

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.control import StopCommand
from wsfleet.hints import Hint
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore

pytestmark = [pytest.mark.usefixtures("sam_build"), pytest.mark.timeout(1800)]

ALL_SAMPLES = sorted(p.stem for p in EVENTS.glob("*.json"))
CHECKED: set[str] = set()


@pytest.fixture
def invoke(local_backend: LocalBackend, figures: dict[str, Any]) -> Any:
    def run(sample: str, *, via_make: bool = False) -> Any:
        invocation: Invocation = sam_invoke(samples.function_of(sample), sample, via_make=via_make)
        CHECKED.add(sample)
        cold = figures.setdefault("cold_start", {})
        if invocation.function not in cold:  # the first invoke of each function
            cold[invocation.function] = {
                "event": sample,
                "wall_seconds": round(invocation.wall_seconds, 2),
                "duration_ms": invocation.duration_ms,
            }
        return invocation.result

    return run


def store() -> DynamoDBLeaseStore:
    return DynamoDBLeaseStore(
        dynamodb_client(), samples.ENV_JSON["Parameters"]["CONNECTIONS_TABLE"]
    )


def host_queue_url(env_json_url: str) -> str:
    """env.json's queue URL (host.docker.internal, as the containers see it), from the host."""
    return env_json_url.replace(samples.ENV_ENDPOINT, boto3.client("sqs").meta.endpoint_url)


def hinted(queue_url: str) -> list[str]:
    """The connections the hints now in the queue name (the queue drained)."""
    return [Hint.parse(body).pk for body in samples.drain(queue_url)]


HINT_QUEUE = samples.ENV_JSON["Parameters"]["HINT_QUEUE_URL"]


def test_api_samples_in_readme_order(invoke: Any) -> None:
    # GIVEN the fresh backend `make local-backend` starts
    hint_queue = host_queue_url(HINT_QUEUE)
    for name, status in samples.API_SAMPLES_IN_ORDER:
        # WHEN each API sample is invoked in the README's order
        response = invoke(name)
        # THEN it answers the README's status, as API Gateway's proxy response
        assert response["statusCode"] == status, (name, response["body"])
        body = json.loads(response["body"])
        samples.check_upstream_answer(name, body)
        if name == "api_post_events_start":
            # the START is stored and hinted: the containers reached both DynamoDB and SQS
            assert body["connection_id"] == "demo-1" and body["outcome"] == "created"
            assert body["lease"]["state"] == "free"
            record = store().get("CONN#demo-1")
            assert record is not None and record.desired_state == "STARTED"
            assert "CONN#demo-1" in hinted(hint_queue)
        if name == "api_list_connections":
            assert {"demo-1"} <= {item["connection_id"] for item in body["items"]}
        if name == "api_post_events_stop":
            assert body["desired_state"] == "STOPPED"
        if status >= 400:
            assert body["message"], name


def test_stream_samples(invoke: Any, local_backend: LocalBackend) -> None:
    # GIVEN nothing but `make local-backend`, whose --seed-samples registers worker-a with its
    # control queue and worker-b without one (mid-restart), as the README says
    queue_a = local_backend.sample_workers["worker-a"]

    # WHEN each stream sample is invoked (the last with the README's `make invoke` line),
    # THEN a STOP transition reaches its owner's queue
    assert invoke("stream_stop_modify") == {"batchItemFailures": []}
    assert samples.drain(queue_a) == [StopCommand("CONN#ticker-btc-usd", 3).body()]
    # the batch reports exactly worker-b's record; worker-a's STOP went through
    batch = "stream_batch_partial_failure"
    assert samples.failed_ids(invoke(batch)) == [samples.sequence_numbers(batch)[1]]
    assert samples.drain(queue_a) == [StopCommand("CONN#ticker-btc-eur", 5).body()]
    # records that are not STOP transitions send nothing
    for sample in ("stream_ignored_modify", "stream_insert"):
        assert invoke(sample) == {"batchItemFailures": []}, sample
    assert invoke("stream_remove_ttl", via_make=True) == {"batchItemFailures": []}
    assert samples.drain(queue_a) == []


def test_scheduler_sample_hints_an_orphan(invoke: Any) -> None:
    # GIVEN a STARTED connection nobody owns, whose START hint was lost
    hint_queue = host_queue_url(HINT_QUEUE)
    pk = store().start("orphan-1", "wss://up.example/s").record.pk
    samples.drain(hint_queue)

    # WHEN the schedule's sample is invoked (it passes until its 60 s timeout nears)
    report = invoke("scheduler_reconcile")

    # THEN several passes ran and the orphan was hinted once it was free past the grace
    assert report["passes"] >= 2, report
    assert report["hints_failed"] == 0, report
    assert report["hints_sent"] >= 1, report
    assert pk in hinted(hint_queue)


def test_ecs_task_stopped_sample_fails_its_worker_over(invoke: Any) -> None:
    # GIVEN the incarnation the sample's container ran, live, owning a STARTED connection
    detail = json.loads((EVENTS / "ecs_task_stopped.json").read_text())["detail"]
    (container,) = detail["containers"]
    leases = store()
    now = now_ms()
    crashed = f"{detail['taskArn'].rsplit('/', 1)[-1]}.ip-10-0-1-23-7-a1b2c3"
    leases.register_worker(WorkerRecord(
        worker_id=crashed, control_queue_url="", started_at_ms=now - 60_000,
        heartbeat_at_ms=now, expires_at_ms=now + 60_000, task_arn=detail["taskArn"],
        container_runtime_id=container["runtimeId"],
    ))  # fmt: skip
    pk = leases.start("exited-1", "wss://up.example/s").record.pk
    epoch = leases.acquire(pk, crashed).lease_epoch
    hint_queue = host_queue_url(HINT_QUEUE)
    samples.drain(hint_queue)

    # WHEN the sample is invoked
    report = invoke("ecs_task_stopped")

    # THEN that incarnation is dead at once and its connection hinted
    assert (report["outcome"], report["killed"], report["hints_sent"]) == (
        "failed_over",
        [crashed],
        1,
    )
    assert leases.get_worker(crashed, consistent=True).dead
    assert Hint(pk, epoch).body() in samples.drain(hint_queue)


def test_every_sample_was_invoked() -> None:
    # Runs last (file order): a sample added to events/ without a check here fails.
    assert set(ALL_SAMPLES) == CHECKED
