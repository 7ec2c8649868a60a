"""Did the fleet deliver every frame exactly once? Measured from the outside, after the fact.

The demo (and anyone checking a local run) compares three independent sources:

* the **simulator's session log**: which sessions streamed which stream when, and whether a
  resume had to skip frames (``gap``) or two sessions of one stream were open at once
  (``overlaps``);
* the **messages table**: what was durably stored, under which lease epoch;
* the **connection record**: the last checkpointed seq.

Definitions (per stream):

``lost``
    A seq the upstream produced that must have been stored but is absent from the table: for a
    stream the upstream *ended* (normal close), every seq up to its last one; for a stream
    STOPped through the API, every seq up to the last checkpoint (frames after it were
    legitimately never consumed).
``duplicated``
    Anything that means a frame was delivered twice or by the wrong owner: a stored frame whose
    content is not the upstream's ``"<id>:<seq>"``; a frame at or below the checkpoint stored
    under an *older* lease epoch than a lower seq (a fenced owner wrote after the takeover).
``overlapping_sessions``
    Pairs of upstream sessions of one stream open at the same time. Reported, not counted as
    duplicates: a make-before-break hand-off (``upstream.handoff: overlap``, the default,
    docs/handoff.md) opens the taker's session before the giver's closes on purpose, and
    what decides whether a frame was delivered twice is what was stored, under which epoch
    (above). Break mode never overlaps (tests/integration/test_handoff_close_order.py); a
    split brain that stored anything shows as stale-epoch writes.

Pure: inputs in, :class:`StreamAudit` out.

Example::

    >>> items = [{"seq": 1, "message_data": "s:1", "lease_epoch": 1},
    ...          {"seq": 2, "message_data": "s:2", "lease_epoch": 2}]
    >>> a = audit_stream("s", final_seq=2, ended=True, checkpointed=2, items=items, sessions=[])
    >>> (a.lost, a.duplicated)
    (0, 0)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .simulator import SessionRecord, find_overlaps, frame_data

__all__ = ["FleetAudit", "StreamAudit", "audit_stream", "latency_summary"]


@dataclass(frozen=True)
class StreamAudit:
    """The verdict for one stream."""

    stream_id: str
    final_seq: int  # last seq the upstream produced for the fleet (end of stream, or at STOP)
    ended: bool  # True: the upstream ended it; False: STOPped through the API
    checkpointed: int
    stored: int
    missing: tuple[int, ...] = ()
    corrupt: tuple[int, ...] = ()
    stale_epoch: tuple[int, ...] = ()
    overlapping_sessions: int = 0
    replay_gaps: int = 0
    sessions: int = 0

    @property
    def lost(self) -> int:
        return len(self.missing)

    @property
    def duplicated(self) -> int:
        return len(self.corrupt) + len(self.stale_epoch)


def audit_stream(
    stream_id: str,
    *,
    final_seq: int,
    ended: bool,
    checkpointed: int,
    items: Iterable[Mapping[str, Any]],
    sessions: Sequence[SessionRecord],
) -> StreamAudit:
    """Audit one stream from its stored items, its record's checkpoint and its sessions."""
    by_seq: dict[int, Mapping[str, Any]] = {}
    for item in items:
        if item.get("seq") is not None:
            by_seq[int(item["seq"])] = item
    must_have = final_seq if ended else checkpointed
    missing = tuple(seq for seq in range(1, must_have + 1) if seq not in by_seq)
    corrupt = tuple(
        seq
        for seq, item in sorted(by_seq.items())
        if item.get("message_data") != frame_data(stream_id, seq)
    )
    stale: list[int] = []
    newest_epoch = 0
    for seq in sorted(s for s in by_seq if s <= max(checkpointed, must_have)):
        epoch = int(by_seq[seq].get("lease_epoch") or 0)
        if epoch < newest_epoch:
            stale.append(seq)
        newest_epoch = max(newest_epoch, epoch)
    return StreamAudit(
        stream_id=stream_id,
        final_seq=final_seq,
        ended=ended,
        checkpointed=checkpointed,
        stored=len(by_seq),
        missing=missing,
        corrupt=corrupt,
        stale_epoch=tuple(stale),
        overlapping_sessions=len(find_overlaps(sessions)),
        replay_gaps=sum(s.gap for s in sessions),
        sessions=len(sessions),
    )


@dataclass(frozen=True)
class FleetAudit:
    """All streams together."""

    streams: tuple[StreamAudit, ...] = field(default_factory=tuple)

    @property
    def produced(self) -> int:
        return sum(s.final_seq for s in self.streams)

    @property
    def stored(self) -> int:
        return sum(s.stored for s in self.streams)

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.streams)

    @property
    def duplicated(self) -> int:
        return sum(s.duplicated for s in self.streams)

    @property
    def overlapping_sessions(self) -> int:
        return sum(s.overlapping_sessions for s in self.streams)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


def latency_summary(seconds: Sequence[float]) -> tuple[float, float] | None:
    """(p50, max) of a list of durations, or None when nothing was measured."""
    if not seconds:
        return None
    return statistics.median(seconds), max(seconds)
