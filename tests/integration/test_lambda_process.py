"""Lambda execution environments (child processes) and the local API in front of them.

The handlers here are tiny stand-ins written to a temporary functions/ directory
(``WSFLEET_FUNCTIONS_DIR``), so the Lambda process's own rules are tested in isolation: results
and errors cross the process boundary, a timeout replaces the environment, handler prints go to
the log file and never corrupt the replies, and API Gateway semantics hold over real HTTP.
"""

from __future__ import annotations

import json
import os
import textwrap
import urllib.error
import urllib.request

import pytest

from wsfleet_local.api import LocalApi
from wsfleet_local.lambda_process import FunctionError, FunctionProcess, FunctionTimeout
from wsfleet_local.stack import Route

pytestmark = pytest.mark.integration

HANDLER = textwrap.dedent(
    """
    import json, os, time

    def lambda_handler(event, context):
        print("noise on stdout that must not corrupt the reply")
        action = event.get("action")
        if action == "raise":
            raise ValueError("bad input")
        if action == "sleep":
            time.sleep(event["seconds"])
        if "httpMethod" in event:
            return {"statusCode": 200, "headers": {"Content-Type": "application/json"},
                    "body": json.dumps({"event": event, "pid": os.getpid(),
                                        "remaining": context.get_remaining_time_in_millis()})}
        return {"echo": event, "pid": os.getpid(), "env": os.environ.get("MARKER")}
    """
)


@pytest.fixture
def function(tmp_path):
    directory = tmp_path / "functions" / "echo"
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(HANDLER)
    env = {**os.environ, "WSFLEET_FUNCTIONS_DIR": str(tmp_path / "functions"), "MARKER": "m1"}
    process = FunctionProcess(
        "echo", env=env, log_path=tmp_path / "echo.log", timeout_seconds=5
    ).start()
    yield process
    process.stop()
    assert process.pid is None


def test_results_and_errors_cross_the_process_boundary(function, tmp_path):
    result = function.invoke({"a": 1})
    assert result["echo"] == {"a": 1} and result["env"] == "m1"
    assert result["pid"] == function.pid != os.getpid()
    with pytest.raises(FunctionError) as failure:
        function.invoke({"action": "raise"})
    assert (failure.value.error_type, failure.value.error_message) == ("ValueError", "bad input")
    assert function.invoke({"b": 2})["pid"] == result["pid"]  # still the same warm environment
    log = (tmp_path / "echo.log").read_text()
    assert "noise on stdout" in log and "ValueError: bad input" in log


def test_a_timeout_replaces_the_environment(function):
    first_pid = function.pid
    with pytest.raises(FunctionTimeout):
        function.invoke({"action": "sleep", "seconds": 30}, timeout_seconds=0.2)
    assert function.invoke({"c": 3})["pid"] != first_pid  # a cold start


def test_local_api_turns_requests_into_proxy_events(function):
    routes = [Route("PUT", "/connections/{id}"), Route("GET", "/connections")]
    with LocalApi(function.invoke, routes=routes, stage="dev") as api:
        request = urllib.request.Request(
            api.url + "/connections/abc?x=1",
            data=b'{"ws_url": "ws://h/s"}',
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            assert response.headers["x-amzn-RequestId"]
            payload = json.loads(response.read())
        event = payload["event"]
        assert event["resource"] == "/connections/{id}" and event["path"] == "/connections/abc"
        assert event["pathParameters"] == {"id": "abc"}
        assert event["queryStringParameters"] == {"x": "1"}
        assert json.loads(event["body"]) == {"ws_url": "ws://h/s"}
        assert event["requestContext"]["stage"] == "dev"
        assert 0 < payload["remaining"] <= 5_000
        # the stage prefix is optional locally, unknown routes are 404s
        with urllib.request.urlopen(f"http://127.0.0.1:{api.port}/connections", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(api.url + "/nowhere", timeout=10)
        assert missing.value.code == 404


def test_a_failing_handler_is_a_502_from_the_api(tmp_path):
    def invoke(event):
        raise FunctionError("router", "RuntimeError", "boom")

    with (
        LocalApi(invoke, routes=[Route("GET", "/x")]) as api,
        pytest.raises(urllib.error.HTTPError) as failure,
    ):
        urllib.request.urlopen(api.url + "/x", timeout=10)
    assert failure.value.code == 502
    assert json.loads(failure.value.read()) == {"message": "Internal server error"}
