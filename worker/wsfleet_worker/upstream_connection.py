"""``UpstreamConnection``: websockets' ``ClientConnection`` with the two bounds it leaves open.

websockets' asyncio layer enforces ``close_timeout`` only where a coroutine waits for the
close (``close()``, ``send()``, a keepalive ping). Two hostile patterns wait in ``recv()``
instead, which nothing bounds (issue #23):

* **The closing handshake after a protocol error the worker detected** (1002, 1007, 1009: a
  frame over ``max_size``, say). websockets sends the close frame and sets ``close_deadline``,
  but only the next keepalive ping enforces it (20 s later, never with pings off); an
  upstream that keeps TCP open holds the session that long. Here every close the connection
  expects (:meth:`~websockets.protocol.Protocol.close_expected`) arms a timer at websockets'
  own ``close_deadline`` that aborts the transport if TCP is still open then.
* **A message that never completes** (a fragmented message, or one frame, trickled at a byte a
  second with pings answered). Its only bound is ``max_size``: days. Here a message still
  incomplete ``message_timeout`` seconds after its first byte
  (:class:`~wsfleet_worker.session_rules.IncompleteMessage`) fails the connection with
  :data:`~wsfleet_worker.session_rules.MESSAGE_TIMEOUT_CODE` ("message timeout"), whose
  closing handshake is then bounded as above. The session sees an ordinary worker-sent close
  (``last_error`` ``closed_by_worker (code 1008: message timeout)``, counted).

Both are one timer per connection at most, and only while something is pending.

And one stall of its flow control: websockets stops reading the socket once ``max_queue``
messages wait unread (4 from the connector), and resumes only as they are read. The worker stops
reading messages when it ends a session (nothing read after ``finish`` is stored) and then
closes; with the queue full, the upstream's close frame sat unread in the socket and every such
close ran to the 2 s timeout and an abort (a SIGTERM hand-off of a 20 frames/s stream on a
loaded machine: each giver socket closed 2.1 s after the signal, the release waiting for it).
:meth:`close` therefore drops what is queued and what still arrives, and reads on to the close
frame.
"""

from __future__ import annotations

from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.frames import DATA_OPCODES, CloseCode, Frame
from websockets.protocol import OPEN

from .session_rules import MESSAGE_TIMEOUT_CODE, MESSAGE_TIMEOUT_REASON, IncompleteMessage

__all__ = ["UpstreamConnection", "bounded_connection"]

class UpstreamConnection(ClientConnection):
    """See the module docstring. Build the class with :func:`bounded_connection`."""

    #: Seconds an incomplete message may take to complete; None: unbounded (websockets' own).
    message_timeout: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fragmented = False  # a data frame without FIN was the last one received
        self._incomplete = IncompleteMessage(self.message_timeout)
        self._message_timer: Any = None
        self._close_timer: Any = None
        self._discarding = False  # the worker closes: messages are no longer read

    # ---------------------------------------------------------------- asyncio.Protocol
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.protocol.state is OPEN:
            # Incomplete: inside a fragmented message, or a frame only partly read.
            pending = self._fragmented or bool(self.protocol.reader.buffer)
            self._incomplete.observe(self.loop.time(), pending)
            self._arm_message_timer()
        self._arm_close_timer()

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            self._fragmented = not event.fin
            if self._discarding:
                return  # nobody reads it: queueing it would pause reading again
        super().process_event(event)

    # ---------------------------------------------------------------- closing
    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """websockets' closing handshake, reading on to the upstream's close frame."""
        self._discard_messages()
        await super().close(code, reason)

    def _discard_messages(self) -> None:
        self._discarding = True
        assembler = getattr(self, "recv_messages", None)  # set in connection_made
        if assembler is None:
            return
        assembler.frames.queue.clear()  # websockets internals, pinned in requirements
        if assembler.paused:
            assembler.paused = False
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._message_timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._message_timer = self._close_timer = None
        super().connection_lost(exc)

    # ---------------------------------------------------------------- the two bounds
    def _arm_message_timer(self) -> None:
        deadline = self._incomplete.deadline
        if deadline is not None and self._message_timer is None:
            since = self._incomplete.since
            self._message_timer = self.loop.call_at(deadline, self._message_due, since)

    def _message_due(self, armed_for: float | None) -> None:
        """The deadline of the message that was pending at ``armed_for`` is here. Compared by
        start, not by reading the clock again: asyncio may run a timer a hair early."""
        self._message_timer = None
        if self.protocol.state is not OPEN:
            return
        if self._incomplete.since != armed_for:
            self._arm_message_timer()  # that one completed; wait for the next one's deadline
            return
        self.protocol.fail(MESSAGE_TIMEOUT_CODE, MESSAGE_TIMEOUT_REASON)
        try:
            self.send_data()
        except Exception as exc:  # the transport is gone: connection_lost follows
            self.set_connection_exc(exc)
        self._arm_close_timer()

    def _arm_close_timer(self) -> None:
        """Abort at websockets' own close deadline if TCP is still open then."""
        if self._close_timer is not None or not self.protocol.close_expected():
            return
        if self.close_deadline is None:
            if self.close_timeout is None:
                return
            self.close_deadline = self.loop.time() + self.close_timeout
        self._close_timer = self.loop.call_at(self.close_deadline, self._close_due)

    def _close_due(self) -> None:
        self._close_timer = None
        if not self.connection_lost_waiter.done():
            self.set_connection_exc(TimeoutError("timed out while closing connection"))
            self.transport.abort()


def bounded_connection(message_timeout: float | None) -> type[UpstreamConnection]:
    """The connection class a connector passes to websockets (``create_connection``), with
    ``message_timeout`` seconds for an incomplete message (None or 0: unbounded)."""
    return type(
        "UpstreamConnection",
        (UpstreamConnection,),
        {"message_timeout": message_timeout or None},
    )
