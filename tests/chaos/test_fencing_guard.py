"""Found by the chaos suite: a message write can leave after its fencing guard said no.

MessageStore checks its guard in a ``before-send.dynamodb.BatchWriteItem`` hook. botocore runs
handlers of the more specific event name first, so the guard runs *before* the generic
``before-send`` handlers, among them the adaptive retry mode's client rate limiter, which
sleeps when the client has been throttled. A frame can pass the guard, wait in the rate
limiter past its lease (or be paused there with its process), and be written afterwards under
the old epoch, over the new owner's copy (chaos: "seq N stored under epoch 1 after a lower seq
under epoch 2" after a throttling window with paused workers).

This test stands a handler of its own on the generic ``before-send`` event, registered through
the public event system like the rate limiter is, in for the limiter's wait: while the send
waits there, the frame's lease lapses. The frame must not be stored. Fixed by registering the
guard last on the generic ``before-send`` event, filtered on the BatchWriteItem event name.
(No clock: the lapse is an event set inside that handler, so the order alone decides.)
"""

from __future__ import annotations

import threading
import time

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.messages import Message, MessageStore, seq_sk

pytestmark = pytest.mark.integration


def test_a_frame_is_not_sent_once_its_guard_has_expired_behind_the_rate_limiter(aws):
    # GIVEN a messages store whose client, like the adaptive rate limiter, holds every send in a
    # generic before-send handler, and the frame's lease lapses while it is held there
    client = dynamodb_client()
    store = MessageStore(client, aws.messages_table)
    lapsed = threading.Event()
    held: list[str] = []

    def limiter_wait(request, event_name, **kwargs):
        held.append(event_name)
        lapsed.set()  # what a throttled token bucket's sleep lets happen

    client.meta.events.register("before-send", limiter_wait)

    # WHEN a frame whose lease is still safe is written
    message = Message("CONN#late", seq_sk(1), "late:1", int(time.time() * 1000), "w", 1, 1)
    store.put_batch([message], guard=lambda m: not lapsed.is_set())

    # THEN the send was held, and it was not stored: the last check before the bytes leave is
    # after every wait
    assert held == ["before-send.dynamodb.BatchWriteItem"]
    stored = client.query(
        TableName=aws.messages_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "CONN#late"}},
    )["Items"]
    assert stored == []
