"""Where a graceful hand-off's time goes, per connection and per stage (issue #26 item 5).

The hand-off bench (:func:`bench.fleet_bench.run_disruption`, ``kind="handoff"``) runs its
workers at DEBUG, and each stage of every connection's move is stamped where it happens:

=================  ==========================================================================
stage              stamped by
=================  ==========================================================================
giver_closed       the upstream: the giver's session socket closed (``closed_at``)
released           the giver: ``session finished`` (logged once the release write landed)
hint_sent          the giver: ``hints sent`` (the SendMessageBatch carrying it returned)
hint_seen          the taker: ``hints received`` (its poller begins to act on the batch)
acquired           the taker: ``lease acquired`` (the conditional write landed)
upstream_opened    the upstream: the taker's session opened (``opened_at``)
first_frame        the upstream: that session's first frame sent (``first_frame_at``)
first_stored       the taker: ``first frame stored`` (its first frame acknowledged by the sink)
=================  ==========================================================================

Every time is seconds after the signal, on one machine's wall clock (the worker logs'
millisecond timestamps, the simulator's ``time.time()``). :func:`stage_times` gives each
stage's percentiles and, per connection, the step from one stage to the next (the stage a
connection spends its time in), so a run says *where* its p99 comes from.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .harness import by_stream, percentiles

__all__ = ["STAGES", "STEPS", "log_events", "stage_times"]

#: The stages in the order a connection passes them.
STAGES = ("giver_closed", "released", "hint_sent", "hint_seen", "acquired", "upstream_opened",
          "first_frame", "first_stored")  # fmt: skip
#: From each stage to the next (a connection's time in between).
STEPS = tuple(f"{a}->{b}" for a, b in itertools.pairwise(STAGES))


def _wall_seconds(stamp: str) -> float | None:
    """Powertools' ``2026-12-02 05:21:29,123+0000`` as epoch seconds (None if unreadable)."""
    try:
        return datetime.strptime(stamp.replace(",", "."), "%Y-%m-%d %H:%M:%S.%f%z").timestamp()
    except ValueError:
        return None


def log_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON log line with a message and a readable timestamp (``at``: epoch seconds)."""
    events = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or "message" not in event:
                continue
            at = _wall_seconds(str(event.get("timestamp", "")))
            if at is not None:
                events.append({**event, "at": at})
    return events


def _first(found: dict[str, float], stream_id: str, at: float) -> None:
    if stream_id not in found or at < found[stream_id]:
        found[stream_id] = at


def stage_times(
    events: Sequence[Mapping[str, Any]],
    sessions: Sequence[Any],
    ids: Sequence[str],
    *,
    signalled_at: float,
    giver: str,
) -> dict[str, Any]:
    """Per stage: percentiles of (stage time - signal); per step between two consecutive
    stages: percentiles over the connections of (later - earlier). Only what happened after
    the signal counts; the giver's lines are those of ``giver``, the takers' every other."""
    wanted = set(ids)
    stamps: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}
    for event in events:
        at = float(event["at"])
        if at < signalled_at - 0.001:  # a log line has millisecond resolution
            continue
        message, worker = event["message"], event.get("worker_id")
        single = event.get("connection_id")
        several = event.get("connection_ids") or []
        if worker == giver:
            if message == "session finished" and single in wanted:
                _first(stamps["released"], single, at)
            elif message == "hints sent":
                for stream_id in several:
                    if stream_id in wanted:
                        _first(stamps["hint_sent"], stream_id, at)
            continue
        if message == "hints received":
            for stream_id in several:
                if stream_id in wanted:
                    _first(stamps["hint_seen"], stream_id, at)
        elif message == "lease acquired" and single in wanted:
            _first(stamps["acquired"], single, at)
        elif message == "first frame stored" and single in wanted:
            _first(stamps["first_stored"], single, at)
    for stream_id, records in by_stream(sessions).items():
        if stream_id not in wanted:
            continue
        for record in records:
            if record.opened_at <= signalled_at:
                if record.closed_at:
                    _first(stamps["giver_closed"], stream_id, record.closed_at)
            else:
                _first(stamps["upstream_opened"], stream_id, record.opened_at)
                if record.first_frame_at is not None:
                    _first(stamps["first_frame"], stream_id, record.first_frame_at)
    stages = {}
    for stage in STAGES:
        stats = percentiles(at - signalled_at for at in stamps[stage].values())
        if stats is not None:
            stages[stage] = stats.to_dict()
    steps = {}
    for step, (earlier, later) in zip(STEPS, itertools.pairwise(STAGES), strict=True):
        deltas = [
            stamps[later][i] - stamps[earlier][i]
            for i in ids
            if i in stamps[later] and i in stamps[earlier]
        ]
        stats = percentiles(deltas)
        if stats is not None:
            steps[step] = stats.to_dict()
    return {"stages": stages, "steps": steps}
