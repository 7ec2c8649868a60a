"""The ``dynamodb`` sink: the messages table, one item per frame (the default).

Its implementation is :class:`wsfleet.messages.MessageStore`, where every existing reader and
writer of the table finds it: items, keys and TTL are exactly what they were before sinks
existed, so a stack that does not choose a sink is unchanged. Frames are idempotent there: a
frame replayed after a failover lands on its own key (``sk`` = zero-padded seq) and overwrites
itself.
"""

from __future__ import annotations

from ..messages import MessageStore

__all__ = ["DynamoDBSink"]

#: The ``dynamodb`` sink is the messages table.
DynamoDBSink = MessageStore
