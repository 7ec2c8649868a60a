"""pytest plugin: run DynamoDB-only integration tests against dynalite instead of moto.

Usage (bench's ``compat`` step does this)::

    python -m pytest -p bench.dynalite_plugin tests/integration/test_lease_store.py

It changes nothing in tests/conftest.py: an autouse fixture takes the ``aws`` resources the
conftest created on moto (tables and queues), creates the same tables on a session-wide
dynalite server, and sets ``AWS_ENDPOINT_URL_DYNAMODB``, which botocore prefers over
``AWS_ENDPOINT_URL`` for DynamoDB clients. SQS stays on moto. Tests that need DynamoDB Streams
(``stream_arn``) cannot run here; they are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def require_dynalite() -> None:
    """Skip the calling test when dynalite is not installed, or fail it when
    ``WSFLEET_REQUIRE_DYNALITE=1`` (CI sets it: there a skip would hide that the second
    DynamoDB never ran)."""
    from bench.dynalite import REQUIRE_ENV, available, dynalite_home, required

    if available():
        return
    reason = f"dynalite is not installed in {dynalite_home()} (make dynalite; needs node, npm)"
    if required():
        pytest.fail(f"{reason}, and {REQUIRE_ENV} is set", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def dynalite_server() -> Iterator[Any]:
    from bench.dynalite import Dynalite

    require_dynalite()
    with Dynalite() as server:
        yield server


@pytest.fixture(autouse=True)
def _dynamodb_on_dynalite(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "aws" not in request.fixturenames:
        return
    if "stream_arn" in (request.node.get_closest_marker("needs") or ()):
        pytest.skip("DynamoDB Streams are not implemented by dynalite")
    resources = request.getfixturevalue("aws")  # a wsfleet_local.backend.Resources
    server = request.getfixturevalue("dynalite_server")
    server.create_tables(resources)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint_url)


def pytest_report_header(config: pytest.Config) -> str:
    return "wsfleet: DynamoDB on dynalite (bench.dynalite_plugin), SQS on moto"
