"""HintOutbox: the worker's hints to its peers, sent in batches as they are queued.

A worker hints a connection it lets go while the connection should keep streaming: a release
on drain, a session that crashed or was handed over, a stranded connection the sweep freed,
a connection won while draining and handed back. Callers must not wait for SQS (a drain
releases a thousand connections; the sweep and the session callbacks are not the place for a
round trip), so :meth:`HintOutbox.add` only queues: whatever accumulates while the sends are
in flight goes out together next, ten hints per SendMessageBatch, the batches at once. A hint
that cannot be sent is logged and dropped: its connection is free and STARTED, so it sits in
gsi_unowned and the reconciler hints it after its grace.
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
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def add(self, hint: Hint) -> None:
        self._pending.append(hint)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            pending, self._pending = self._pending, []
            # One SendMessageBatch per ten hints, all at once (bounded by the SQS pool): a
            # drain of a hundred connections must not send ten batches one after another.
            chunks = [
                pending[start:start + SQS_BATCH_LIMIT]
                for start in range(0, len(pending), SQS_BATCH_LIMIT)
            ]
            await asyncio.gather(*(self._send(chunk) for chunk in chunks))

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
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
