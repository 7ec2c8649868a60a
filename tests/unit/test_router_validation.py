"""Router pieces that need no backend: page tokens, the body gate and error mapping (the
connection views are wsfleet.views, tested in tests/unit/test_views.py).

Routes that must fail before any I/O run here against stub dependencies whose store and hint
sender raise if touched; everything that reaches DynamoDB is in
tests/integration/test_router.py.
"""

from __future__ import annotations

import base64
import copy
import json
from decimal import Decimal
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from wsfleet.exceptions import ConnectionNotFound, StoreError
from wsfleet.record import ConnectionRecord, DesiredState
from wsfleet.settings import Settings
from wsfleet.store import StartResult
from wsfleet_local.handler_loader import lambda_context, load_function

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning")

router = load_function("router")
EVENTS = Path(__file__).resolve().parents[2] / "events"
NOW = 1_000_000
URL = "wss://stream.example.com/feed?token=abc"


def record(**changes: Any) -> ConnectionRecord:
    return ConnectionRecord.new("c1", URL, NOW - 10).with_changes(**changes)


# ---------------------------------------------------------------------- page tokens
#: What DynamoDBLeaseStore.list_connections returns as next_key: the gsi_state shard it
#: stopped in and that shard's LastEvaluatedKey (None: start the shard from its beginning).
KEY = {"pk": "CONN#c1", "state_shard": "STARTED#03"}
NEXT = {"shard": 3, "key": KEY}


def token_of(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def payload(**changes: Any) -> dict[str, Any]:
    return {"state": "STARTED", "shard": 3, "key": KEY, **changes}


class TestPageToken:
    @pytest.mark.parametrize("next_key", [NEXT, {"shard": 15, "key": None}], ids=["key", "shard"])
    def test_round_trip(self, next_key):
        token = router.encode_next_token(next_key, DesiredState.STARTED)
        assert "=" not in token
        assert router.decode_next_token(token, DesiredState.STARTED) == next_key

    def test_fractional_numbers_cannot_be_encoded(self):
        with pytest.raises(TypeError):
            router.encode_next_token({"shard": Decimal("1.5"), "key": None}, DesiredState.STARTED)

    @pytest.mark.parametrize(
        "token",
        [
            "%%%",
            "a" * 5000,
            token_of(["CONN#c1"]),
            token_of({"pk": "CONN#c1"}),
            # v1 tokens (gsi_desired_state_lease keys) are not v2 tokens
            token_of({"pk": "CONN#c1", "desired_state": "STARTED", "lease_expires_at_ms": 0}),
            token_of({**payload(), "extra": 1}),
            token_of({"shard": 3, "key": KEY}),
            token_of(payload(state="RUNNING")),
            token_of(payload(state=None)),
            token_of(payload(shard=16)),
            token_of(payload(shard=-1)),
            token_of(payload(shard="3")),
            token_of(payload(shard=True)),
            token_of(payload(shard=3.0)),
            token_of(payload(key=["CONN#c1"])),
            token_of(payload(key={"pk": "CONN#c1"})),
            token_of(payload(key={**KEY, "extra": 1})),
            token_of(payload(key={**KEY, "pk": "WORKER#w1"})),
            token_of(payload(key={**KEY, "pk": "CONN#a b"})),
            token_of(payload(key={**KEY, "pk": 7})),
            token_of(payload(key={**KEY, "state_shard": "STARTED#04"})),  # not its shard
            token_of(payload(key={**KEY, "state_shard": "STOPPED#03"})),  # not its state
            token_of(payload(key={**KEY, "state_shard": 3})),
            base64.urlsafe_b64encode(b"\xff\xfe").decode(),
            # Issue #11 finding 6: these reached json.loads / boto3 and answered 500.
            base64.urlsafe_b64encode(b"[" * 3000).decode(),
            token_of(payload(shard=10**40)),
            token_of(payload(shard=float("nan"))),
        ],
    )
    def test_malformed_tokens_are_a_400_on_next_token(self, token):
        with pytest.raises(router.ApiError) as caught:
            router.decode_next_token(token, DesiredState.STARTED)
        assert caught.value.status is HTTPStatus.BAD_REQUEST
        assert caught.value.field == "next_token"
        assert caught.value.message == "next_token is malformed"

    @pytest.mark.parametrize("next_key", [NEXT, {"shard": 0, "key": None}], ids=["key", "shard"])
    def test_token_of_another_state_is_refused(self, next_key):
        token = router.encode_next_token(next_key, DesiredState.STARTED)
        with pytest.raises(router.ApiError) as caught:
            router.decode_next_token(token, DesiredState.STOPPED)
        assert "another state" in caught.value.message


# ---------------------------------------------------------------------- body reader
def read(body: str | None, *, content_type: str | None = "application/json", b64: bool = False):
    """The event :func:`read_request` hands to Powertools, or the ApiError it refused with."""
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        return router.read_request({"body": body, "headers": headers, "isBase64Encoded": b64})
    except router.ApiError as refused:
        return refused


def json_of_size(size: int) -> str:
    """A JSON string literal exactly ``size`` bytes long."""
    return '"' + "x" * (size - 2) + '"'


class TestBodyReader:
    def test_body_of_exactly_the_limit_passes(self):
        assert read(json_of_size(router.MAX_BODY_BYTES))["body"] == json_of_size(
            router.MAX_BODY_BYTES
        )

    def test_one_byte_more_is_413(self):
        refused = read(json_of_size(router.MAX_BODY_BYTES + 1))
        assert (refused.status, refused.field) == (413, "body")

    def test_size_counts_utf8_bytes_not_characters(self):
        assert read("é" * (router.MAX_BODY_BYTES // 2 + 1)).status == 413

    def test_base64_body_is_measured_decoded(self):
        encoded = base64.b64encode(json_of_size(router.MAX_BODY_BYTES).encode()).decode()
        assert read(encoded, b64=True)["isBase64Encoded"] is False
        encoded = base64.b64encode(b"x" * (router.MAX_BODY_BYTES + 3)).decode()
        assert read(encoded, b64=True).status == 413

    @pytest.mark.parametrize(
        "content_type",
        [None, "application/json", "Application/JSON; charset=utf-8", "application/merge+json"],
    )
    def test_json_or_absent_content_type_passes_as_canonical_json(self, content_type):
        event = read('{"a": 1}', content_type=content_type)
        assert event["body"] == '{"a":1}'
        # Powertools only parses application/json; the body it gets is that now.
        assert event["headers"] == {"Content-Type": "application/json"}

    @pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
    def test_other_content_types_are_415(self, content_type):
        refused = read("event_type=START", content_type=content_type)
        assert (refused.status, refused.field) == (415, "Content-Type")

    def test_a_charset_other_than_utf8_is_415(self):
        refused = read('{"a": 1}', content_type="application/json; charset=ISO-8859-1")
        assert (refused.status, refused.field) == (415, "Content-Type")

    def test_content_type_does_not_matter_without_a_body(self):
        assert read(None, content_type="text/plain")["body"] is None
        assert router.read_request({}) == {}

    @pytest.mark.parametrize(
        ("body", "b64", "reason"),
        [
            ("[" * 5000, False, "nests deeper"),
            ("[" * 33 + "]" * 33, False, "nests deeper"),
            ("{not json", False, "not valid JSON"),
            ('{"a": NaN}', False, "NaN is not a JSON number"),
            ('{"a": -Infinity}', False, "-Infinity is not a JSON number"),
            ('{"a": 1e400}', False, "DynamoDB"),
            ('{"a": 1' + "0" * 40 + "}", False, "DynamoDB"),
            ('{"a": "\\udc00"}', False, "valid Unicode"),
            ("\ufeff{}", False, "not valid JSON"),
            ("not base64!", True, "base64"),
            (base64.b64encode(b'{"a": "\xff"}').decode(), True, "UTF-8"),
        ],
    )
    def test_unreadable_bodies_are_400_saying_why(self, body, b64, reason):
        refused = read(body, b64=b64)
        assert (refused.status, refused.field) == (400, "body")
        assert reason in refused.message

    def test_nesting_inside_strings_does_not_count(self):
        assert read('{"a": "' + "[" * 100 + '"}')["body"] == '{"a":"' + "[" * 100 + '"}'

    def test_nesting_up_to_the_bound_is_read(self):
        depth = router.MAX_JSON_DEPTH
        assert read("[" * depth + "]" * depth)["body"] == "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("loc", "field"),
    [(("body", "ws_url"), "ws_url"), (("query", "limit"), "limit"), (("body",), "body"),
     (("body", 12), "body"), (("body", "a", 0, "b"), "a.b"), ((), "body")],
)
def test_field_name_from_a_pydantic_location(loc, field):
    assert router._field_name(loc) == field


# ---------------------------------------------------------------------- error mapping
class Untouchable:
    """A dependency that must not be used: fails the test if any attribute is read."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call to {name}")


class CannedStore:
    """Returns one prepared outcome (or raises it) for the store calls the router makes."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def _answer(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    start = stop = get = list_connections = _answer


class RaisingSender:
    def send(self, hint: Any) -> bool:
        raise RuntimeError("sqs exploded")


def use(monkeypatch: pytest.MonkeyPatch, store: Any, hints: Any = None) -> None:
    settings = Settings(allowed_upstream_hosts=("example.com",), hint_queue_url="http://q")
    deps = router.Dependencies(settings=settings, store=store, hints=hints or Untouchable())
    monkeypatch.setattr(router, "dependencies", lambda: deps)


def call(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = router.lambda_handler(event, lambda_context("router"))
    return response["statusCode"], json.loads(response["body"])


def event(name: str = "api_post_events_start", **changes: Any) -> dict[str, Any]:
    sample = copy.deepcopy(json.loads((EVENTS / f"{name}.json").read_text()))
    sample.update(changes)
    return sample


def test_validation_happens_before_any_store_call(monkeypatch):
    use(monkeypatch, Untouchable())

    status, body = call(event("api_post_events_invalid"))

    assert status == 422
    assert body["field"] == "event_type"


def test_several_invalid_fields_are_all_listed(monkeypatch):
    use(monkeypatch, Untouchable())

    status, body = call(event(body=json.dumps({"event_type": 1, "connection_id": 2, "x": 3})))

    assert status == 422
    assert [error["field"] for error in body["errors"]] == ["event_type", "connection_id", "x"]
    assert body["field"] == "event_type"


def test_store_error_is_a_503(monkeypatch):
    use(monkeypatch, CannedStore(StoreError("get_item failed: secret detail")))

    status, body = call(event("api_get_connection"))

    assert status == 503
    assert "secret detail" not in body["message"]


def test_connection_deleted_during_a_restart_is_a_409(monkeypatch):
    use(monkeypatch, CannedStore(ConnectionNotFound("CONN#demo-1")))

    status, body = call(event())

    assert status == 409
    assert body["field"] == "connection_id"


def test_unexpected_error_is_a_json_500_without_details(monkeypatch):
    use(monkeypatch, CannedStore(RuntimeError("boom at line 3")))

    status, body = call(event("api_get_connection"))

    assert status == 500
    assert body == {"message": "internal error", "field": None,
                    "errors": [{"field": None, "message": "internal error"}]}


def test_missing_hint_queue_setting_is_a_json_500(monkeypatch):
    monkeypatch.delenv("HINT_QUEUE_URL", raising=False)
    router.reset_dependencies()
    try:
        status, body = call(event("api_get_connection"))
    finally:
        router.reset_dependencies()

    assert status == 500
    assert body["message"] == "the router is misconfigured"


def test_a_hint_sender_that_raises_does_not_fail_the_start(monkeypatch, capsys):
    use(monkeypatch, CannedStore(StartResult(record(), created=True)), RaisingSender())

    status, body = call(event())

    assert status == 201
    assert body["outcome"] == "created"
    assert '"HintSendFailed":[1.0]' in capsys.readouterr().out


@pytest.mark.parametrize(
    "ws_url", ["wss://feed.example.com./x", "wss://example.com./x", "wss://[::1]x/"]
)
def test_a_ws_url_host_in_a_second_spelling_is_a_422_before_any_store_call(monkeypatch, ws_url):
    # Issue #23: the router read "127.0.0.1." (or a listed "example.com.") as the listed host
    # and stored it; the worker's resolver then failed on it forever.
    use(monkeypatch, Untouchable())

    status, body = call(event(body=json.dumps(
        {"event_type": "START", "connection_id": "c1", "ws_url": ws_url}
    )))

    assert status == 422
    assert body["field"] == "ws_url"
    assert "must not end with a dot" in body["message"] or "malformed" in body["message"]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize(
    "connection_id", ["a#b", "a\x00b", "\U0001f600", "a\u200fb", "a\u202eb", "a b", "a%b"]
)
def test_a_path_id_outside_the_rule_is_a_422_whatever_the_character(
    monkeypatch, method, connection_id
):
    # Issue #23: '#', NUL, emoji and bidi marks fell outside Powertools' route pattern and got a
    # 404 "no route"; the contract says 422 on connection_id (README, docs/openapi.json).
    use(monkeypatch, Untouchable())
    sample = event(
        "api_get_connection",
        httpMethod=method,
        path=f"/connections/{connection_id}",
        pathParameters={"id": connection_id},
        body=json.dumps({"ws_url": URL}) if method == "PUT" else None,
    )

    status, body = call(sample)

    assert status == 422
    assert body["field"] == "connection_id"
    assert "A-Z a-z 0-9" in body["message"]


@pytest.mark.parametrize("connection_id", [".", "..", "..."])
def test_a_start_id_of_only_dots_is_a_422_on_both_routes(monkeypatch, connection_id):
    use(monkeypatch, Untouchable())
    put = event(
        "api_put_connection",
        path=f"/connections/{connection_id}",
        pathParameters={"id": connection_id},
    )
    post = event(body=json.dumps(
        {"event_type": "START", "connection_id": connection_id, "ws_url": URL}
    ))
    for sample in (put, post):
        status, body = call(sample)
        assert status == 422
        assert body["field"] == "connection_id" and "only dots" in body["message"]


@pytest.mark.parametrize("handoff", ["make-before-break", 1, None.__class__.__name__])
def test_a_bad_upstream_handoff_is_a_422_naming_the_field(monkeypatch, handoff):
    use(monkeypatch, Untouchable())
    body = {"event_type": "START", "connection_id": "c-1", "ws_url": "wss://example.com/feed",
            "upstream": {"handoff": handoff}}

    status, answer = call(event(body=json.dumps(body)))

    assert status == 422
    assert answer["field"] == "upstream.handoff"
    assert "overlap, break" in answer["message"]
