"""`wsfleet local up --sink kinesis` end to end, and `wsfleet tail` reading the frames back:
a subprocess fleet as a user runs it, a START through its API, then the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import wait_until
from test_local_fleet import call

from wsfleet_local.backend import local_client
from wsfleet_local.simulator import SimulatorClient, frame_data

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WSFLEET = str(Path(sys.executable).with_name("wsfleet"))


def tail(run_dir: Path, connection_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WSFLEET, "tail", connection_id, "--fleet", str(run_dir), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_local_up_on_the_kinesis_sink_streams_into_the_stream_and_tail_reads_it(tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    with open(tmp_path / "output.txt", "wb") as out:
        process = subprocess.Popen(
            [WSFLEET, "local", "up", "--workers", "1", "--sink", "kinesis",
             "--run-dir", str(run_dir)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        state_file = run_dir / "fleet.json"
        wait_until(
            lambda: state_file.exists() or process.poll() is not None,
            message="wsfleet local up to start",
            timeout=120,
        )
        assert process.poll() is None, (tmp_path / "output.txt").read_text()
        state = json.loads(state_file.read_text())
        assert (state["message_sink"], state["message_stream"]) == (
            "kinesis",
            "wsfleet-local-frames",
        )
        # WHEN a connection is STARTed
        url = SimulatorClient(state["simulator_url"]).url_for("k1")
        assert call("PUT", f"{state['api_url']}/connections/k1", {"ws_url": url})[0] == 201

        # THEN `wsfleet tail` reads its frames back from the stream, in order, with their fields
        def tailed() -> list[dict]:
            return [json.loads(line) for line in tail(run_dir, "k1").stdout.splitlines()]

        frames = wait_until(
            lambda: len(f := tailed()) >= 5 and f, message="frames in the stream", timeout=90
        )
        seqs = [f["seq"] for f in frames]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
        assert all(f["data"] == frame_data("k1", f["seq"]) for f in frames)
        assert {f["connection_id"] for f in frames} == {"k1"}
        assert all(f["lease_epoch"] >= 1 and f["received_at_ms"] > 0 for f in frames)
        # AND nothing went to the messages table; -n limits the output; a bad id is an error
        tables = local_client("dynamodb", state["endpoint_url"])
        items = tables.query(
            TableName=state["messages_table"],
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": "CONN#k1"}},
        )["Items"]
        assert items == []
        assert len(tail(run_dir, "k1", "-n", "2").stdout.splitlines()) == 2
        bad = tail(run_dir, "no/such")
        assert bad.returncode != 0 and "not a connection id" in bad.stdout + bad.stderr
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
