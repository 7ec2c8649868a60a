"""What the Lambda handler tests share: a function module with fresh dependencies, a worker's
control queue made the way the worker makes it, and draining a queue.

Example::

    @pytest.fixture
    def router(aws, monkeypatch):
        yield from fresh_function("router", monkeypatch, ALLOWED_UPSTREAM_HOSTS="example.com")
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from wsfleet.control import WORKER_ID_TAG, control_queue_name
from wsfleet_local.handler_loader import load_function

__all__ = ["control_queue", "drain_queue", "fresh_function"]


def fresh_function(name: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[Any]:
    """The function's module with ``env`` set, its dependencies reset before the test (so they
    are built against this test's resources) and after it (so the next test builds its own)."""
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    module = load_function(name)
    module.reset_dependencies()
    yield module
    module.reset_dependencies()


def control_queue(sqs: Any, prefix: str, worker_id: str) -> str:
    """Create ``worker_id``'s control queue, named and tagged the way the worker does it; its
    URL."""
    return str(
        sqs.create_queue(
            QueueName=control_queue_name(prefix, worker_id), tags={WORKER_ID_TAG: worker_id}
        )["QueueUrl"]
    )


def drain_queue(sqs: Any, queue_url: str) -> list[str]:
    """Every message body visible in the queue now (received and deleted), oldest batch first;
    delayed messages are not visible yet."""
    bodies: list[str] = []
    while messages := sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
    ).get("Messages", []):
        for message in messages:
            bodies.append(message["Body"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return bodies
