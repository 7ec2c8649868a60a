"""Property: whatever a client sends, the router answers below 500 with the documented error shape.

Hypothesis generates API Gateway REST proxy events for the five routes (and a few that do not
exist): hostile bodies (deep nesting, NaN, numbers beyond DynamoDB's range, unpaired
surrogates, base64 that is invalid or not UTF-8), odd content types and charsets, duplicate and
huge query parameters, forged page tokens, long and non-ASCII ids, unknown methods. The handler
runs against the embedded moto server (the ``aws`` fixture), so every request that gets past
validation really reaches DynamoDB and SQS; the store is up throughout, so 503 is a failure
here too.

Bounded and deterministic for CI: ``derandomize=True`` (the same examples every run), no
example database, a fixed example budget per route family.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from lambda_helpers import fresh_function

from wsfleet_local.handler_loader import lambda_context

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

SAMPLE = json.loads(
    (Path(__file__).resolve().parents[2] / "events" / "api_post_events_start.json").read_text()
)
URL = "wss://stream.example.com/v1/trades?symbol=BTC-USD"
ERROR_KEYS = {"message", "field", "errors"}
# Accepted upstream URLs and ones that trip URL parsing (ports, brackets, IDNA, IP forms).
WS_URLS = [
    URL,
    URL + "&token=x",
    "wss://feed.example.com/",
    "wss://stream.example.com./",
    "wss://[::1/",
    "wss://stream.example.com:99999/",
    "wss://stream.example.com:-1/",
    "wss://\u2603.example.com/",
    "wss://xn--.example.com/",
    "wss://0x7f.1/",
    "wss://[::ffff:127.0.0.1]/",
    "wss://" + "a." * 200 + "example.com/",
]

FUZZ = settings(
    max_examples=200,
    deadline=None,  # each example makes real HTTP calls to the moto server; timing varies
    derandomize=True,
    database=None,
    # The router fixture (fresh tables and queue) is deliberately shared by all examples of one
    # test: the property must hold whatever earlier examples wrote.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@pytest.fixture
def router(aws, monkeypatch: pytest.MonkeyPatch):
    """The router module with fresh dependencies pointed at this test's resources."""
    yield from fresh_function(
        "router",
        monkeypatch,
        ALLOWED_UPSTREAM_HOSTS="example.com",
        POWERTOOLS_SERVICE_NAME="wsfleet-router",
    )


# ---------------------------------------------------------------------- strategies
# Any str, including unpaired surrogates (API Gateway would not send them; a test event may).
any_text = st.text(max_size=40)
valid_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,20}", fullmatch=True)
ids = st.one_of(
    valid_ids,
    any_text,
    st.integers(min_value=120, max_value=10_000).map(lambda n: "x" * n),
    st.sampled_from(["café", "a b", "%2F", "..", "a/b", "\u202e", "\U0001f600"]),
)
# Numbers at and beyond DynamoDB's range (38 digits, exponent -130..125); integers too long for
# Python's int parsing are in raw_bodies (hypothesis cannot repr them).
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=10**37, max_value=10**45),
    st.integers(min_value=-(10**45), max_value=-(10**37)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-131, 1e126, 5e-324, 1.7976931348623157e308]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, any_text, st.sampled_from([URL, "START", "STOP"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)
    ),
    max_leaves=12,
)
# Objects with the API's field names, each value of any type.
field_objects = st.dictionaries(
    st.sampled_from(["event_type", "connection_id", "ws_url", "resume", "extra"]),
    st.one_of(json_values, ids, st.sampled_from(["start", "stop", URL, "wss://10.0.0.1/"])),
    max_size=5,
)
documents = st.one_of(field_objects, json_values)


def _dumps(value: Any) -> str:
    # allow_nan: NaN and Infinity literals are part of what an attacker sends.
    return json.dumps(value, allow_nan=True)


nested_bodies = st.builds(
    lambda opener, depth, closed: opener * depth + (
        {"[": "]", "{": "}"}[opener] * depth if closed else ""
    ),
    st.sampled_from(["[", "{"]),
    # Python's parser recurses about 1000 levels deep; the router allows 32.
    st.one_of(st.sampled_from([32, 33, 1001, 3000]), st.integers(min_value=20, max_value=6000)),
    st.booleans(),
)
text_bodies = st.one_of(
    documents.map(_dumps),
    nested_bodies,
    any_text,
    st.sampled_from(
        [
            '{"a": NaN}',
            '{"a": -Infinity}',
            "\ufeff{}",
            '"\\ud800"',
            "[1,]",
            "{",
            '{"resume": 1' + "0" * 5000 + "}",
            '{"resume": 1e99999}',
            '{"resume": 1e-99999}',
        ]
    ),
)
# (body, isBase64Encoded)
bodies = st.one_of(
    st.just((None, False)),
    st.just(("", False)),
    text_bodies.map(lambda body: (body, False)),
    st.binary(max_size=64).map(lambda data: (base64.b64encode(data).decode(), True)),
    text_bodies.map(
        lambda body: (base64.b64encode(body.encode("utf-8", "surrogatepass")).decode(), True)
    ),
    any_text.map(lambda body: (body, True)),  # claims base64, is not
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=latin-1",
            "APPLICATION/JSON;charset=\"UTF-8\"",
            "application/problem+json",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            ";",
        ]
    ),
    any_text,
)

# Most requests should get past validation and reach the store, so a strategy mixes plausible
# parts (one_of draws its branches about equally) with hostile ones.
plausible_ids = st.one_of(valid_ids, valid_ids, ids)
plausible_content_types = st.one_of(st.just("application/json"), st.none(), content_types)
start_bodies = st.one_of(
    st.fixed_dictionaries(
        {"ws_url": st.one_of(st.sampled_from(WS_URLS), any_text.map("wss://".__add__))},
        optional={"resume": st.one_of(st.booleans(), json_values)},
    ),
    field_objects.map(lambda obj: {"ws_url": URL, **obj}),
).map(lambda obj: (_dumps(obj), False))
event_bodies = st.one_of(
    st.fixed_dictionaries(
        {
            "event_type": st.sampled_from(["START", "STOP", "start", "Stop"]),
            "connection_id": valid_ids,
        },
        optional={"ws_url": st.sampled_from([URL, "wss://feed.example.com/x", "ws://a/"])},
    ),
    field_objects,
).map(lambda obj: (_dumps(obj), False))


def _token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode().rstrip("=")


# Page tokens: forged ones of the right shape (shards and keys in and out of range, keys of
# other shards or states), other JSON, deep nesting, and text that is not base64 at all.
forged_keys = st.fixed_dictionaries(
    {
        # Mostly the default state's, so a forged token gets past the state check to DynamoDB.
        "state": st.sampled_from(["STARTED", "STARTED", "STOPPED", "started", ""]),
        "shard": st.one_of(st.integers(min_value=-2, max_value=18), numbers),
        "key": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "pk": st.one_of(valid_ids.map("CONN#".__add__), any_text),
                    "state_shard": st.one_of(
                        st.integers(min_value=0, max_value=17).map(lambda n: f"STARTED#{n:02d}"),
                        any_text,
                    ),
                }
            ),
        ),
    }
)
tokens = st.one_of(
    forged_keys.map(_dumps).map(_token),
    documents.map(_dumps).map(_token),
    nested_bodies.map(_token),
    any_text,
    st.integers(min_value=4000, max_value=9000).map(lambda n: "A" * n),
)
query_values = st.one_of(
    any_text,
    st.sampled_from(["STARTED", "stopped", "RUNNING", "0", "1", "100", "101", "-1", "1e3"]),
    numbers.map(str),
    tokens,
)
# name -> every value sent for it (several values: a repeated query parameter).
queries = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(st.sampled_from(["state", "limit", "next_token"]), any_text),
        st.lists(query_values, min_size=1, max_size=3),
        max_size=4,
    ),
)
# GET /connections: the parameters it reads, each sometimes repeated, plus any others.
list_queries = st.one_of(
    # Only the token hostile, so it is what gets decoded and sent to DynamoDB.
    st.fixed_dictionaries({"next_token": st.lists(tokens, min_size=1, max_size=1)}),
    st.fixed_dictionaries(
        {},
        optional={
            "state": st.lists(
                st.one_of(st.sampled_from(["STARTED", "STOPPED", "stopped"]), query_values),
                min_size=1,
                max_size=2,
            ),
            "limit": st.lists(
                st.one_of(st.integers(min_value=-5, max_value=120).map(str), query_values),
                min_size=1,
                max_size=2,
            ),
            "next_token": st.lists(tokens, min_size=1, max_size=2),
        },
    ),
    queries,
)
extra_headers = st.dictionaries(
    st.sampled_from(["Accept", "X-Forwarded-For", "Content-Encoding", "Content-Length", "Host"]),
    any_text,
    max_size=3,
)


def proxy_event(
    method: str,
    path: str,
    resource: str,
    body: tuple[str | None, bool],
    content_type: str | None,
    query: dict[str, list[str]] | None,
    headers: dict[str, str],
) -> dict[str, Any]:
    """A REST proxy event shaped like the sample events, with the generated parts put in."""
    event = copy.deepcopy(SAMPLE)
    event["headers"].pop("Content-Type")
    event["multiValueHeaders"].pop("Content-Type")
    if content_type is not None:
        headers = {**headers, "Content-Type": content_type}
    for name, value in headers.items():
        event["headers"][name] = value
        event["multiValueHeaders"][name] = [value]
    path_id = path.rsplit("/", 1)[1] if resource == "/connections/{id}" else None
    event.update(
        httpMethod=method,
        path=path,
        resource=resource,
        body=body[0],
        isBase64Encoded=body[1],
        # API Gateway's single-value map keeps the last value of a repeated parameter.
        queryStringParameters={k: v[-1] for k, v in query.items()} if query else None,
        multiValueQueryStringParameters=query or None,
        pathParameters={"id": path_id} if path_id is not None else None,
    )
    event["requestContext"].update(httpMethod=method, resourcePath=resource, path=f"/dev{path}")
    return event


def assert_answer_is_documented(router: Any, request: dict[str, Any]) -> None:
    response = router.lambda_handler(request, lambda_context("router"))
    status = response["statusCode"]
    event(f"status {status}")  # reported by --hypothesis-show-statistics
    assert status < 500, response["body"]
    assert response["multiValueHeaders"]["Content-Type"] == ["application/json"]
    body = json.loads(response["body"])
    if status >= 400:
        assert set(body) == ERROR_KEYS, body
        assert isinstance(body["message"], str) and body["message"]
        assert body["field"] is None or isinstance(body["field"], str)
        assert body["errors"] and all(
            set(error) == {"field", "message"} and isinstance(error["message"], str)
            for error in body["errors"]
        ), body


def connection_path(connection_id: str) -> str:
    return f"/connections/{connection_id}"


# ---------------------------------------------------------------------- properties
@FUZZ
@given(
    body=st.one_of(event_bodies, bodies),
    content_type=plausible_content_types,
    headers=extra_headers,
    query=queries,
)
def test_post_events_never_answers_5xx(router, body, content_type, headers, query):
    assert_answer_is_documented(
        router, proxy_event("POST", "/events", "/events", body, content_type, query, headers)
    )


@FUZZ
@given(
    connection_id=plausible_ids,
    body=st.one_of(start_bodies, bodies),
    content_type=plausible_content_types,
    headers=extra_headers,
    query=queries,
)
def test_put_connection_never_answers_5xx(
    router, connection_id, body, content_type, headers, query
):
    path = connection_path(connection_id)
    assert_answer_is_documented(
        router, proxy_event("PUT", path, "/connections/{id}", body, content_type, query, headers)
    )


@FUZZ
@given(
    method=st.sampled_from(["GET", "DELETE"]),
    connection_id=plausible_ids,
    body=st.one_of(st.just((None, False)), bodies),
    content_type=plausible_content_types,
    headers=extra_headers,
    query=queries,
)
def test_get_and_delete_connection_never_answer_5xx(
    router, method, connection_id, body, content_type, headers, query
):
    path = connection_path(connection_id)
    assert_answer_is_documented(
        router, proxy_event(method, path, "/connections/{id}", body, content_type, query, headers)
    )


@FUZZ
@given(
    query=list_queries,
    body=st.one_of(st.just((None, False)), bodies),
    content_type=plausible_content_types,
    headers=extra_headers,
)
def test_list_connections_never_answers_5xx(router, query, body, content_type, headers):
    event = proxy_event("GET", "/connections", "/connections", body, content_type, query, headers)
    assert_answer_is_documented(router, event)


@FUZZ
@given(
    method=st.one_of(
        st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"]), any_text
    ),
    path=st.one_of(
        st.sampled_from(["/events", "/connections", "/", "/connections/", "/connections/a/b"]),
        ids.map(connection_path),
        any_text.map("/".__add__),
    ),
    body=bodies,
    content_type=content_types,
    query=queries,
)
def test_any_method_and_path_never_answers_5xx(router, method, path, body, content_type, query):
    is_item = path.count("/") == 2 and path.startswith("/connections/")
    resource = "/connections/{id}" if is_item else path
    assert_answer_is_documented(
        router, proxy_event(method, path, resource, body, content_type, query, {})
    )
