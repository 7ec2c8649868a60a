"""The ``wsfleet`` CLI as an operator meets it (issue #25): ``status --table`` against a real
table (the moto server) and against broken configurations, the API key, ``--version``, the
state filter, whole ids in a pipe, one error prefix and one exit-status rule.

Every run goes through :func:`wsfleet_local.cli.main`, the console script's entry point, so
click's own usage errors are covered too.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from rich.console import Console

from wsfleet.aws import dynamodb_client
from wsfleet.record import connection_pk
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local import cli

pytestmark = [pytest.mark.integration]

LONG_ID = "meeting-" + "x" * 100 + "-end"


def wsfleet(*args: str) -> tuple[int, str, str]:
    """``wsfleet ARGS`` through the console entry point: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = cli.console, cli.err_console
    try:  # the commands print through these two module globals
        cli.console, cli.err_console = Console(file=out), Console(file=err)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        cli.console, cli.err_console = saved
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


@pytest.fixture
def no_aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No profile, config file or metadata service can answer for the caller."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)  # fmt: skip
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask 169.254.169.254


def started(aws: Any, *ids: str) -> DynamoDBLeaseStore:
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    for connection_id in ids:
        store.start(connection_id, "wss://feed.example.com/s", resume=True)
    return store


# ----------------------------------------------------------------------------- status --table


def test_status_table_in_a_pipe_shows_whole_ids(aws: Any) -> None:
    # GIVEN a connection whose id is longer than an 80-column line
    started(aws, LONG_ID)
    # WHEN the table is read with no terminal (a pipeline's `| grep "$id"`)
    code, out, err = wsfleet("status", "--table", aws.connections_table)
    # THEN the whole id is on one line
    assert code == 0, err
    assert any(LONG_ID in line for line in out.splitlines()), out


def test_status_table_endpoint_option_selects_the_backend(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the endpoint only on the command line
    started(aws, "by-endpoint")
    endpoint = aws.endpoint_url
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    # WHEN / THEN --endpoint reaches the local table
    code, out, err = wsfleet("status", "--table", aws.connections_table, "--endpoint", endpoint)
    assert code == 0, err
    assert "by-endpoint" in out


def test_status_table_without_a_region_is_one_line_exit_2(
    aws: Any, monkeypatch: pytest.MonkeyPatch, no_aws_config: None
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    code, _out, err = wsfleet("status", "--table", aws.connections_table)
    assert code == 2
    assert_one_error_line(err)
    assert "no AWS region" in err and "--region" in err


def test_status_table_without_credentials_is_one_line_exit_2(
    aws: Any, monkeypatch: pytest.MonkeyPatch, no_aws_config: None
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    code, _out, err = wsfleet("status", "--table", aws.connections_table)
    assert code == 2
    assert_one_error_line(err)
    assert "no AWS credentials" in err


def test_status_of_a_table_that_does_not_exist_is_one_line_exit_2(aws: Any) -> None:
    code, _out, err = wsfleet("status", "--table", "no-such-table")
    assert code == 2
    assert_one_error_line(err)
    assert "'no-such-table' not found" in err


def test_status_table_on_an_unreachable_endpoint_is_exit_1(aws: Any) -> None:
    # Nothing listens on port 9 of loopback: a failure, not the caller's input.
    code, _out, err = wsfleet(
        "status", "--table", aws.connections_table, "--endpoint", "http://127.0.0.1:9"
    )
    assert code == 1
    assert_one_error_line(err)


def test_status_state_filter_takes_the_apis_states(aws: Any) -> None:
    # GIVEN one STARTED and one STOPPED connection
    store = started(aws, "live-1", "gone-1")
    store.stop(connection_pk("gone-1"))
    # WHEN filtered by state (any case), THEN only that state is listed
    code, out, err = wsfleet("status", "--table", aws.connections_table, "--state", "stopped")
    assert code == 0, err
    assert "gone-1" in out and "live-1" not in out
    code, out, _ = wsfleet("status", "--table", aws.connections_table, "--all")
    assert "gone-1" in out and "live-1" in out
    # AND a state the API does not have is refused, naming the ones it has
    code, _out, err = wsfleet("status", "--table", aws.connections_table, "--state", "RUNNING")
    assert code == 2
    assert_one_error_line(err)
    assert "STARTED, STOPPED, FAILED" in err


# ----------------------------------------------------------------------------- API key, rules


class _KeyedApi(BaseHTTPRequestHandler):
    """An API Gateway with ApiAuth=API_KEY: 403 without the key, the view with it."""

    key = "k-123"
    seen: list[dict[str, str]] = []  # noqa: RUF012

    def do_GET(self) -> None:
        _KeyedApi.seen.append({k.lower(): v for k, v in self.headers.items()})
        ok = self.headers.get("x-api-key") == self.key
        view = {"connection_id": "c1", "desired_state": "STARTED", "last_seq": 3,
                "lease": {"state": "free"}}  # fmt: skip
        status, body = (200, view) if ok else (403, {"message": "Forbidden"})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def keyed_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _KeyedApi.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/prod"
    finally:
        server.shutdown()
        server.server_close()


def test_api_key_is_sent_from_the_option_or_the_environment(
    keyed_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WSFLEET_API_KEY", raising=False)
    # WHEN the key is given, THEN the API answers
    code, out, err = wsfleet("get", "c1", "--api", keyed_api, "--api-key", "k-123")
    assert code == 0, err
    assert "c1" in out
    assert _KeyedApi.seen[-1].get("x-api-key") == "k-123"
    assert "authorization" not in _KeyedApi.seen[-1]  # nothing is signed
    monkeypatch.setenv("WSFLEET_API_KEY", "k-123")
    assert wsfleet("get", "c1", "--api", keyed_api)[0] == 0
    # AND without it the 403 is the caller's to fix: exit 2, one line
    monkeypatch.delenv("WSFLEET_API_KEY")
    code, _out, err = wsfleet("get", "c1", "--api", keyed_api)
    assert code == 2
    assert_one_error_line(err)
    assert "HTTP 403" in err


def test_version_and_the_exit_rule_in_help() -> None:
    code, out, _err = wsfleet("--version")
    assert code == 0
    assert out.startswith("wsfleet ")
    code, out, _err = wsfleet("--help")
    assert code == 0
    assert "Exit status" in out and "2 fix the input" in " ".join(out.split())


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--bogus"),  # click's own usage error
        ("start", "only-an-id"),  # a missing argument
        ("get", "c1"),  # no API URL
        ("start", "c1", "wss://x.example", "--api", "http://127.0.0.1:9/dev", "-H", "bad"),
        ("get", "c1", "--api", "http://127.0.0.1:9/dev", "--output", "yaml"),
        ("status", "--endpoint", "http://127.0.0.1:9"),  # --endpoint without --table
    ],
)
def test_every_usage_error_is_one_error_line_and_exit_2(
    args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WSFLEET_API_URL", raising=False)
    code, _out, err = wsfleet(*args)
    assert code == 2, err
    assert_one_error_line(err)


def test_an_unreachable_api_is_exit_1() -> None:
    code, _out, err = wsfleet("get", "c1", "--api", "http://127.0.0.1:9/dev")
    assert code == 1
    assert_one_error_line(err)
