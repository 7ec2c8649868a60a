"""`wsfleet local up` as a user runs it: a subprocess driven over its HTTP API, then Ctrl-C.

The fleet is started once for the module (it takes a few seconds); the last test interrupts
it and checks that no process and no listening port survives.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import pytest
from fleet_helpers import wait_until

from wsfleet_local.procs import pid_alive
from wsfleet_local.simulator import SimulatorClient, frame_data

pytestmark = pytest.mark.integration

WSFLEET = str(Path(sys.executable).with_name("wsfleet"))


def call(method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class LocalUp:
    def __init__(self, tmp: Path) -> None:
        self.run_dir = tmp / "run"
        self.output = tmp / "output.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                [WSFLEET, "local", "up", "--workers", "2", "--run-dir", str(self.run_dir)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        state_file = self.run_dir / "fleet.json"
        wait_until(
            lambda: state_file.exists() or self.process.poll() is not None,
            message="wsfleet local up to start",
            timeout=120,
        )
        assert self.process.poll() is None, self.output.read_text()
        self.state = json.loads(state_file.read_text())
        self.api = self.state["api_url"]
        self.simulator = SimulatorClient(self.state["simulator_url"])
        self.dynamodb = boto3.client(
            "dynamodb", endpoint_url=self.state["endpoint_url"], region_name="us-east-1"
        )

    def messages(self, connection_id: str) -> list[dict]:
        page = self.dynamodb.query(
            TableName=self.state["messages_table"],
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"CONN#{connection_id}"}},
            ConsistentRead=True,
        )
        return page["Items"]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    running = LocalUp(tmp_path_factory.mktemp("local-up"))
    yield running
    running.kill()


def test_start_streams_and_stop_closes_the_upstream(fleet):
    # GIVEN a running local fleet WHEN a connection is STARTed through the API
    url = fleet.simulator.url_for("t1")
    status, view = call("PUT", f"{fleet.api}/connections/t1", {"ws_url": url})
    assert status == 201 and view["desired_state"] == "STARTED"

    # THEN a worker holds it and its frames land in the messages table
    held = wait_until(
        lambda: (
            (v := call("GET", f"{fleet.api}/connections/t1")[1])["lease"]["state"] == "held" and v
        ),
        message="a worker to hold t1",
    )
    assert held["lease"]["owner"] in {w["worker_id"] for w in fleet.state["workers"]}
    stored = wait_until(lambda: len(m := fleet.messages("t1")) >= 5 and m, message="frames stored")
    for item in stored:
        assert item["message_data"]["S"] == frame_data("t1", int(item["seq"]["N"]))

    # WHEN it is STOPped THEN the upstream session closes and the record is STOPPED and free
    status, view = call("DELETE", f"{fleet.api}/connections/t1")
    assert status == 200 and view["desired_state"] == "STOPPED"
    wait_until(
        lambda: fleet.simulator.sessions("t1") and not fleet.simulator.open_sessions("t1"),
        message="the upstream session to close",
    )
    # released (on a starved machine the owner may self-fence first and let the lease lapse)
    final = wait_until(
        lambda: (
            (v := call("GET", f"{fleet.api}/connections/t1")[1])["lease"]["state"] != "held" and v
        ),
        message="the lease to be given up",
    )
    assert final["desired_state"] == "STOPPED" and final["stop_reason"] == "stopped"
    assert final["last_seq"] >= 5


def test_cli_start_status_stop_against_the_local_api(fleet):
    url = fleet.simulator.url_for("t2")
    run = lambda *args: subprocess.run(  # noqa: E731
        [WSFLEET, *args, "--api", fleet.api], capture_output=True, text=True, timeout=60
    )
    started = run("start", "t2", url, "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["connection_id"] == "t2"
    wait_until(
        lambda: call("GET", f"{fleet.api}/connections/t2")[1]["lease"]["state"] == "held",
        message="a worker to hold t2",
    )
    status = run("status")
    assert status.returncode == 0 and "t2" in status.stdout and "held" in status.stdout
    again = run("start", "t2", url)  # the default: one line for people
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[:3] == ["t2", "already_started", "desired=STARTED"]
    stopped = run("stop", "t2", "--output", "json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["desired_state"] == "STOPPED"
    missing = run("stop", "nope")  # a 4xx: the caller's to fix (wsfleet_local.cli.EXIT_CODES)
    assert missing.returncode == 2 and "404" in missing.stderr


def test_a_secret_by_reference_reaches_the_upstream_on_the_local_fleet(fleet):
    # GIVEN a secret under the local fleet's prefix (wsfleet/ in the embedded Secrets Manager)
    # and an upstream that refuses the handshake without it
    secrets = boto3.client(
        "secretsmanager", endpoint_url=fleet.state["endpoint_url"], region_name="us-east-1"
    )
    arn = secrets.create_secret(Name="wsfleet/local-key", SecretString="local-tok-42")["ARN"]
    fleet.simulator.set_shape("t4", "header_auth", header="X-Api-Key", value="local-tok-42")

    # WHEN a START names it by reference
    status, view = call(
        "PUT",
        f"{fleet.api}/connections/t4",
        {
            "ws_url": fleet.simulator.url_for("t4"),
            "upstream": {"credential": {"ref": arn, "header": "X-Api-Key"}},
        },
    )

    # THEN the router accepts it, the upstream gets the value and frames flow; the API shows
    # only the reference
    assert status == 201, view
    wait_until(lambda: len(fleet.messages("t4")) >= 3, message="frames from the keyed upstream")
    sent = [s.headers.get("X-Api-Key") for s in fleet.simulator.sessions("t4")]
    assert "local-tok-42" in sent
    status, view = call("GET", f"{fleet.api}/connections/t4")
    assert view["upstream"]["credential"]["ref"] == arn
    assert "local-tok-42" not in json.dumps(view)
    call("DELETE", f"{fleet.api}/connections/t4")


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignores TIME_WAIT only
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
    return True


def test_ctrl_c_leaves_no_process_and_no_port_behind(fleet):
    # GIVEN every process and port the fleet recorded (read now: workers may have restarted)
    state = json.loads((fleet.run_dir / "fleet.json").read_text())
    pids, ports = state["child_pids"], state["ports"]
    assert len(pids) >= 6 and len(ports) == 3  # backend, simulator, 3 Lambdas, 2 workers
    assert all(pid_alive(pid) for pid in pids)

    # WHEN the user presses Ctrl-C
    fleet.process.send_signal(signal.SIGINT)
    code = fleet.process.wait(timeout=90)

    # THEN it exits cleanly, every child is gone and every port is free
    output = fleet.output.read_text()
    assert code == 0, output
    assert "stopped; nothing left running" in output
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert [port for port in ports if not port_is_free(port)] == []
    # the workers drained (SIGTERM) and exited on their own, they were not killed
    supervisor_log = (fleet.run_dir / "fleet.log").read_text()
    for worker in state["workers"]:
        assert f"worker {worker['worker_id']} exited with 0" in supervisor_log
