"""Router Lambda end to end: API Gateway events in, DynamoDB items and SQS hints out.

The handler is loaded the way the local runtime loads it (``load_function("router")``) and runs
against the embedded moto server through the ``aws`` fixture: fresh tables and queue per test,
reached over HTTP. Every sample event in ``events/api_*.json`` is replayed here.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lambda_helpers import drain_queue, fresh_function

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import now_ms
from wsfleet.hints import Hint
from wsfleet.lease import Lease
from wsfleet.record import DesiredState, WorkerRecord, connection_pk
from wsfleet.store import DynamoDBLeaseStore, LeaseStore
from wsfleet_local.handler_loader import lambda_context

pytestmark = [
    pytest.mark.integration,
    # Reads and refusals publish no metric, which Powertools warns about on every flush.
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

EVENTS = Path(__file__).resolve().parents[2] / "events"
URL = "wss://stream.example.com/v1/trades?symbol=BTC-USD"
SECRET_URL = "wss://stream.example.com/feed?token=s3cret-value"


# ---------------------------------------------------------------------- helpers
@dataclass
class Reply:
    status: int
    body: dict[str, Any]


def sample(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / f"{name}.json").read_text())


def api_event(
    method: str,
    path: str,
    body: Any = None,
    *,
    query: dict[str, str] | None = None,
    raw_body: str | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A REST proxy event shaped like the samples, for requests the samples do not cover."""
    event = copy.deepcopy(sample("api_post_events_start"))
    resource = "/connections/{id}" if path.startswith("/connections/") else path
    event.update(
        httpMethod=method,
        path=path,
        resource=resource,
        body=raw_body if raw_body is not None else (None if body is None else json.dumps(body)),
        queryStringParameters=query,
        multiValueQueryStringParameters={k: [v] for k, v in query.items()} if query else None,
        pathParameters={"id": path.rsplit("/", 1)[1]} if resource != path else None,
    )
    event["requestContext"].update(httpMethod=method, resourcePath=resource, path=f"/dev{path}")
    for name, value in (headers or {}).items():
        event["headers"][name] = value
        event["multiValueHeaders"][name] = [value]
    return event


def base64_body(event: dict[str, Any], data: bytes) -> dict[str, Any]:
    """``event`` with ``data`` as its body, base64-encoded the way API Gateway sends binary."""
    return {**event, "body": base64.b64encode(data).decode(), "isBase64Encoded": True}


def token_of(text: str) -> str:
    """A page token wrapping ``text`` the way the router encodes its own (unpadded base64url)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def invoke(router: Any, event: dict[str, Any]) -> Reply:
    """Run one event; a successful answer must match the response model docs/openapi.json
    documents for it."""
    response = router.lambda_handler(event, lambda_context("router"))
    assert response["multiValueHeaders"]["Content-Type"] == ["application/json"]
    reply = Reply(response["statusCode"], json.loads(response["body"]))
    if 200 <= reply.status < 300:
        if "items" in reply.body:
            router.ConnectionPageView.model_validate(reply.body)
        elif "outcome" in reply.body:
            router.ConnectionOutcome.model_validate(reply.body)
        else:
            router.ConnectionView.model_validate(reply.body)
    return reply


def start(router: Any, connection_id: str, ws_url: str = URL) -> Reply:
    return invoke(router, api_event("PUT", f"/connections/{connection_id}", {"ws_url": ws_url}))


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the log records carry: messages, structured extras and tracebacks."""
    return "\n".join(json.dumps(vars(record), default=str) for record in caplog.records)


def emitted_metrics(stdout: str) -> dict[str, float]:
    """Sum every metric in the CloudWatch EMF lines Powertools printed."""
    totals: dict[str, float] = {}
    for line in stdout.splitlines():
        if not line.startswith("{") or '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                name = metric["Name"]
                values = blob[name] if isinstance(blob[name], list) else [blob[name]]
                totals[name] = totals.get(name, 0) + sum(values)
    return totals


@pytest.fixture
def router(aws, monkeypatch: pytest.MonkeyPatch):
    """The router module with fresh dependencies pointed at this test's resources."""
    yield from fresh_function(
        "router",
        monkeypatch,
        ALLOWED_UPSTREAM_HOSTS="example.com,127.0.0.1",
        ALLOW_INSECURE_WS="true",
        POWERTOOLS_SERVICE_NAME="wsfleet-router",
    )


@pytest.fixture
def store(aws) -> LeaseStore:
    return DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=20_000)


@pytest.fixture
def hints(aws):
    """Reads (and deletes) what landed on the hint queue."""
    client = sqs_client()

    def drain() -> list[Hint]:
        return [Hint.parse(body) for body in drain_queue(client, aws.hint_queue_url)]

    return drain


def register(store: LeaseStore, worker_id: str, *, lease_ms: int = 20_000) -> WorkerRecord:
    """A worker item whose lease runs ``lease_ms`` from now (negative: lapsed already)."""
    now = now_ms()
    worker = WorkerRecord(
        worker_id=worker_id, control_queue_url=f"http://q/{worker_id}", started_at_ms=now,
        heartbeat_at_ms=now, expires_at_ms=now + lease_ms,
    )
    store.register_worker(worker)
    return worker


@pytest.fixture
def worker_a(store: LeaseStore) -> WorkerRecord:
    """A live worker: connections it acquires are held."""
    return register(store, "worker-a")


def all_items(aws) -> list[dict[str, Any]]:
    return dynamodb_client().scan(TableName=aws.connections_table)["Items"]


# ---------------------------------------------------------------------- sample events
def _given_demo_1(router: Any) -> None:
    assert start(router, "demo-1").status == 201


def _given_demo_2(router: Any) -> None:
    assert start(router, "demo-2").status == 201


def _given_three(router: Any) -> None:
    for connection_id in ("demo-1", "demo-2", "demo-3"):
        assert start(router, connection_id).status == 201


@dataclass(frozen=True)
class Expect:
    status: int
    given: Any = None
    body: dict[str, Any] | None = None  # key -> expected value (top level)
    field: str | None = None  # for refusals: the field the error names
    env: dict[str, str] | None = None  # the router's settings for this sample (env.json's)


EXPECTED: dict[str, Expect] = {
    "api_post_events_start": Expect(
        201, body={"connection_id": "demo-1", "desired_state": "STARTED", "outcome": "created"}
    ),
    "api_post_events_stop": Expect(
        200, _given_demo_1, {"connection_id": "demo-1", "desired_state": "STOPPED",
                             "outcome": "stopped", "stop_reason": "stopped"}
    ),
    "api_put_connection": Expect(
        201, body={"connection_id": "demo-2", "desired_state": "STARTED", "resume": True}
    ),
    "api_delete_connection": Expect(
        200, _given_demo_2, {"connection_id": "demo-2", "desired_state": "STOPPED"}
    ),
    "api_get_connection": Expect(
        200, _given_demo_1, {"connection_id": "demo-1", "desired_state": "STARTED", "last_seq": 0}
    ),
    "api_list_connections": Expect(200, _given_three),
    "api_post_events_invalid": Expect(422, field="event_type"),
    "api_post_events_extra_field": Expect(422, field="priority"),
    "api_post_events_not_json": Expect(400, field="body"),
    "api_post_events_metadata_url": Expect(422, field="ws_url"),
    "api_put_connection_bad_id": Expect(422, field="connection_id"),
    "api_list_connections_bad_token": Expect(400, field="next_token"),
    "api_put_connection_header_secret": Expect(
        201,
        body={"connection_id": "demo-3", "gaps": {"resumes": 0, "frames": 0}},
        env={"UPSTREAM_SECRET_PREFIXES": "arn:aws:secretsmanager:us-east-1:123456789012:secret:"
                                         "wsfleet/"},
    ),
    "api_post_events_start_subscribe": Expect(201, body={"connection_id": "demo-4"}),
    "api_put_connection_live_only": Expect(
        201, body={"connection_id": "demo-5", "upstream": {"resume": "none"}}
    ),
    "api_post_events_header_in_plain": Expect(422, field="upstream.headers"),
}


def test_every_sample_event_has_an_expectation():
    on_disk = {path.stem for path in EVENTS.glob("api_*.json")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_event(router, name, monkeypatch):
    expect = EXPECTED[name]
    for variable, value in (expect.env or {}).items():
        monkeypatch.setenv(variable, value)
    router.reset_dependencies()
    if expect.given:
        expect.given(router)

    reply = invoke(router, sample(name))

    assert reply.status == expect.status, reply.body
    for key, value in (expect.body or {}).items():
        assert reply.body[key] == value, key
    if expect.field:
        assert reply.body["field"] == expect.field
        assert reply.body["errors"][0]["field"] == expect.field
        assert reply.body["message"]


def test_sample_list_event_pages(router):
    _given_three(router)

    reply = invoke(router, sample("api_list_connections"))

    assert [item["desired_state"] for item in reply.body["items"]] == ["STARTED", "STARTED"]
    assert reply.body["next_token"]


def test_sample_metadata_url_is_refused_for_ssrf_and_nothing_is_written(router, aws):
    reply = invoke(router, sample("api_post_events_metadata_url"))

    assert "169.254.169.254" in reply.body["message"]
    assert "not in ALLOWED_UPSTREAM_HOSTS" in reply.body["message"]
    assert all_items(aws) == []


# ---------------------------------------------------------------------- START
def test_start_creates_the_record_and_sends_a_hint(router, store, hints, capsys, caplog):
    reply = invoke(
        router,
        api_event("POST", "/events",
                  {"event_type": "START", "connection_id": "c1", "ws_url": SECRET_URL}),
    )

    assert reply.status == 201
    assert reply.body["outcome"] == "created"
    assert reply.body["lease"] == {
        "state": "free", "owner": None, "epoch": 0, "expires_in_ms": None,
    }
    assert reply.body["ws_url"] == "wss://stream.example.com/feed?token=***"
    record = store.get(connection_pk("c1"))
    assert record is not None
    assert record.desired_state is DesiredState.STARTED
    assert record.ws_url == SECRET_URL  # stored as given; only views are redacted
    assert hints() == [Hint(connection_pk("c1"))]
    output = capsys.readouterr()
    assert "s3cret-value" not in output.out + output.err + logged(caplog)
    assert "token=***" in logged(caplog)
    assert emitted_metrics(output.out).get("ConnectionsStarted") == 1


def test_event_type_is_case_insensitive(router, store):
    reply = invoke(
        router,
        api_event("POST", "/events", {"event_type": "start", "connection_id": "c1", "ws_url": URL}),
    )

    assert reply.status == 201
    assert store.get(connection_pk("c1")) is not None


def test_put_with_resume_false_is_stored(router, store):
    reply = invoke(router, api_event("PUT", "/connections/c1", {"ws_url": URL, "resume": False}))

    assert reply.status == 201
    assert reply.body["resume"] is False
    assert store.get(connection_pk("c1")).resume is False


def test_restart_of_a_live_connection_leaves_its_lease_untouched(router, store, hints, worker_a):
    assert start(router, "c1").status == 201
    held = store.acquire(connection_pk("c1"), owner="worker-a")
    store.checkpoint(Lease.of(held), 42)
    hints()  # the creation hint

    reply = start(router, "c1", "wss://other.example.com/feed")

    assert reply.status == 200
    assert reply.body["outcome"] == "already_started"
    assert reply.body["lease"]["state"] == "held"
    assert reply.body["lease"]["owner"] == "worker-a"
    assert reply.body["last_seq"] == 42
    after = store.get(connection_pk("c1"))
    assert (after.lease_owner, after.lease_epoch) == (held.lease_owner, held.lease_epoch)
    assert after.ws_url == URL  # a START never re-points a running connection
    assert after.last_seq == 42
    assert hints() == []  # a held lease needs no hint


def test_repeated_start_without_a_live_lease_hints_again(router, hints, capsys):
    assert start(router, "c1").status == 201

    reply = start(router, "c1")

    assert reply.status == 200
    assert reply.body["outcome"] == "already_started"
    assert hints() == [Hint(connection_pk("c1")), Hint(connection_pk("c1"))]
    assert emitted_metrics(capsys.readouterr().out).get("ConnectionsStarted") == 1


def test_start_hints_a_connection_whose_owner_lease_lapsed(router, store, hints):
    # GIVEN a STARTED connection owned by a worker whose lease has lapsed (it crashed)
    assert start(router, "c1").status == 201
    register(store, "worker-gone", lease_ms=-1_000)
    store.acquire(connection_pk("c1"), owner="worker-gone")
    hints()
    # WHEN it is STARTed again
    reply = start(router, "c1")
    # THEN nothing moves, but the view says expired and a nudge goes out
    assert (reply.status, reply.body["outcome"]) == (200, "already_started")
    assert reply.body["lease"] == {
        "state": "expired", "owner": "worker-gone", "epoch": 1, "expires_in_ms": 0,
    }
    assert hints() == [Hint(connection_pk("c1"))]


def test_start_after_stop_restarts(router, store, hints):
    assert start(router, "c1").status == 201
    held = store.acquire(connection_pk("c1"), owner="worker-a")
    store.checkpoint(Lease.of(held), 7)
    assert invoke(router, api_event("DELETE", "/connections/c1")).status == 200
    store.release(Lease.of(held))
    hints()

    reply = start(router, "c1")

    assert reply.status == 200
    assert reply.body["outcome"] == "restarted"
    assert reply.body["desired_state"] == "STARTED"
    assert reply.body["stop_reason"] is None
    assert reply.body["last_seq"] == 7  # same URL: resumes where it stopped
    assert store.get(connection_pk("c1")).desired_state is DesiredState.STARTED
    assert hints() == [Hint(connection_pk("c1"))]


def test_a_failed_connection_is_shown_listed_and_restarted_by_start(router, store, hints):
    # GIVEN a connection the crash-loop breaker ended FAILED at checkpoint 7
    assert start(router, "c1").status == 201
    held = store.acquire(connection_pk("c1"), owner="worker-a")
    reason = "closed_by_worker (code 1009: message too big)"
    store.mark_failed(Lease.of(held), reason, count=5, at_seq=7, last_seq=7)
    hints()
    # WHEN it is read and listed
    view = invoke(router, api_event("GET", "/connections/c1")).body
    listed = list_page(router, state="failed").body["items"]
    # THEN the reason and the count are visible, and only ?state=FAILED lists it
    assert (view["desired_state"], view["stop_reason"], view["last_error"]) == (
        "FAILED", reason, reason,
    )
    assert view["failures"] == {"count": 5, "at_seq": 7}
    assert view["lease"]["state"] == "free"
    assert [item["connection_id"] for item in listed] == ["c1"]
    assert list_page(router).body["items"] == []
    # WHEN it is STARTed again
    reply = start(router, "c1")
    # THEN it restarts like a STOPPED one: breaker reset, checkpoint kept, a hint sent
    assert (reply.status, reply.body["outcome"], reply.body["desired_state"]) == (
        200, "restarted", "STARTED",
    )
    assert reply.body["failures"] == {"count": 0, "at_seq": None}
    assert (reply.body["stop_reason"], reply.body["last_error"], reply.body["last_seq"]) == (
        None, None, 7,
    )
    assert hints() == [Hint(connection_pk("c1"))]


def test_hint_send_failure_still_succeeds_and_is_counted(
    router, aws, store, monkeypatch, capsys, caplog
):
    monkeypatch.setenv("HINT_QUEUE_URL", aws.hint_queue_url + "-does-not-exist")
    router.reset_dependencies()

    reply = start(router, "c1", SECRET_URL)

    assert reply.status == 201
    assert store.get(connection_pk("c1")) is not None
    output = capsys.readouterr()
    assert emitted_metrics(output.out).get("HintSendFailed") == 1
    assert "hint not sent" in caplog.text
    assert "s3cret-value" not in output.out + output.err + logged(caplog)


# ---------------------------------------------------------------------- STOP
@pytest.mark.parametrize(
    "event",
    [
        api_event("DELETE", "/connections/ghost"),
        api_event("POST", "/events", {"event_type": "STOP", "connection_id": "ghost"}),
    ],
    ids=["delete", "post-events"],
)
def test_stop_of_an_unknown_connection_is_404(router, aws, event):
    reply = invoke(router, event)

    assert reply.status == 404
    assert reply.body == {
        "message": "connection ghost not found",
        "field": "connection_id",
        "errors": [{"field": "connection_id", "message": "connection ghost not found"}],
    }
    assert all_items(aws) == []


def test_stop_is_idempotent(router, store, capsys):
    assert start(router, "c1").status == 201

    first = invoke(router, api_event("DELETE", "/connections/c1"))
    second = invoke(router, api_event("DELETE", "/connections/c1"))

    assert (first.status, second.status) == (200, 200)
    assert (first.body["outcome"], second.body["outcome"]) == ("stopped", "already_stopped")
    assert second.body["updated_at_ms"] == first.body["updated_at_ms"]
    assert store.get(connection_pk("c1")).desired_state is DesiredState.STOPPED
    assert emitted_metrics(capsys.readouterr().out).get("ConnectionsStopped") == 1


def test_stop_leaves_a_held_lease_to_its_owner(router, store, worker_a):
    assert start(router, "c1").status == 201
    held = store.acquire(connection_pk("c1"), owner="worker-a")

    reply = invoke(router, api_event("DELETE", "/connections/c1"))

    assert reply.body["lease"]["state"] == "held"
    assert store.get(connection_pk("c1")).lease_epoch == held.lease_epoch


# ---------------------------------------------------------------------- GET
def test_get_shows_the_lease_state(router, store, worker_a):
    assert start(router, "c1").status == 201
    store.acquire(connection_pk("c1"), owner="worker-a")

    reply = invoke(router, api_event("GET", "/connections/c1"))

    assert reply.status == 200
    lease = reply.body["lease"]
    assert (lease["state"], lease["owner"], lease["epoch"]) == ("held", "worker-a", 1)
    assert 0 < lease["expires_in_ms"] <= 20_000
    assert set(reply.body) == {
        "connection_id", "desired_state", "ws_url", "resume", "last_seq", "lease",
        "stop_reason", "last_error", "failures", "upstream", "gaps", "replayed",
        "created_at_ms", "updated_at_ms",
    }
    assert reply.body["replayed"] == {"takeovers": 0, "frames": 0, "from_seq": None, "to_seq": None}


@pytest.mark.parametrize(
    ("owner", "lease_ms", "kill"),
    [("worker-lapsed", -1_000, False), ("worker-killed", 20_000, True), ("worker-gone", 0, False)],
    ids=["lapsed", "killed", "item-gone"],
)
def test_get_shows_expired_once_the_owners_worker_lease_is_over(
    router, store, owner, lease_ms, kill
):
    assert start(router, "c1").status == 201
    if lease_ms:
        register(store, owner, lease_ms=lease_ms)
    store.acquire(connection_pk("c1"), owner=owner)
    if kill:  # retire_worker: dead for good, whatever its expiry said
        store.retire_worker(owner)

    lease = invoke(router, api_event("GET", "/connections/c1")).body["lease"]

    assert lease == {"state": "expired", "owner": owner, "epoch": 1, "expires_in_ms": 0}


def test_get_of_an_unknown_connection_is_404(router, aws):
    reply = invoke(router, api_event("GET", "/connections/ghost"))

    assert reply.status == 404
    assert reply.body["field"] == "connection_id"


# ---------------------------------------------------------------------- list
def list_page(router: Any, **query: str) -> Reply:
    return invoke(router, api_event("GET", "/connections", query=query))


def test_list_pages_through_every_connection(router):
    for index in range(5):
        assert start(router, f"c{index}").status == 201
    seen: list[str] = []
    token: str | None = None
    pages = 0

    while True:
        query = {"limit": "2", **({"next_token": token} if token else {})}
        reply = list_page(router, **query)
        assert reply.status == 200
        assert len(reply.body["items"]) <= 2
        seen.extend(item["connection_id"] for item in reply.body["items"])
        pages += 1
        token = reply.body["next_token"]
        if token is None:
            break

    assert sorted(seen) == [f"c{index}" for index in range(5)]
    assert pages >= 3


def test_list_pages_across_every_index_shard_without_repeats(router):
    # 40 connections spread over the 16 gsi_state shards; pages of 3 end mid-shard and at
    # shard boundaries alike.
    ids = [f"c{index:02d}" for index in range(40)]
    for connection_id in ids:
        assert start(router, connection_id).status == 201
    seen: list[str] = []
    token: str | None = None
    while True:
        reply = list_page(router, limit="3", **({"next_token": token} if token else {}))
        assert reply.status == 200, reply.body
        seen.extend(item["connection_id"] for item in reply.body["items"])
        token = reply.body["next_token"]
        if token is None:
            break

    assert sorted(seen) == ids  # each exactly once


def test_list_shows_each_items_lease_with_one_batch_read_of_its_owners(router, store, aws):
    # GIVEN connections held by a live worker, by a lapsed one, and a free one
    for connection_id in ("held-1", "held-2", "lapsed", "free"):
        assert start(router, connection_id).status == 201
    register(store, "worker-a")
    register(store, "worker-b", lease_ms=-1_000)
    for connection_id, owner in (("held-1", "worker-a"), ("held-2", "worker-a"),
                                 ("lapsed", "worker-b")):
        store.acquire(connection_pk(connection_id), owner=owner)
    requests: list[tuple[str, dict[str, Any]]] = []
    client = router.dependencies().store._client
    client.meta.events.register(
        "provide-client-params.dynamodb.*",
        lambda params, model, **_: requests.append((model.name, dict(params))),
    )
    # WHEN one page lists them all
    reply = list_page(router, limit="10")
    # THEN every item shows its own lease state
    leases = {item["connection_id"]: item["lease"] for item in reply.body["items"]}
    assert {cid: lease["state"] for cid, lease in leases.items()} == {
        "held-1": "held", "held-2": "held", "lapsed": "expired", "free": "free",
    }
    assert 0 < leases["held-1"]["expires_in_ms"] <= 20_000
    assert leases["free"]["expires_in_ms"] is None
    # AND the owners were read once each, in one BatchGetItem, and no GetItem was made
    worker_reads = [
        params for op, params in requests if op == "BatchGetItem"
        and any(key["pk"]["S"].startswith("WORKER#")
                for table in params["RequestItems"].values() for key in table["Keys"])
    ]
    (batch,) = worker_reads
    (keys,) = [table["Keys"] for table in batch["RequestItems"].values()]
    assert sorted(key["pk"]["S"] for key in keys) == ["WORKER#worker-a", "WORKER#worker-b"]
    assert not [op for op, _ in requests if op == "GetItem"]


def test_list_filters_by_state(router):
    for connection_id in ("a", "b", "c"):
        assert start(router, connection_id).status == 201
    assert invoke(router, api_event("DELETE", "/connections/b")).status == 200

    stopped = list_page(router, state="stopped")  # case-insensitive
    started = list_page(router)  # STARTED by default

    assert [item["connection_id"] for item in stopped.body["items"]] == ["b"]
    assert sorted(item["connection_id"] for item in started.body["items"]) == ["a", "c"]
    assert stopped.body["next_token"] is None


def test_list_refuses_a_token_issued_for_another_state(router):
    for connection_id in ("a", "b"):
        assert start(router, connection_id).status == 201
    token = list_page(router, limit="1").body["next_token"]

    reply = list_page(router, state="STOPPED", next_token=token)

    assert reply.status == 400
    assert reply.body["field"] == "next_token"


# ---------------------------------------------------------------------- bad input
LONG_ID = "x" * 129
BAD_INPUTS = [
    # (id, event, status, field)
    ("missing-event-type",
     api_event("POST", "/events", {"connection_id": "c1", "ws_url": URL}), 422, "event_type"),
    ("missing-connection-id",
     api_event("POST", "/events", {"event_type": "START", "ws_url": URL}), 422, "connection_id"),
    ("missing-ws-url-for-start",
     api_event("POST", "/events", {"event_type": "START", "connection_id": "c1"}), 422, "ws_url"),
    ("extra-field",
     api_event("POST", "/events", {"event_type": "STOP", "connection_id": "c1", "x": 1}),
     422, "x"),
    ("unknown-event-type",
     api_event("POST", "/events", {"event_type": "PAUSE", "connection_id": "c1"}),
     422, "event_type"),
    ("connection-id-too-long",
     api_event("POST", "/events", {"event_type": "STOP", "connection_id": LONG_ID}),
     422, "connection_id"),
    ("connection-id-empty",
     api_event("POST", "/events", {"event_type": "STOP", "connection_id": ""}),
     422, "connection_id"),
    ("connection-id-bad-characters",
     api_event("POST", "/events", {"event_type": "STOP", "connection_id": "a/b c"}),
     422, "connection_id"),
    ("connection-id-not-a-string",
     api_event("POST", "/events", {"event_type": "STOP", "connection_id": 12}),
     422, "connection_id"),
    ("path-id-too-long", api_event("GET", f"/connections/{LONG_ID}"), 422, "connection_id"),
    ("path-id-bad-characters", api_event("DELETE", "/connections/a$b"), 422, "connection_id"),
    ("body-too-large",
     api_event("POST", "/events", raw_body=json.dumps(
         {"event_type": "START", "connection_id": "c1", "ws_url": URL + "&p=" + "x" * 17_000})),
     413, "body"),
    ("body-not-json", api_event("POST", "/events", raw_body="{not json"), 400, "body"),
    ("body-not-an-object", api_event("POST", "/events", ["START", "c1"]), 422, "body"),
    ("body-missing", api_event("PUT", "/connections/c1"), 422, "body"),
    ("content-type-not-json",
     api_event("POST", "/events", raw_body="event_type=START",
               headers={"Content-Type": "application/x-www-form-urlencoded"}),
     415, "Content-Type"),
    ("ws-url-not-wss",
     api_event("PUT", "/connections/c1", {"ws_url": "https://stream.example.com/"}),
     422, "ws_url"),
    ("ws-url-not-allowed-host",
     api_event("PUT", "/connections/c1", {"ws_url": "wss://evil.test/feed"}), 422, "ws_url"),
    ("ws-url-private-address",
     api_event("PUT", "/connections/c1", {"ws_url": "wss://10.0.0.8/feed"}), 422, "ws_url"),
    ("ws-url-credentials",
     api_event("PUT", "/connections/c1", {"ws_url": "wss://u:p@stream.example.com/"}),
     422, "ws_url"),
    ("ws-url-not-a-string",
     api_event("PUT", "/connections/c1", {"ws_url": ["wss://stream.example.com/"]}),
     422, "ws_url"),
    ("resume-not-a-bool",
     api_event("PUT", "/connections/c1", {"ws_url": URL, "resume": "yes"}), 422, "resume"),
    ("list-bad-state", api_event("GET", "/connections", query={"state": "RUNNING"}), 422, "state"),
    ("list-limit-zero", api_event("GET", "/connections", query={"limit": "0"}), 422, "limit"),
    ("list-limit-too-big", api_event("GET", "/connections", query={"limit": "101"}), 422, "limit"),
    ("list-limit-not-a-number",
     api_event("GET", "/connections", query={"limit": "ten"}), 422, "limit"),
    ("list-token-garbage",
     api_event("GET", "/connections", query={"next_token": "%%%"}), 400, "next_token"),
    ("unknown-route", api_event("GET", "/nowhere"), 404, None),
    # Issue #11 finding 6: each of these answered 500 (or raised out of the handler) before.
    ("body-deeply-nested", api_event("POST", "/events", raw_body="[" * 5000), 400, "body"),
    ("body-deeply-nested-valid-json",
     api_event("PUT", "/connections/c1", raw_body="[" * 2000 + "]" * 2000), 400, "body"),
    ("body-base64-not-utf8",
     base64_body(api_event("PUT", "/connections/c1"), b'{"ws_url": "\xff\xfe"}'), 400, "body"),
    ("body-unpaired-surrogate-text",
     api_event("PUT", "/connections/c1", raw_body='{"ws_url": "wss://a\ud800.example.com/"}'),
     400, "body"),
    ("body-unpaired-surrogate-escape",
     api_event("PUT", "/connections/c1", raw_body='{"ws_url": "wss://a\\ud800.example.com/"}'),
     400, "body"),
    ("body-base64-invalid",
     {**api_event("PUT", "/connections/c1"), "body": "not base64!", "isBase64Encoded": True},
     400, "body"),
    ("body-nan",
     api_event("PUT", "/connections/c1", raw_body='{"ws_url": "' + URL + '", "resume": NaN}'),
     400, "body"),
    ("body-number-beyond-dynamodb",
     api_event("PUT", "/connections/c1", raw_body='{"ws_url": "' + URL + '", "resume": 1e400}'),
     400, "body"),
    ("resume-huge-integer",
     api_event("PUT", "/connections/c1", {"ws_url": URL, "resume": 10**30}), 422, "resume"),
    ("content-type-charset-not-utf8",
     api_event("PUT", "/connections/c1", {"ws_url": URL},
               headers={"Content-Type": "application/json; charset=latin-1"}),
     415, "Content-Type"),
    ("list-token-deeply-nested",
     api_event("GET", "/connections", query={"next_token": token_of("[" * 3000)}),
     400, "next_token"),
    ("list-token-number-beyond-dynamodb",
     api_event("GET", "/connections", query={"next_token": token_of(
         '{"state": "STARTED", "shard": ' + str(10**40) + ', "key": null}')}),
     400, "next_token"),
    ("path-id-unicode", api_event("GET", "/connections/caf\u00e9"), 422, "connection_id"),
    ("path-id-very-long", api_event("DELETE", "/connections/" + "x" * 10_000), 422,
     "connection_id"),
]


@pytest.mark.parametrize(
    ("event", "status", "field"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_is_a_4xx_naming_the_field(router, aws, event, status, field):
    reply = invoke(router, event)

    assert reply.status == status, reply.body
    assert reply.body["field"] == field
    assert reply.body["message"]
    if field:
        assert field in reply.body["message"]
    assert all_items(aws) == []  # refused before anything was written


def test_store_failure_is_a_503_without_details(router, monkeypatch, caplog):
    monkeypatch.setenv("CONNECTIONS_TABLE", "no-such-table")
    router.reset_dependencies()

    reply = start(router, "c1")

    assert reply.status == 503
    assert reply.body["message"] == "the connection store is unavailable; retry"
    assert "no-such-table" not in json.dumps(reply.body)
    logged = [r for r in caplog.records if r.getMessage() == "connection store unavailable"]
    assert logged and logged[0].exc_info is not None  # logged with the cause


# ---------------------------------------------------------------------- upstream options
SECRET_PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/upstream/"


def test_start_stores_upstream_options_and_shows_them_masked(router, store, monkeypatch):
    monkeypatch.setenv("UPSTREAM_SECRET_PREFIXES", SECRET_PREFIX)
    router.reset_dependencies()
    upstream = {
        "headers": {"X-Client": "acme-7"},
        "subprotocols": ["feed.v2"],
        "credential": {"ref": SECRET_PREFIX + "feed-AbCdEf", "header": "Authorization",
                       "format": "Bearer {{secret}}"},
        "subscribe": {"op": "subscribe", "from": "{{from_seq}}"},
        "seq_pointer": "/meta/seq",
        "resume": "subscribe",
    }
    reply = invoke(
        router, api_event("PUT", "/connections/c1", {"ws_url": URL, "upstream": upstream})
    )
    assert reply.status == 201
    assert reply.body["upstream"]["headers"] == {"X-Client": "***"}
    assert reply.body["upstream"]["subscribe"] == upstream["subscribe"]
    assert reply.body["upstream"]["credential"]["ref"] == SECRET_PREFIX + "feed-AbCdEf"
    assert reply.body["gaps"] == {"resumes": 0, "frames": 0}
    stored = store.get(connection_pk("c1"))
    assert stored is not None and stored.upstream.seq_pointer == "/meta/seq"
    assert stored.upstream.headers == (("X-Client", "acme-7"),)


@pytest.mark.parametrize(
    ("upstream", "field"),
    [
        ({"headers": {"Authorization": "Bearer tok-3141592"}}, "upstream.headers"),
        ({"resume": "subscribe"}, "upstream.resume"),
        ({"credential": {"ref": SECRET_PREFIX + "x", "header": "Authorization"}},
         "upstream.credential"),  # no UPSTREAM_SECRET_PREFIXES in this deployment
        ("not an object", "upstream"),
    ],
)
def test_bad_upstream_options_are_a_422_naming_the_field(router, aws, upstream, field):
    reply = invoke(router, api_event("POST", "/events", {
        "event_type": "START", "connection_id": "c1", "ws_url": URL, "upstream": upstream,
    }))
    assert reply.status == 422
    assert field in [error["field"] for error in reply.body.get("errors", [reply.body])]
    assert "tok-3141592" not in json.dumps(reply.body)  # a refused value is never echoed
    assert all_items(aws) == []


def test_stop_with_upstream_options_is_refused(router):
    reply = invoke(router, api_event("POST", "/events", {
        "event_type": "STOP", "connection_id": "c1", "upstream": {},
    }))
    assert reply.status == 422


def test_the_subscribe_limit_is_reachable_under_the_body_cap(router, aws):
    # GIVEN subscribe messages at the limit and one byte above it, in START bodies that stay
    # under the router's body cap either way
    from wsfleet.upstream_options import MAX_SUBSCRIBE_BYTES

    def start_with(cid: str, subscribe: str) -> tuple[Reply, int]:
        body = {"ws_url": URL, "upstream": {"subscribe": subscribe}}
        event = api_event("PUT", f"/connections/{cid}", body)
        return invoke(router, event), len(event["body"].encode())

    at_limit, _ = start_with("c1", "x" * MAX_SUBSCRIBE_BYTES)
    above, size_above = start_with("c2", "x" * (MAX_SUBSCRIBE_BYTES + 1))
    assert size_above < router.MAX_BODY_BYTES
    # THEN the first is stored and the second is this field's 422, not the body's 413
    assert at_limit.status == 201, at_limit.body
    assert above.status == 422
    assert above.body["field"] == "upstream.subscribe"
    assert str(MAX_SUBSCRIBE_BYTES) in above.body["message"]
    assert len(all_items(aws)) == 1
