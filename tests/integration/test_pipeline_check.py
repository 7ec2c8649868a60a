"""The deploy pipeline's integration check (.github/scripts/integration-check), run against
`wsfleet local up` as the workflow runs it against the testing stack: no terminal, an id
longer than 80 columns, every answer checked by id through the API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("jq") is None, reason="the check needs jq (as on GitHub's runners)"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / ".github" / "scripts" / "integration-check"
WSFLEET = str(Path(sys.executable).with_name("wsfleet"))
# as the workflow builds it (ci-<run id>-<attempt>), padded past a listing's 80 columns
LONG_ID = "ci-1234567890-1-" + "x" * 90


@pytest.fixture(scope="module")
def local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`wsfleet local up` (no workers: the check is about the control plane) and its state."""
    tmp = tmp_path_factory.mktemp("local-up")
    run_dir = tmp / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    with open(tmp / "output.txt", "wb") as out:
        process = subprocess.Popen(
            [WSFLEET, "local", "up", "--workers", "0", "--run-dir", str(run_dir)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
    try:
        state_file = run_dir / "fleet.json"
        wait_until(
            lambda: state_file.exists() or process.poll() is not None,
            message="wsfleet local up to start",
            timeout=120,
        )
        assert process.poll() is None, (tmp / "output.txt").read_text()
        yield json.loads(state_file.read_text())
    finally:
        # Ctrl-C, as a user stops it: the fleet stops every process it started
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def check(*args: str) -> subprocess.CompletedProcess[str]:
    # no terminal: stdin closed, output captured (the pipeline's situation)
    env = {**os.environ, "WSFLEET": WSFLEET, "COLUMNS": "80"}
    return subprocess.run(
        [str(CHECK), *args], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env=env, check=False,
    )


def test_the_check_passes_for_a_long_id_without_a_terminal(local_up: dict[str, Any]) -> None:
    upstream = f"{local_up['simulator_url']}/{LONG_ID}"

    result = check(local_up["api_url"], LONG_ID, upstream)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "ok: start (STARTED)",
        "ok: get after start (STARTED)",
        "ok: stop (STOPPED)",
        "ok: get after stop (STOPPED)",
        f"integration check passed for {LONG_ID}",
    ]


def test_the_check_fails_and_names_the_step_when_an_answer_is_wrong(
    local_up: dict[str, Any],
) -> None:
    # an upstream the router refuses (the local fleet allows only its simulator's host)
    result = check(local_up["api_url"], "ci-refused-1", "wss://stream.example.com/ci")

    assert result.returncode != 0
    assert "integration check failed at start" in result.stderr
    assert "passed" not in result.stdout


def test_the_check_fails_when_the_api_is_unreachable(local_up: dict[str, Any]) -> None:
    # the API answers for another stage only: every call is a 4xx/5xx, nothing passes
    result = check(local_up["api_url"] + "-no-such-stage", "ci-nowhere-1")

    assert result.returncode != 0
    assert "ok:" not in result.stdout


def test_the_check_refuses_missing_arguments() -> None:
    result = check("http://127.0.0.1:9/dev")

    assert result.returncode == 2 and "usage:" in result.stderr
