"""Found by the chaos suite: a message write can leave after its fencing guard said no.

MessageStore checks its guard in a ``before-send.dynamodb.BatchWriteItem`` hook. botocore runs
handlers of the more specific event name first, so the guard runs *before* the generic
``before-send`` handlers, among them the adaptive retry mode's client rate limiter, which
sleeps when the client has been throttled. A frame can pass the guard, wait in the rate
limiter past its lease (or be paused there with its process), and be written afterwards under
the old epoch, over the new owner's copy (chaos: "seq N stored under epoch 1 after a lower seq
under epoch 2" after a throttling window with paused workers).

This test makes the rate limiter's wait explicit (1 s) and gives the guard 0.5 s: the frame
must not be stored. Fixed by registering the guard last on the generic ``before-send`` event,
filtered on the BatchWriteItem event name.
"""

from __future__ import annotations

import time

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.messages import Message, MessageStore, seq_sk

pytestmark = pytest.mark.integration


def test_a_frame_is_not_sent_once_its_guard_has_expired_behind_the_rate_limiter(aws):
    # GIVEN a messages store on an adaptive-retry client whose rate limiter makes sends wait 1 s
    client = dynamodb_client()
    store = MessageStore(client, aws.messages_table)
    emitter = client.meta.events
    handlers = emitter._emitter._handlers
    limiter = next(
        handler
        for handler in handlers.prefix_search("before-send.dynamodb.BatchWriteItem")
        if getattr(handler, "__qualname__", "").startswith("ClientRateLimiter")
    )

    def throttled_wait(request, **kwargs):
        time.sleep(1.0)  # what a throttled token bucket does
        return limiter(request=request, **kwargs)

    emitter.unregister("before-send", limiter)
    emitter.register("before-send", throttled_wait)

    # WHEN a frame whose lease is safe for 0.5 s more is written
    deadline = time.monotonic() + 0.5
    message = Message("CONN#late", seq_sk(1), "late:1", int(time.time() * 1000), "w", 1, 1)
    store.put_batch([message], guard=lambda m: time.monotonic() < deadline)

    # THEN it was not stored: the last check before the bytes leave is after every wait
    stored = client.query(
        TableName=aws.messages_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "CONN#late"}},
    )["Items"]
    assert stored == []
