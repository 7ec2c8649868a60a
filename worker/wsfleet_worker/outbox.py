"""HintOutbox: the worker's hints to its peers, sent in batches as they are queued.

A worker hints a connection it lets go while the connection should keep streaming: a release
on drain, a session that crashed or was handed over, a stranded connection the sweep freed,
a connection won while draining and handed back. Callers must not wait for SQS (a drain
releases a thousand connections; the sweep and the session callbacks are not the place for a
round trip), so :meth:`HintOutbox.add` only queues. Ten hints make a SendMessageBatch, and a
full one goes out at once, whatever is in flight (it is that request either way). A partial
one goes out when nothing is in flight; what is queued while sends are out joins it, so a
drain's trickle of releases is coalesced, never sent one request per hint. A hint that cannot
be sent is logged and dropped: its connection is free and STARTED, so it sits in gsi_unowned
and the reconciler hints it after its grace.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wsfleet.hint_sender import HintSender
from wsfleet.hints import SQS_BATCH_LIMIT, Hint
from wsfleet.record import connection_id_from_pk

from .connector import describe_error
from .offload import Offloader

__all__ = ["HintOutbox"]


class HintOutbox:
    """Sends hints in batches as they are queued (see the module docstring)."""

    def __init__(self, sender: HintSender, offloader: Offloader, logger: Any) -> None:
        self._sender = sender
        self._offloader = offloader
        self._logger = logger
        self._pending: list[Hint] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.sent = 0

    def add(self, hint: Hint) -> None:
        self._pending.append(hint)
        self._send_ready()

    def _send_ready(self) -> None:
        """Send every full batch now, and a partial one if no send is out."""
        while len(self._pending) >= SQS_BATCH_LIMIT or (self._pending and not self._sending):
            batch = self._pending[:SQS_BATCH_LIMIT]
            del self._pending[:SQS_BATCH_LIMIT]
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._send_ready()  # what was queued meanwhile

    async def _send(self, batch: list[Hint]) -> None:
        try:
            failed = await self._offloader.sqs(self._sender.send_many, batch)
        except Exception as exc:  # the reconciler will find these connections free
            failed = batch
            self._logger.warning("hint send failed", extra={"error": describe_error(exc)})
        self.sent += len(batch) - len(failed)
        sent = [connection_id_from_pk(hint.pk) for hint in batch if hint not in failed]
        self._logger.debug("hints sent", extra={"connection_ids": sent})
        if failed:
            self._logger.warning("hints not sent", extra={"count": len(failed)})

    async def flush(self) -> None:
        """Wait until everything queued so far has been sent (or given up on)."""
        while self._sending:
            # asyncio.wait, not gather: a flush cut short (a drain's timeout) cancels no send
            await asyncio.wait(set(self._sending))
