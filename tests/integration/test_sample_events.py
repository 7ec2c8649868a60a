"""Every sample in ``events/`` through its handler, the way ``sam local invoke`` runs it.

``sam local invoke <Function> -e events/<sample>.json`` (README, "Invoke one function with sam
local") needs Docker, which CI does not have; this runs the same handlers in-process with the
values of ``env.json`` (the file samconfig.toml hands to ``--env-vars``), against the embedded
backend with the resources ``python -m wsfleet_local.backend --create-resources wsfleet``
creates, on today's clock. So a sample that only shows its path on the day it was written
(a lease that has since lapsed) fails here.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from boto3.dynamodb.types import TypeDeserializer
from lambda_helpers import control_queue, drain_queue

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.control import StopCommand
from wsfleet.hints import Hint
from wsfleet.record import ConnectionRecord, WorkerRecord, index_keys
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.backend import find_template, load_template, provision_resources
from wsfleet_local.handler_loader import lambda_context, load_function
from wsfleet_local.stack import read_stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

ROOT = Path(find_template()).parent
EVENTS = ROOT / "events"
ENV_JSON = json.loads((ROOT / "env.json").read_text())
#: Where env.json expects the backend (``--port 4566``); the test's backend has its own port.
ENV_ENDPOINT = ENV_JSON["Parameters"]["AWS_ENDPOINT_URL"]
STACK = read_stack(load_template(find_template()))
BY_LOGICAL_ID = {spec.logical_id: spec for spec in STACK.functions.values()}
#: Sample name prefix -> the function `sam local invoke` is given it with (README's table).
FUNCTION_OF_PREFIX = {
    "api_": "RouterFunction",
    "scheduler_": "ReconcilerFunction",
    "stream_": "StreamNotifierFunction",
    "ecs_": "TaskExitFunction",
}


def function_of(sample: str) -> str:
    (logical_id,) = [f for p, f in FUNCTION_OF_PREFIX.items() if sample.startswith(p)]
    return logical_id


def env_for(logical_id: str, endpoint_url: str) -> dict[str, str]:
    """What --env-vars gives the function: Parameters, then its own section, env.json's backend
    address swapped for the test backend's."""
    values = {**ENV_JSON["Parameters"], **ENV_JSON.get(logical_id, {})}
    return {name: value.replace(ENV_ENDPOINT, endpoint_url) for name, value in values.items()}


def test_env_json_sets_only_variables_the_template_declares() -> None:
    # SAM ignores an --env-vars entry the function does not declare: it would do nothing.
    for section, values in ENV_JSON.items():
        targets = BY_LOGICAL_ID.values() if section == "Parameters" else [BY_LOGICAL_ID[section]]
        for spec in targets:
            assert set(values) <= set(spec.environment), (section, spec.logical_id)


@pytest.mark.parametrize("command", ["local_invoke", "local_start_api"])
def test_samconfig_sam_local_uses_env_json_and_its_endpoint(command: str) -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    local = config["default"][command]["parameters"]
    assert local["env_vars"] == "env.json"
    assert local["parameter_overrides"] == [f'LocalEndpointUrl="{ENV_ENDPOINT}"']
    # The containers reach the host by name (README: "How the containers reach the backend"):
    # a "host" docker_network is skipped by SAM CLI, leaving 127.0.0.1 the container itself.
    host = urlsplit(ENV_ENDPOINT).hostname
    assert host == "host.docker.internal"
    assert local["add_host"] == [f"{host}:host-gateway"]
    assert "docker_network" not in local


def test_every_sample_belongs_to_a_function() -> None:
    for path in EVENTS.glob("*.json"):
        assert function_of(path.stem) in BY_LOGICAL_ID


@pytest.fixture(scope="module")
def local_stack(backend: Any) -> Any:
    """The resources of `python -m wsfleet_local.backend --create-resources wsfleet`."""
    return provision_resources(backend.endpoint_url, "wsfleet", region=backend.region)


def test_env_json_names_the_resources_the_local_backend_creates(local_stack: Any) -> None:
    env = env_for("RouterFunction", local_stack.endpoint_url)
    assert env["CONNECTIONS_TABLE"] == local_stack.connections_table
    assert env["MESSAGES_TABLE"] == local_stack.messages_table
    assert urlsplit(env["HINT_QUEUE_URL"]).path == urlsplit(local_stack.hint_queue_url).path


@pytest.fixture
def invoke(local_stack: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs a sample through its function's handler with env.json's values."""
    for name, value in env_for("Parameters", local_stack.endpoint_url).items():
        monkeypatch.setenv(name, value)  # the backend and names, for the test's own calls too

    def run(sample: str, *, timeout_ms: int = 10_000) -> dict[str, Any]:
        logical_id = function_of(sample)
        for name, value in env_for(logical_id, local_stack.endpoint_url).items():
            monkeypatch.setenv(name, value)
        spec = BY_LOGICAL_ID[logical_id]
        module = load_function(spec.name)
        module.reset_dependencies()
        event = json.loads((EVENTS / f"{sample}.json").read_text())
        try:
            return dict(
                module.lambda_handler(event, lambda_context(spec.name, timeout_ms=timeout_ms))
            )
        finally:
            module.reset_dependencies()

    return run


def live_worker(worker_id: str, *, queue_deleted: bool = False) -> str:
    """A worker item alive for a minute from now, with its control queue (env.json's prefix)."""
    prefix = ENV_JSON["StreamNotifierFunction"]["CONTROL_QUEUE_PREFIX"]
    sqs = boto3.client("sqs")
    url = control_queue(sqs, prefix, worker_id)
    if queue_deleted:
        sqs.delete_queue(QueueUrl=url)
    now = now_ms()
    store = DynamoDBLeaseStore(dynamodb_client(), ENV_JSON["Parameters"]["CONNECTIONS_TABLE"])
    store.register_worker(
        WorkerRecord(
            worker_id=worker_id,
            control_queue_url=url,
            started_at_ms=now - 60_000,
            heartbeat_at_ms=now,
            expires_at_ms=now + 60_000,
        )
    )
    return url


def drain(queue_url: str) -> list[str]:
    return drain_queue(boto3.client("sqs"), queue_url)


def failed_ids(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def sequence_numbers(sample: str) -> list[str]:
    event = json.loads((EVENTS / f"{sample}.json").read_text())
    return [record["dynamodb"]["SequenceNumber"] for record in event["Records"]]


# A connection item carries no expiry (lease model v2): its owner is alive while the owner's
# worker item is, registered here on today's clock, so each sample shows its path on whatever
# day it is invoked.
def test_stream_samples_on_todays_clock(invoke: Any) -> None:
    # GIVEN worker-a alive with a working control queue; worker-b alive but its queue gone
    # (mid-restart), the setup README describes for the partial-failure sample
    queue_a = live_worker("worker-a")
    live_worker("worker-b", queue_deleted=True)

    # WHEN each stream sample is invoked, THEN each does what README's table says
    check_stream_samples(invoke, queue_a)


def check_stream_samples(invoke: Any, queue_a: str) -> None:
    """Every stream sample's documented effect, given worker-a (its queue ``queue_a``) and
    worker-b (no queue) alive."""
    # a STOP transition reaches its owner
    assert invoke("stream_stop_modify") == {"batchItemFailures": []}
    assert drain(queue_a) == [StopCommand("CONN#ticker-btc-usd", 3).body()]
    # the batch reports exactly worker-b's record; worker-a's STOP went through
    batch = "stream_batch_partial_failure"
    assert failed_ids(invoke(batch)) == [sequence_numbers(batch)[1]]
    assert drain(queue_a) == [StopCommand("CONN#ticker-btc-eur", 5).body()]
    # records that are not STOP transitions (a checkpoint, a release, an INSERT, a TTL REMOVE)
    # send nothing
    for sample in ("stream_ignored_modify", "stream_insert", "stream_remove_ttl"):
        assert invoke(sample) == {"batchItemFailures": []}, sample
    assert drain(queue_a) == []


@pytest.mark.parametrize("sample", sorted(p.stem for p in EVENTS.glob("stream_*.json")))
def test_stream_sample_images_are_v2_connection_items(sample: str) -> None:
    # Each image is what the store would have written: no per-connection expiry, no
    # lease_owner while free (an empty index key is invalid), and exactly the index keys
    # index_keys() derives for its state and ownership.
    deserializer = TypeDeserializer()
    for record in json.loads((EVENTS / f"{sample}.json").read_text())["Records"]:
        for name in ("NewImage", "OldImage"):
            raw = record["dynamodb"].get(name)
            if raw is None:
                continue
            image = {k: deserializer.deserialize(v) for k, v in raw.items()}
            connection = ConnectionRecord.from_item(image)
            assert "lease_expires_at_ms" not in image, (sample, name)
            assert image.get("lease_owner", "x") != "", (sample, name)
            keys, removed = index_keys(
                connection.pk,
                connection.desired_state,
                owned=bool(connection.lease_owner),
                since_ms=connection.unowned_since_ms or 0,
            )
            assert {k: image.get(k) for k in keys} == keys, (sample, name)
            assert not set(removed) & set(image), (sample, name)


def test_remove_sample_is_a_ttl_deletion() -> None:
    (record,) = json.loads((EVENTS / "stream_remove_ttl.json").read_text())["Records"]
    assert record["eventName"] == "REMOVE"
    # DynamoDB marks TTL deletions with this service principal; the filter drops them anyway.
    assert record["userIdentity"] == {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    assert "NewImage" not in record["dynamodb"]


def test_scheduler_sample_runs_a_pass(invoke: Any) -> None:
    # One pass (a 1 s budget leaves time for only the first, which always runs).
    response = invoke("scheduler_reconcile", timeout_ms=1_000)
    assert response["passes"] == 1
    assert response["hints_failed"] == 0


def test_ecs_task_stopped_sample_fails_its_worker_over(invoke: Any) -> None:
    # GIVEN the incarnation the sample's container ran, live (lease far from expiry), owning a
    # STARTED connection; and a second incarnation of another task
    detail = json.loads((EVENTS / "ecs_task_stopped.json").read_text())["detail"]
    (container,) = detail["containers"]
    table = ENV_JSON["Parameters"]["CONNECTIONS_TABLE"]
    store = DynamoDBLeaseStore(dynamodb_client(), table)
    now = now_ms()
    task_id = detail["taskArn"].rsplit("/", 1)[-1]
    crashed = f"{task_id}.ip-10-0-1-23-7-a1b2c3"
    for worker_id, task_arn in ((crashed, detail["taskArn"]), ("other", detail["taskArn"] + "0")):
        store.register_worker(WorkerRecord(
            worker_id=worker_id, control_queue_url="", started_at_ms=now - 60_000,
            heartbeat_at_ms=now, expires_at_ms=now + 60_000, task_arn=task_arn,
            container_runtime_id=container["runtimeId"],
        ))  # fmt: skip
    pk = store.start("exited-1", "wss://up.example/s").record.pk
    epoch = store.acquire(pk, crashed).lease_epoch
    hint_queue = ENV_JSON["Parameters"]["HINT_QUEUE_URL"].replace(
        ENV_ENDPOINT, boto3.client("sqs").meta.endpoint_url
    )
    drain(hint_queue)

    # WHEN the sample is invoked
    report = invoke("ecs_task_stopped")

    # THEN that incarnation is dead at once and its connection hinted; the other is untouched
    assert (report["outcome"], report["killed"], report["hints_sent"]) == (
        "failed_over", [crashed], 1,
    )
    assert store.get_worker(crashed, consistent=True).dead
    assert not store.get_worker("other", consistent=True).dead
    assert Hint(pk, epoch).body() in drain(hint_queue)
    # AND the same event again does nothing more (at least once delivery)
    again = invoke("ecs_task_stopped")
    assert (again["killed"], again["already_dead"], again["hints_sent"]) == ([], [crashed], 1)
    taken = store.acquire(pk, "peer")  # the dead owner is taken over without waiting
    assert taken.lease_owner == "peer"
    assert invoke("ecs_task_stopped")["hints_sent"] == 0


#: The API samples in README order on a fresh table, with the answer each one shows.
API_SAMPLES_IN_ORDER = [
    ("api_post_events_start", 201),
    ("api_get_connection", 200),
    ("api_put_connection", 201),
    ("api_list_connections", 200),
    ("api_delete_connection", 200),
    ("api_post_events_stop", 200),
    ("api_post_events_invalid", 422),
    ("api_post_events_extra_field", 422),
    ("api_post_events_metadata_url", 422),
    ("api_post_events_not_json", 400),
    ("api_put_connection_bad_id", 422),
    ("api_list_connections_bad_token", 400),
    # Real upstreams (README "Real upstreams"): env.json's UPSTREAM_SECRET_PREFIXES admits the
    # secret the first one names.
    ("api_put_connection_header_secret", 201),
    ("api_post_events_start_subscribe", 201),
    ("api_put_connection_live_only", 201),
    ("api_post_events_header_in_plain", 422),
]

SECRET_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/feeds/acme-token-AbCdEf"


def check_upstream_answer(name: str, body: dict[str, Any]) -> None:
    """What each upstream sample's answer shows (the others are checked by status alone)."""
    if name == "api_put_connection_header_secret":
        # the reference is stored and shown, never a value; header values are masked
        assert body["upstream"] == {
            "headers": {"X-Client": "***"},
            "subprotocols": ["transcribe.v1"],
            "credential": {"ref": SECRET_REF, "header": "Authorization",
                           "format": "Bearer {{secret}}"},
        }
        assert body["gaps"] == {"resumes": 0, "frames": 0}
    elif name == "api_post_events_start_subscribe":
        assert body["upstream"] == {
            "subscribe": {"op": "subscribe", "channel": "trades", "from": "{{from_seq}}"},
            "seq_pointer": "/data/seq",
            "resume": "subscribe",
        }
    elif name == "api_put_connection_live_only":
        assert body["upstream"] == {"resume": "none"}
        assert body["gaps"] == {"resumes": 0, "frames": 0}
    elif name == "api_post_events_header_in_plain":
        # a credential in a plain header is refused, naming the field, without echoing it
        assert body["field"] == "upstream.headers"
        assert "upstream.credential" in body["message"]
        assert "sk-live-not-for-dynamodb" not in json.dumps(body)


def test_api_samples_in_order(invoke: Any) -> None:
    assert {name for name, _ in API_SAMPLES_IN_ORDER} == {p.stem for p in EVENTS.glob("api_*.json")}
    for name, status in API_SAMPLES_IN_ORDER:
        response = invoke(name)
        assert response["statusCode"] == status, (name, response["body"])
        check_upstream_answer(name, json.loads(response["body"]))


def test_env_json_admits_the_secret_the_header_sample_names() -> None:
    prefixes = ENV_JSON["RouterFunction"]["UPSTREAM_SECRET_PREFIXES"].split(",")
    assert any(SECRET_REF.startswith(prefix) for prefix in prefixes)


@pytest.fixture
def seeded_backend() -> Any:
    """`make local-backend`'s command on a free port: a fresh backend, resources, samples."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "wsfleet_local.backend", "--port", "0",
         "--create-resources", "wsfleet", "--seed-samples", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        yield json.loads(process.stdout.readline())
    finally:
        process.terminate()
        process.wait(30)


def test_stream_samples_show_their_effect_on_a_fresh_seeded_backend(
    seeded_backend: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN nothing but `make local-backend` (its --seed-samples): worker-a with its queue,
    # worker-b without one, as README's sample table describes
    endpoint = seeded_backend["endpoint_url"]
    for name, value in env_for("StreamNotifierFunction", endpoint).items():
        monkeypatch.setenv(name, value)
    spec = BY_LOGICAL_ID["StreamNotifierFunction"]
    module = load_function(spec.name)

    def invoke(sample: str) -> dict[str, Any]:
        module.reset_dependencies()
        event = json.loads((EVENTS / f"{sample}.json").read_text())
        try:
            return dict(module.lambda_handler(event, lambda_context(spec.name)))
        finally:
            module.reset_dependencies()

    # WHEN the stream samples are invoked THEN each does what README says
    check_stream_samples(invoke, seeded_backend["sample_workers"]["worker-a"])
