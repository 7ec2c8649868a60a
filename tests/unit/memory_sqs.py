"""An in-memory SQS double for unit tests of the worker's queue consumers (the hint poller and
the control channel): the calls they make, with SQS's visible / in-flight split.

Only what the consumers rely on is modelled: a long poll returns as soon as a message is
visible (or empty after its wait), a received message is in flight until it is deleted or
made visible again (ChangeMessageVisibility 0), and batches answer per entry. Visibility
timeouts never run out here: a message left in flight stays there, which is what a test of
"left for redelivery" observes. Every call is recorded, and receives can be made to fail.

Example::

    sqs = MemorySqs()
    url = sqs.create_queue(QueueName="hints")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="{}")
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from botocore.exceptions import ClientError

__all__ = ["MemorySqs", "throttled"]


def throttled(operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, operation
    )


@dataclass
class _Queue:
    name: str
    attributes: dict[str, str]
    tags: dict[str, str]
    visible: list[dict[str, Any]] = field(default_factory=list)
    in_flight: dict[str, dict[str, Any]] = field(default_factory=dict)  # receipt -> message


class MemorySqs:
    """The SQS client calls of :mod:`wsfleet_worker.sqs_consumer` and the control channel."""

    def __init__(self, region: str = "us-east-1") -> None:
        self.meta = SimpleNamespace(region_name=region)
        self._queues: dict[str, _Queue] = {}
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        #: receives that should fail (ThrottlingException), counted down by each receive
        self.failing_receives = 0
        #: every call's keyword arguments, by operation name
        self.calls: dict[str, list[dict[str, Any]]] = {}
        #: long polls waiting right now (a test waits for one to be out before acting)
        self.polls_out = 0

    def _record(self, operation: str, kwargs: dict[str, Any]) -> None:
        self.calls.setdefault(operation, []).append(kwargs)

    def _queue(self, url: str) -> _Queue:
        try:
            return self._queues[url]
        except KeyError:
            raise ClientError(
                {"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Message": url}},
                "SQS",
            ) from None

    # ------------------------------------------------------------------ queues
    def create_queue(
        self, *, QueueName: str, Attributes: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> dict[str, str]:  # fmt: skip
        self._record("create_queue", {"QueueName": QueueName, "Attributes": Attributes,
                                      "tags": tags})  # fmt: skip
        url = f"https://sqs.invalid/123456789012/{QueueName}"
        with self._changed:
            queue = _Queue(QueueName, dict(Attributes or {}), dict(tags or {}))
            self._queues.setdefault(url, queue)
        return {"QueueUrl": url}

    def delete_queue(self, *, QueueUrl: str) -> dict[str, Any]:
        self._record("delete_queue", {"QueueUrl": QueueUrl})
        with self._changed:
            self._queue(QueueUrl)
            del self._queues[QueueUrl]
            self._changed.notify_all()
        return {}

    def exists(self, url: str) -> bool:
        return url in self._queues

    def queue_settings(self, url: str) -> tuple[dict[str, str], dict[str, str]]:
        """(attributes, tags) the queue was created with."""
        queue = self._queue(url)
        return queue.attributes, queue.tags

    # ------------------------------------------------------------------ messages
    def send_message(self, *, QueueUrl: str, MessageBody: str) -> dict[str, str]:
        message_id = f"m{next(self._ids)}"
        with self._changed:
            self._queue(QueueUrl).visible.append(
                {"MessageId": message_id, "Body": MessageBody, "receives": 0}
            )
            self._changed.notify_all()
        return {"MessageId": message_id}

    def receive_message(
        self, *, QueueUrl: str, MaxNumberOfMessages: int = 1, WaitTimeSeconds: int = 0
    ) -> dict[str, Any]:
        self._record("receive_message", {"QueueUrl": QueueUrl,
                                         "MaxNumberOfMessages": MaxNumberOfMessages})  # fmt: skip
        with self._changed:
            if self.failing_receives > 0:
                self.failing_receives -= 1
                raise throttled("ReceiveMessage")
            self.polls_out += 1
            try:
                self._changed.wait_for(
                    lambda: QueueUrl not in self._queues or self._queues[QueueUrl].visible,
                    timeout=WaitTimeSeconds,
                )
                queue = self._queue(QueueUrl)
                taken = queue.visible[:MaxNumberOfMessages]
                del queue.visible[:MaxNumberOfMessages]
                messages = []
                for message in taken:
                    message["receives"] += 1
                    receipt = f"{message['MessageId']}-r{message['receives']}"
                    queue.in_flight[receipt] = message
                    messages.append(
                        {"MessageId": message["MessageId"], "ReceiptHandle": receipt,
                         "Body": message["Body"]}
                    )  # fmt: skip
            finally:
                self.polls_out -= 1
                self._changed.notify_all()
        return {"Messages": messages} if messages else {}

    def delete_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self._record("delete_message_batch", {"QueueUrl": QueueUrl, "Entries": Entries})
        assert 0 < len(Entries) <= 10, "SQS takes 1 to 10 entries per batch"
        with self._changed:
            queue = self._queue(QueueUrl)
            for entry in Entries:
                queue.in_flight.pop(entry["ReceiptHandle"], None)
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    def change_message_visibility_batch(
        self, *, QueueUrl: str, Entries: list[dict[str, Any]]
    ) -> Any:
        self._record("change_message_visibility_batch", {"QueueUrl": QueueUrl, "Entries": Entries})
        assert 0 < len(Entries) <= 10, "SQS takes 1 to 10 entries per batch"
        with self._changed:
            queue = self._queue(QueueUrl)
            for entry in Entries:
                assert entry["VisibilityTimeout"] == 0  # the only use the worker has
                message = queue.in_flight.pop(entry["ReceiptHandle"], None)
                if message is not None:
                    queue.visible.append(message)
            self._changed.notify_all()
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    # ------------------------------------------------------------------ for assertions
    def depth(self, url: str) -> tuple[int, int]:
        """(visible, in flight), like ApproximateNumberOfMessages(NotVisible)."""
        with self._changed:
            queue = self._queue(url)
            return len(queue.visible), len(queue.in_flight)

    def bodies(self, url: str) -> list[str]:
        """Bodies of the visible messages, oldest first."""
        with self._changed:
            return [m["Body"] for m in self._queue(url).visible]

    def deleted_batches(self) -> list[int]:
        """Entries per DeleteMessageBatch call, in order."""
        return [len(c["Entries"]) for c in self.calls.get("delete_message_batch", [])]

    def receive_limits(self) -> list[int]:
        return [c["MaxNumberOfMessages"] for c in self.calls.get("receive_message", [])]
