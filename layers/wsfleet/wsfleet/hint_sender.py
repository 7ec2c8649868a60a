"""HintSender: puts :class:`~wsfleet.hints.Hint` messages on the hint queue, in batches."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .backoff import backoff
from .hints import SQS_BATCH_LIMIT, Hint
from .lease import MAX_HINT_DELAY_SECONDS

__all__ = ["HintSender"]


class HintSender:
    """Sends hints with SendMessageBatch, retrying failed entries with jittered backoff.

    :param client: a boto3 SQS client (see :func:`wsfleet.aws.sqs_client`).
    :param queue_url: the hint queue.
    :param attempts: tries per entry before it is reported as failed.
    """

    def __init__(self, client: Any, queue_url: str, *, attempts: int = 4) -> None:
        self._client = client
        self.queue_url = queue_url
        self._attempts = attempts

    def send(self, hint: Hint) -> bool:
        """Send one hint; True if SQS accepted it."""
        return not self.send_many([hint])

    def send_many(self, hints: Iterable[Hint]) -> list[Hint]:
        """Send every hint, 10 per call. Returns the hints that could not be sent."""
        pending = list(hints)
        failed: list[Hint] = []
        for start in range(0, len(pending), SQS_BATCH_LIMIT):
            failed.extend(self._send_batch(pending[start:start + SQS_BATCH_LIMIT]))
        return failed

    def _send_batch(self, batch: Sequence[Hint]) -> list[Hint]:
        remaining = {str(i): hint for i, hint in enumerate(batch)}
        rejected: list[Hint] = []
        delays = backoff()
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(next(delays))
            entries = [
                {
                    "Id": entry_id,
                    "MessageBody": hint.body(),
                    "DelaySeconds": max(0, min(MAX_HINT_DELAY_SECONDS, hint.delay_seconds)),
                }
                for entry_id, hint in remaining.items()
            ]
            try:
                response = self._client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except (ClientError, BotoCoreError):
                continue  # whole call failed (botocore already retried): back off and try again
            for ok in response.get("Successful", []):
                remaining.pop(ok["Id"], None)
            # Sender faults (bad input) will not succeed on retry; SQS-side ones may.
            for bad in response.get("Failed", []):
                if bad.get("SenderFault") and bad["Id"] in remaining:
                    rejected.append(remaining.pop(bad["Id"]))
            if not remaining:
                break
        return rejected + list(remaining.values())
