"""wsfleet_local.backend.SerializedMotoApp: its process-wide patch of moto's SQS queue.

The app releases its lock while a long poll waits by replacing moto's
``Queue.wait_for_messages``, which is one attribute of one class: a second app in the same
process would make the first app's long polls release the second app's lock.
"""

from __future__ import annotations

from typing import Any

import pytest
from moto.sqs.models import Queue

from wsfleet_local.backend import BackendError, SerializedMotoApp


@pytest.fixture
def unpatched_queue(monkeypatch: pytest.MonkeyPatch) -> Any:
    # monkeypatch puts moto's own method back afterwards, whatever the app assigned.
    monkeypatch.setattr(Queue, "wait_for_messages", Queue.wait_for_messages)
    monkeypatch.setattr(Queue, "_wsfleet_serialized", False, raising=False)
    return Queue


def test_the_app_takes_over_the_long_poll_wait(unpatched_queue: Any) -> None:
    original = unpatched_queue.wait_for_messages
    SerializedMotoApp(object())  # type: ignore[arg-type]
    assert unpatched_queue.wait_for_messages is not original


def test_a_second_app_in_one_process_is_refused(unpatched_queue: Any) -> None:
    SerializedMotoApp(object())  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="one SerializedMotoApp per process"):
        SerializedMotoApp(object())  # type: ignore[arg-type]


def test_a_moto_without_the_wait_is_refused(
    unpatched_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(unpatched_queue, "wait_for_messages")
    with pytest.raises(BackendError, match="no wait_for_messages"):
        SerializedMotoApp(object())  # type: ignore[arg-type]
