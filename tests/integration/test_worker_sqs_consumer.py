"""QueueConsumer against the real (moto) SQS: a failing receive backs off and recovers, a
batch that arrives after stop is given back, a batch is deleted in one call.

The consumer is what the hint poller and the control channel share; their own tests cover
what each does with a batch (test_worker_poller.py, test_worker_hostile_queues.py).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import boto3
import pytest
from fleet_helpers import queue_depth

from wsfleet_local.waiting import wait_until_async
from wsfleet_worker.offload import Offloader
from wsfleet_worker.sqs_consumer import Message, QueueConsumer

pytestmark = pytest.mark.integration

LIMIT = 15.0  # a bound on waiting for the queue, never a timing assertion


class Logger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.warnings.append(message)


class Receives:
    """The SQS client, noting each ReceiveMessage as it leaves (the long poll is out)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.out = threading.Event()

    def receive_message(self, **kwargs: Any) -> Any:
        self.out.set()
        return self._client.receive_message(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


#: The shared poll (wsfleet_local.waiting), bounded by LIMIT.
until = functools.partial(wait_until_async, timeout=LIMIT)


def consume(
    aws,
    url: str,
    scenario: Callable[[QueueConsumer, Any, list[Message], Logger], Awaitable[None]],
    *,
    wait_seconds: int = 1,
) -> None:
    sqs = boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name=aws.region)

    async def main() -> None:
        offloader = Offloader(io_threads=1, write_threads=1, sqs_threads=1)
        logger = Logger()
        client = Receives(sqs)
        consumer = QueueConsumer(
            client, offloader, logger, queue="test queue", message="test message",
            queue_url=url, wait_seconds=wait_seconds,
        )
        handled: list[Message] = []

        async def handle(messages: list[Message]) -> None:
            handled.extend(messages)
            await consumer.delete([m["ReceiptHandle"] for m in messages])

        task = asyncio.create_task(consumer.run(handle))
        try:
            await scenario(consumer, client, handled, logger)
        finally:
            consumer.stop()
            await asyncio.wait_for(task, LIMIT)
            offloader.shutdown()

    asyncio.run(main())


def new_queue(aws) -> tuple[Any, str, str]:
    sqs = boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name=aws.region)
    name = f"consumer-{uuid.uuid4().hex[:8]}"
    return sqs, name, sqs.create_queue(QueueName=name)["QueueUrl"]


def test_a_failing_receive_is_logged_retried_and_recovers(aws):
    # GIVEN a consumer whose queue is gone (every receive fails)
    sqs, name, url = new_queue(aws)
    sqs.delete_queue(QueueUrl=url)

    async def scenario(consumer, client, handled, logger) -> None:
        await until(lambda: logger.warnings.count("test queue receive failed") >= 2,
                    "two failed receives")
        # WHEN the queue is back and holds messages
        assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
        for i in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
        # THEN the same consumer receives and deletes them
        await until(lambda: len(handled) == 3, "the three messages")
        await until(lambda: queue_depth(sqs, url) == (0, 0), "the deletes")
        assert sorted(m["Body"] for m in handled) == ["m0", "m1", "m2"]
        assert "test message delete failed" not in logger.warnings

    consume(aws, url, scenario)


def test_a_batch_that_arrives_after_stop_is_given_back(aws):
    # GIVEN a consumer whose long poll is out
    sqs, _, url = new_queue(aws)

    async def scenario(consumer, client, handled, logger) -> None:
        await asyncio.to_thread(client.out.wait, LIMIT)
        client.out.clear()
        # WHEN it is stopped, and a message arrives for that poll
        consumer.stop()
        sqs.send_message(QueueUrl=url, MessageBody="late")
        await until(lambda: queue_depth(sqs, url)[0] == 1 or handled, "the poll to settle")

    consume(aws, url, scenario, wait_seconds=5)  # the poll outlasts the send
    # THEN the message was not handled, and is visible again at once (not in flight until its
    # visibility timeout): received twice, by the consumer and now by us
    response = sqs.receive_message(
        QueueUrl=url, AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=0
    )
    (message,) = response["Messages"]
    assert message["Body"] == "late"
    assert message["Attributes"]["ApproximateReceiveCount"] == "2"
