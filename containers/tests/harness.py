"""What the container checks share: the repository's paths, SAM CLI run the way the README runs
it, the embedded backend as `make local-backend` runs it, and the figures the checks measure.

Nothing here is collected by `make test` (it runs ``pytest tests``); `make sam-local`
(containers/sam-local) runs ``pytest containers/tests`` once Docker, SAM CLI and the stand-in
images are ready, and passes their locations in the environment:

``WSFLEET_SAM``           the SAM CLI executable (default: .tools-venv/sam/bin/sam)
``WSFLEET_INVOKE_IMAGE``  the Lambda runtime image for ``--invoke-image``
``WSFLEET_PYTHON_BASE``   the worker image's base (``PYTHON_BASE`` build argument)
``WSFLEET_FIGURES``       where to write the measured figures as JSON (unset: not written)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
SAM = os.environ.get("WSFLEET_SAM", str(ROOT / ".tools-venv" / "sam" / "bin" / "sam"))
INVOKE_IMAGE = os.environ.get("WSFLEET_INVOKE_IMAGE", "wsfleet-standin/lambda-python3.11")
PYTHON_BASE = os.environ.get("WSFLEET_PYTHON_BASE", "wsfleet-standin/python3.11-slim")
#: What this machine adds to the README's `sam local` lines: no registry is reachable.
INVOKE_FLAGS = ("--invoke-image", INVOKE_IMAGE, "--skip-pull-image")
#: Where env.json and samconfig.toml point the functions (README: `make local-backend`).
BACKEND_PORT = 4566
ENV_JSON = json.loads((ROOT / "env.json").read_text())

__all__ = [
    "BACKEND_PORT",
    "ENV_JSON",
    "EVENTS",
    "INVOKE_FLAGS",
    "PYTHON_BASE",
    "ROOT",
    "SAM",
    "Invocation",
    "LocalBackend",
    "run",
    "sam_env",
    "sam_invoke",
    "tail",
]


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def sam_env() -> dict[str, str]:
    """The environment SAM CLI runs in: no telemetry, the backend's dummy credentials."""
    return {
        **os.environ,
        "SAM_CLI_TELEMETRY": "0",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }


def run(
    cmd: Sequence[str], *, timeout: float = 600, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``cmd`` in the repository root; a non-zero exit fails with its output's tail."""
    proc = subprocess.run(
        list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if proc.returncode != 0:
        output = f"{tail(proc.stdout, 20)}\n{tail(proc.stderr)}"
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{output}")
    return proc


@dataclass(frozen=True)
class Invocation:
    """One `sam local invoke`: the function's answer, its log, and how long it took."""

    function: str
    event: str
    result: Any
    log: str
    wall_seconds: float
    #: The runtime emulator's REPORT line: from the invoke to the answer, in the container.
    duration_ms: float | None


_REPORT = re.compile(r"REPORT RequestId: \S+\s+Init Duration: [\d.]+ ms\s+Duration: ([\d.]+) ms")


def sam_invoke(
    function: str, event: str, *, via_make: bool = False, timeout: float = 300
) -> Invocation:
    """``sam local invoke FUNCTION -e events/EVENT.json`` as the README writes it, plus
    INVOKE_FLAGS; samconfig.toml adds env.json, the endpoint and host.docker.internal.
    ``via_make``: the README's wrapper instead, ``make invoke FUNCTION=... EVENT=...`` (which
    runs ``sam build`` first; its output comes before the answer, the last line).

    Fails with the log's tail when SAM fails or the function raised (a missing module, a
    handler that does not exist, an exception: the answer is then Lambda's error object).
    """
    cmd = [SAM, "local", "invoke", function, "-e", f"events/{event}.json", *INVOKE_FLAGS]
    if via_make:
        flags = " ".join(INVOKE_FLAGS)
        cmd = ["make", "--no-print-directory", "-s", "invoke", f"FUNCTION={function}",
               f"EVENT={event}", f"SAM={SAM}", f"SAM_LOCAL_FLAGS={flags}"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=sam_env()
    )
    wall = time.monotonic() - started
    where = f"{' '.join(cmd)} (exit {proc.returncode})"
    if proc.returncode != 0 or not proc.stdout.strip():
        raise AssertionError(f"{where}: no answer\n{tail(proc.stderr)}")
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1] if via_make else proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"{where}: the answer is not JSON: {proc.stdout[:500]!r}") from exc
    if isinstance(result, dict) and "errorType" in result:
        raise AssertionError(
            f"{where}: the function failed: {result.get('errorType')}: "
            f"{result.get('errorMessage')}\n{tail(proc.stderr)}"
        )
    report = _REPORT.search(proc.stderr)
    return Invocation(
        function, event, result, proc.stderr, wall, float(report.group(1)) if report else None
    )


class LocalBackend:
    """`make local-backend`, as the README runs it: the embedded backend with the resources
    env.json names, on port 4566 of the address the functions' containers reach."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint_url = ""
        self.env: dict[str, str] = {}
        self.resources: dict[str, Any] = {}
        #: The workers --seed-samples registered for the stream samples: control queue URLs.
        self.sample_workers: dict[str, str] = {}

    def start(self) -> LocalBackend:
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "-s", "local-backend"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError(
                f"make local-backend did not start:\n{tail(self.proc.stderr.read())}"
            )
        announced = json.loads(line)
        self.endpoint_url = announced["endpoint_url"]
        self.env = dict(announced["env"])
        self.resources = dict(announced["resources"])
        self.sample_workers = dict(announced.get("sample_workers", {}))
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> LocalBackend:
        """A fresh backend: empty tables and queues."""
        self.stop()
        return self.start()

    @contextmanager
    def environment(self) -> Iterator[None]:
        """os.environ pointed at this backend for the host side's boto3 clients."""
        saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
