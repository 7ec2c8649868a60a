"""Fixtures of the container checks (containers/tests/harness.py says what they need)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The samples' expected answers and set-ups are the in-process tests' (one definition of what
# the README documents): tests/integration/test_sample_events.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "integration"))

from harness import ROOT, SAM, LocalBackend, run, sam_env

for _var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_var, None)
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")


@pytest.fixture(scope="session")
def figures() -> Iterator[dict[str, Any]]:
    """What the checks measure, written to $WSFLEET_FIGURES at the end (bench/RESULTS.md)."""
    measured: dict[str, Any] = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    yield measured
    path = os.environ.get("WSFLEET_FIGURES")
    if not path:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    docker = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    measured.update(
        command="WSFLEET_FIGURES=bench/containers.json make sam-local",
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        commit=commit,
        docker_version=docker,
        load_average_at_end=[round(x, 2) for x in os.getloadavg()],
    )
    Path(path).write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def sam_build() -> None:
    """`sam build`, as the README says, into .aws-sam/build (what `sam local` then runs)."""
    run([SAM, "build"], env=sam_env(), timeout=1200)


@pytest.fixture(scope="module")
def local_backend() -> Iterator[LocalBackend]:
    backend = LocalBackend().start()
    with backend.environment():
        yield backend
    backend.stop()
