"""Shared fixtures: one embedded moto server per test session, fresh resources per test.

The server is the real thing the product runs on locally (wsfleet_local.backend), reached over
HTTP through the standard ``AWS_ENDPOINT_URL``; no in-process fakes of DynamoDB or SQS.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

# Never let a test reach a real AWS account, whatever the developer's shell has configured.
for _var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_var, None)
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "wsfleet")

_counter = itertools.count()


@pytest.fixture(scope="session")
def backend() -> Iterator[object]:
    """A running embedded backend (moto server in a child process) for the whole session."""
    from wsfleet_local.backend import EmbeddedBackend

    with EmbeddedBackend() as running:
        yield running


@pytest.fixture
def aws(backend, monkeypatch: pytest.MonkeyPatch):
    """Fresh, uniquely named tables and queues; env vars point boto3 and Settings at them."""
    prefix = f"t{next(_counter)}-{uuid.uuid4().hex[:6]}"
    resources = backend.create_resources(prefix)
    for name, value in resources.env().items():
        monkeypatch.setenv(name, value)
    return resources
