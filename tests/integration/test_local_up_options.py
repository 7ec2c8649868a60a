"""``wsfleet local up``'s operator options (issue #25): the exports it prints are enough for
``wsfleet status --table``, ``--allow-host`` admits README's "Real upstreams" hosts, and
``--no-task-events`` runs no task exit function (crashes then wait out the lease).

No worker runs (``--workers 0``), so nothing ever connects to the admitted hosts.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fleet_helpers import wait_until

pytestmark = pytest.mark.integration

WSFLEET = str(Path(sys.executable).with_name("wsfleet"))
READY_LINE = "Ctrl-C drains the workers"


def put(url: str, body: dict) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="PUT",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def exported(output: str) -> dict[str, str]:
    """Every ``export NAME=value ...`` line's assignments."""
    values: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                values[name] = value
    return values


@pytest.fixture(scope="module")
def local_up(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("local-up-options")
    run_dir, output = tmp / "run", tmp / "output.txt"
    # No AWS setting of the caller's leaks in: what status needs must come from the exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(output, "wb") as out:
        process = subprocess.Popen(
            [WSFLEET, "local", "up", "--workers", "0", "--run-dir", str(run_dir),
             "--no-task-events", "--allow-host", "example.com"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        wait_until(
            lambda: READY_LINE in output.read_text() or process.poll() is not None,
            message="wsfleet local up to print its commands", timeout=120,
        )  # fmt: skip
        assert process.poll() is None, output.read_text()
        yield run_dir, output.read_text(), env
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_the_printed_exports_are_enough_for_status_table(local_up) -> None:
    run_dir, output, env = local_up
    exports = exported(output)
    for name in ("WSFLEET_API_URL", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert exports.get(name), (name, output)  # fmt: skip
    table = json.loads((run_dir / "fleet.json").read_text())["connections_table"]
    assert f"wsfleet status --table {table}" in output
    assert put(exports["WSFLEET_API_URL"] + "/connections/seen-1",
               {"ws_url": "wss://feed.example.com/v1"}) == 201  # fmt: skip
    status = subprocess.run([WSFLEET, "status", "--table", table], capture_output=True,
                            text=True, timeout=60, env={**env, **exports})  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert "seen-1" in status.stdout


def test_allow_host_admits_those_hosts_only(local_up) -> None:
    _run_dir, output, _env = local_up
    api = exported(output)["WSFLEET_API_URL"]
    # README's Real upstreams hosts (wss://*.example.com) are accepted...
    live_only = {"ws_url": "wss://ticker.example.com/live", "upstream": {"resume": "none"}}
    assert put(f"{api}/connections/ticker-1", live_only) == 201
    # ...and a host outside the list still is not
    assert put(f"{api}/connections/other-1", {"ws_url": "wss://feed.example.org/v1"}) == 422


def test_no_task_events_runs_no_task_exit_function(local_up) -> None:
    run_dir, _output, _env = local_up
    assert list(run_dir.glob("lambda-reconciler*"))
    assert not list(run_dir.glob("lambda-task_exit*"))
