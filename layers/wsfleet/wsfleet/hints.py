"""Work hints on SQS: "connection X may need an owner".

A hint is never trusted: the receiver still has to win the conditional acquire, so a duplicate,
late or stale hint costs one refused write and nothing else. That is what lets the router,
the reconciler and a draining worker send them freely.

This module is the message only (pure: the reconciler's planning and the worker's triage use
it); :mod:`wsfleet.hint_sender` puts hints on the queue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .bodies import connection_pk_field, decode_object, epoch_field

__all__ = ["SQS_BATCH_LIMIT", "Hint"]

SQS_BATCH_LIMIT = 10


@dataclass(frozen=True)
class Hint:
    """A hint for one connection; ``delay_seconds`` postpones delivery (SQS max 900)."""

    pk: str
    epoch: int | None = None
    delay_seconds: int = 0

    def body(self) -> str:
        payload: dict[str, Any] = {"pk": self.pk}
        if self.epoch is not None:
            payload["epoch"] = self.epoch
        return json.dumps(payload, separators=(",", ":"))

    @classmethod
    def parse(cls, body: str) -> Hint:
        """Parse a message body; ValueError (only) for anything that is not a connection hint.

        >>> Hint.parse('{"pk": "CONN#a", "epoch": 3}')
        Hint(pk='CONN#a', epoch=3, delay_seconds=0)
        """
        payload = decode_object(body, what="hint")
        pk = connection_pk_field(payload, what="hint")
        return cls(pk, epoch_field(payload, what="hint", required=False))
