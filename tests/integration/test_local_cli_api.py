"""``wsfleet start`` / ``wsfleet get`` end to end: the CLI's HTTP client, the local API Gateway
(:class:`wsfleet_local.api.LocalApi`), the real router handler and the moto server.

The router runs in this process (``load_function("router")``), behind the same loopback HTTP
server ``wsfleet local up`` uses, so the CLI sees exactly what it sees from a local fleet.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from wsfleet.aws import dynamodb_client
from wsfleet.lease import Lease
from wsfleet.record import WorkerRecord, connection_pk
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.api import LocalApi
from wsfleet_local.backend import find_template, load_template
from wsfleet_local.cli import app
from wsfleet_local.handler_loader import lambda_context, load_function
from wsfleet_local.stack import read_stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/"
REF = PREFIX + "feeds/acme-token-AbCdEf"
URL = "wss://stream.example.com/v1/transcribe"
runner = CliRunner()


@pytest.fixture
def api(aws: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The local API's URL, in front of the router with a secret prefix configured."""
    monkeypatch.setenv("UPSTREAM_SECRET_PREFIXES", PREFIX)
    monkeypatch.setenv("ALLOWED_UPSTREAM_HOSTS", "")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "wsfleet-router")
    monkeypatch.delenv("WSFLEET_API_URL", raising=False)
    router = load_function("router")
    router.reset_dependencies()
    routes = read_stack(load_template(find_template())).function("router").routes

    def invoke(event: dict[str, Any]) -> Any:
        return router.lambda_handler(event, lambda_context("router"))

    with LocalApi(invoke, routes=routes) as local:
        yield local.url
    router.reset_dependencies()


def wsfleet(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def document(output: str) -> Any:
    """The CLI's JSON document. The in-process router also prints its log and metric lines
    (one-line JSON) to the same stdout; the CLI's document is the indented one."""
    lines = output.splitlines()
    return json.loads("\n".join(lines[lines.index("{"):]))


def test_start_with_a_secret_by_reference_then_get_shows_it_and_the_gaps(
    api: str, aws: Any
) -> None:
    # WHEN a header-authenticated upstream is STARTed with the CLI's options
    code, output = wsfleet(
        "start", "t1", URL, "--api", api, "-H", "X-Client: acme-7", "--subprotocol", "v1",
        "--secret-ref", REF, "--secret-in", "header:Authorization",
        "--secret-format", "Bearer {{secret}}", "--json",
    )
    # THEN the router stored it: the reference, header values masked in the answer
    assert code == 0, output
    view = document(output)
    assert view["outcome"] == "created"
    assert view["upstream"] == {
        "headers": {"X-Client": "***"},
        "subprotocols": ["v1"],
        "credential": {"ref": REF, "header": "Authorization", "format": "Bearer {{secret}}"},
    }
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    assert store.get(connection_pk("t1")).upstream.headers == (("X-Client", "acme-7"),)

    # AND `wsfleet get` shows the options and "no gaps"
    code, output = wsfleet("get", "t1", "--api", api)
    assert code == 0, output
    assert "upstream" in output and REF in output and "acme-7" not in output
    assert "gaps      none" in output

    # WHEN its holder reports resume gaps (an upstream that could not replay)
    worker = WorkerRecord(
        worker_id="w1", control_queue_url="", started_at_ms=0, heartbeat_at_ms=0,
        expires_at_ms=2**53,
    )
    store.register_worker(worker)
    lease = Lease.of(store.acquire(connection_pk("t1"), "w1"))
    store.note_gap(lease, resumes=2, frames=37)
    # THEN `get` reports them, in text and in JSON
    code, output = wsfleet("get", "t1", "--api", api)
    assert code == 0 and "37 frame(s) never received across 2 resume(s)" in output
    code, output = wsfleet("get", "t1", "--api", api, "-o", "json")
    assert document(output)["gaps"] == {"resumes": 2, "frames": 37}


def test_subscribe_and_live_only_shapes(api: str) -> None:
    code, output = wsfleet(
        "start", "t2", URL, "--api", api, "--json", "--subscribe",
        '{"op": "subscribe", "channel": "trades", "from": "{{from_seq}}"}',
        "--resume", "subscribe", "--seq-pointer", "/data/seq",
    )
    assert code == 0, output
    assert document(output)["upstream"] == {
        "subscribe": {"op": "subscribe", "channel": "trades", "from": "{{from_seq}}"},
        "seq_pointer": "/data/seq",
        "resume": "subscribe",
    }
    code, output = wsfleet("start", "t3", URL, "--api", api, "--resume", "none")
    assert code == 0 and "t3  created" in output


def test_what_only_the_deployment_can_refuse_is_exit_2_naming_the_field(
    api: str, aws: Any
) -> None:
    # GIVEN a well-formed reference outside this deployment's UPSTREAM_SECRET_PREFIXES
    other = "arn:aws:secretsmanager:us-east-1:123456789012:secret:other/x-AbCdEf"
    code, output = wsfleet(
        "start", "t4", URL, "--api", api, "--secret-ref", other, "--secret-in", "query:key"
    )
    # THEN the router's 422 is the CLI's exit status 2, with its field and message
    assert code == 2
    assert "HTTP 422" in output and "outside the secrets" in " ".join(output.split())
    assert "Traceback" not in output
    assert dynamodb_client().scan(TableName=aws.connections_table)["Items"] == []


def test_get_of_an_unknown_connection_is_exit_2(api: str) -> None:
    # One rule (wsfleet_local.cli.EXIT_CODES): a 4xx answer, not found included, is the
    # caller's to fix, like an unknown table for `status --table`.
    code, output = wsfleet("get", "nope", "--api", api)
    assert code == 2 and "HTTP 404" in output


def raw_request(api: str, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    """One request with ``path`` sent byte for byte (http.client normalises nothing)."""
    parts = urllib.parse.urlsplit(api)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body else {}
        connection.request(method, parts.path + path, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


#: '#', NUL, an emoji, bidi marks (RLM, RLO) and a byte that is not UTF-8, percent-encoded.
BAD_PATH_IDS = ["a%23b", "a%00b", "%F0%9F%98%80", "a%E2%80%8Fb", "a%E2%80%AEb", "%FF"]


def test_an_id_outside_the_rule_is_a_422_on_connection_id_not_a_404(api: str, aws: Any) -> None:
    # Issue #23: Powertools' route pattern matches no '#', NUL, emoji or bidi mark, so these
    # were "no route" 404s, where the contract (README, docs/openapi.json) says 422.
    answers = {}
    for encoded in BAD_PATH_IDS:
        for method in ("GET", "PUT", "DELETE"):
            body = json.dumps({"ws_url": URL}).encode() if method == "PUT" else b""
            answers[method, encoded] = raw_request(api, method, f"/connections/{encoded}", body)
    wrong = {key: answer for key, answer in answers.items() if answer[0] != 422}
    assert wrong == {}
    for _, answer in answers.values():
        assert answer["field"] == "connection_id"
        assert "A-Z a-z 0-9" in answer["message"]
    assert dynamodb_client().scan(TableName=aws.connections_table)["Items"] == []


def test_an_id_of_only_dots_is_refused_at_start(api: str, aws: Any) -> None:
    start_body = json.dumps({"ws_url": URL}).encode()
    for dots in (".", "..", "..."):
        # GIVEN a client that keeps dot segments (curl would turn /connections/.. into /)
        status, answer = raw_request(api, "PUT", f"/connections/{dots}", start_body)
        assert status == 422 and answer["field"] == "connection_id", (dots, answer)
        assert "only dots" in answer["message"]
        # AND the body route gives the same answer (its id is out of any client's reach)
        start = {"event_type": "START", "connection_id": dots, "ws_url": URL}
        status, answer = raw_request(api, "POST", "/events", json.dumps(start).encode())
        assert status == 422 and answer["field"] == "connection_id", (dots, answer)
        assert "only dots" in answer["message"]
        # AND the CLI says so with exit status 2
        code, output = wsfleet("start", dots, URL, "--api", api)
        assert code == 2 and "only dots" in output, output
    assert dynamodb_client().scan(TableName=aws.connections_table)["Items"] == []
    # AND ids with dots among other characters still start
    assert raw_request(api, "PUT", "/connections/a..b", start_body)[0] == 201
