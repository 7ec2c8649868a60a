"""Where a graceful hand-off's time goes, per connection and per stage (issue #26 item 5).

The hand-off bench (:func:`bench.fleet_bench.run_disruption`, ``kind="handoff"``) runs its
workers at DEBUG, and each stage of every connection's move is stamped where it happens. A
move takes one of two paths, told apart by the giver's ``hand-off decided`` line
(``decision``: ``transfer``, or the fallback's reason):

**overlap** (make-before-break, docs/handoff.md section 2; the decision was ``transfer``):

=================  ==========================================================================
stage              stamped by
=================  ==========================================================================
prepare_sent       the giver: ``control messages sent`` (the SendMessageBatch carrying PREPARE
                   returned)
prepare_seen       the taker: ``control messages received`` holding the PREPARE
upstream_opened    the upstream: the taker's session opened (``opened_at``)
first_frame        the upstream: that session's first frame sent (``first_frame_at``)
ready_sent         the taker: ``control messages sent`` holding READY
ready_seen         the giver: ``control messages received`` holding READY
transferred        the giver: ``session transferred`` (the transfer write landed)
commit_sent        the giver: ``control messages sent`` holding COMMIT
commit_seen        the taker: ``control messages received`` holding COMMIT
adopted            the taker: ``prepared session adopted`` (its consistent read showed it)
first_stored       the taker: ``first frame stored`` (its first frame acknowledged by the sink)
=================  ==========================================================================

plus ``giver_closed`` (the upstream: the giver's socket closed), which is off this path: the
taker's session streams before and after it.

**break** (break-before-make: ``upstream.handoff: break``, a connection that cannot overlap,
no peer with room, or a fallback after PREPARE):

=================  ==========================================================================
giver_closed       the upstream: the giver's session socket closed (``closed_at``)
released           the giver: ``session finished`` (logged once the release write landed)
hint_sent          the giver: ``hints sent`` or ``control messages sent`` holding a HANDOFF
hint_seen          the taker: ``hints received`` or ``control messages received`` holding a
                   HANDOFF (the first after the release: never the transfer's delayed copy)
acquired           the taker: ``lease acquired`` (the conditional write landed)
upstream_opened    the upstream: the taker's session opened (``opened_at``)
first_frame        the upstream: that session's first frame sent (``first_frame_at``)
first_stored       the taker: ``first frame stored``
=================  ==========================================================================

Every time is seconds after the signal, on one machine's wall clock (the worker logs'
millisecond timestamps, the simulator's ``time.time()``). :func:`stage_times` gives each
path's stage percentiles over the connections that took it and, per connection, the step from
one stage to the next (the stage a connection spends its time in), so a run says *where* its
p99 comes from; ``stages`` has every stage over all connections (``first_stored`` is issue
#26's figure).

What a reader of the stream feels is another figure: :func:`store_stalls` gives, per
connection, the pause in the messages table from the giver's last stored frame (its last
item's ``received_at_ms``) to the taker's first (its ``first frame stored`` line, found by
:func:`first_stored_frames`), from the items the run's audit reads anyway.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .harness import by_stream, percentiles

__all__ = [
    "BREAK_STAGES",
    "BREAK_STEPS",
    "OVERLAP_STAGES",
    "OVERLAP_STEPS",
    "first_stored_frames",
    "giver_ends",
    "log_events",
    "stage_times",
    "store_stalls",
]

#: A make-before-break move's stages, in the order a connection passes them.
OVERLAP_STAGES = ("prepare_sent", "prepare_seen", "upstream_opened", "first_frame", "ready_sent",
                  "ready_seen", "transferred", "commit_sent", "commit_seen", "adopted",
                  "first_stored")  # fmt: skip
#: A break-before-make move's stages, in order.
BREAK_STAGES = ("giver_closed", "released", "hint_sent", "hint_seen", "acquired",
                "upstream_opened", "first_frame", "first_stored")  # fmt: skip
#: From each stage to the next (a connection's time in between), per path.
OVERLAP_STEPS = tuple(f"{a}->{b}" for a, b in itertools.pairwise(OVERLAP_STAGES))
BREAK_STEPS = tuple(f"{a}->{b}" for a, b in itertools.pairwise(BREAK_STAGES))
_PATHS = {"overlap": OVERLAP_STAGES, "break": BREAK_STAGES}
#: Every stage, each once (``giver_closed`` is timed on both paths).
ALL_STAGES = tuple(dict.fromkeys((*OVERLAP_STAGES, "giver_closed", *BREAK_STAGES)))

#: Control messages by type, as the ``control messages sent/received`` lines name them.
_SENT_BY_GIVER = {"PREPARE": "prepare_sent", "COMMIT": "commit_sent", "HANDOFF": "hint_sent"}
_SEEN_BY_GIVER = {"READY": "ready_seen"}
_SENT_BY_TAKER = {"READY": "ready_sent"}
_SEEN_BY_TAKER = {"PREPARE": "prepare_seen", "COMMIT": "commit_seen", "HANDOFF": "hint_seen"}


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


def _by_type(event: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(type, connection id) of each message a ``control messages ...`` line names."""
    messages = event.get("messages")
    if not isinstance(messages, Mapping):
        return
    for kind, stream_ids in messages.items():
        if isinstance(stream_ids, list):
            for stream_id in stream_ids:
                yield str(kind), str(stream_id)


_CONTROL_LINES = ("control messages sent", "control messages received")


def _control_stages(
    event: Mapping[str, Any], sent: Mapping[str, str], seen: Mapping[str, str]
) -> Iterable[tuple[str, str]]:
    """(stage, connection id) of each message a ``control messages sent/received`` line
    names, the stage being what ``sent`` (or ``seen``) maps its type to."""
    table = sent if str(event["message"]).endswith("sent") else seen
    for kind, stream_id in _by_type(event):
        if kind in table:
            yield table[kind], stream_id


def _stamps(
    events: Sequence[Mapping[str, Any]], sessions: Sequence[Any], wanted: set[str], *,
    signalled_at: float, giver: str,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Each stage's time per connection, and each connection's giver decision."""
    stamps: dict[str, dict[str, float]] = {stage: {} for stage in ALL_STAGES}
    decisions: dict[str, str] = {}

    def stamp(stage: str, stream_id: Any, at: float) -> None:
        if stream_id in wanted:
            _first(stamps[stage], stream_id, at)

    for event in events:
        at = float(event["at"])
        if at < signalled_at - 0.001:  # a log line has millisecond resolution
            continue
        message, worker = event["message"], event.get("worker_id")
        single = event.get("connection_id")
        several = event.get("connection_ids") or []
        if worker == giver:
            if message == "session finished" and event.get("released"):
                stamp("released", single, at)
            elif message == "session transferred":
                stamp("transferred", single, at)
            elif message == "hand-off decided" and single in wanted:
                decisions.setdefault(single, str(event.get("decision", "")))
            elif message == "hints sent":
                for stream_id in several:
                    stamp("hint_sent", stream_id, at)
            elif message in _CONTROL_LINES:
                for stage, stream_id in _control_stages(event, _SENT_BY_GIVER, _SEEN_BY_GIVER):
                    stamp(stage, stream_id, at)
            continue
        if message == "hints received":
            for stream_id in several:
                stamp("hint_seen", stream_id, at)
        elif message in _CONTROL_LINES:
            for stage, stream_id in _control_stages(event, _SENT_BY_TAKER, _SEEN_BY_TAKER):
                stamp(stage, stream_id, at)
        elif message == "lease acquired":
            stamp("acquired", single, at)
        elif message == "prepared session adopted":
            stamp("adopted", single, at)
        elif message == "first frame stored":
            stamp("first_stored", single, at)
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
    return stamps, decisions


def _stats(values: Iterable[float]) -> dict[str, float | int] | None:
    stats = percentiles(values)
    return None if stats is None else stats.to_dict()


def stage_times(
    events: Sequence[Mapping[str, Any]],
    sessions: Sequence[Any],
    ids: Sequence[str],
    *,
    signalled_at: float,
    giver: str,
) -> dict[str, Any]:
    """Per stage: percentiles of (stage time - signal); per step between two consecutive
    stages of a path: percentiles over the connections that took it of (later - earlier).
    Only what happened after the signal counts; the giver's lines are those of ``giver``, the
    takers' every other.

    Returns ``stages`` (every stage over the connections whose path has it), ``moves``
    (connections per path, and per giver decision) and ``paths``: for ``overlap`` and
    ``break``, the ``stages`` and ``steps`` of the connections that took that path (a path
    nobody took is left out)."""
    stamps, decisions = _stamps(events, sessions, set(ids), signalled_at=signalled_at,
                                giver=giver)  # fmt: skip
    path_of = {i: "overlap" if decisions.get(i) == "transfer" else "break" for i in ids}
    result: dict[str, Any] = {"stages": {}, "moves": {}, "paths": {}}
    for stage in ALL_STAGES:  # (a stage counts for the connections whose path has it)
        found = [at - signalled_at for i, at in stamps[stage].items()
                 if stage == "giver_closed" or stage in _PATHS[path_of[i]]]
        if (stats := _stats(found)) is not None:
            result["stages"][stage] = stats
    for path, stages in _PATHS.items():
        members = [i for i in ids if path_of[i] == path]
        if not members:
            continue
        result["moves"][path] = len(members)
        timed: dict[str, Any] = {"stages": {}, "steps": {}}
        for stage in (*stages, "giver_closed"):
            found = [stamps[stage][i] - signalled_at for i in members if i in stamps[stage]]
            if (stats := _stats(found)) is not None:
                timed["stages"][stage] = stats
        for earlier, later in itertools.pairwise(stages):
            deltas = [stamps[later][i] - stamps[earlier][i]
                      for i in members if i in stamps[later] and i in stamps[earlier]]
            if (stats := _stats(deltas)) is not None:
                timed["steps"][f"{earlier}->{later}"] = stats
        result["paths"][path] = timed
    fallbacks: dict[str, int] = {}
    for decision in decisions.values():
        if decision != "transfer":
            fallbacks[decision] = fallbacks.get(decision, 0) + 1
    if fallbacks:
        result["moves"]["fallbacks"] = dict(sorted(fallbacks.items()))
    return result


def first_stored_frames(
    events: Sequence[Mapping[str, Any]], ids: Sequence[str], *, signalled_at: float, giver: str
) -> dict[str, tuple[float, int | None]]:
    """Per connection, when a taker logged ``first frame stored`` after the signal (epoch
    seconds) and the seq it names (None if the line has none); the earliest line counts."""
    wanted = set(ids)
    found: dict[str, tuple[float, int | None]] = {}
    for event in events:
        at = float(event["at"])
        stream_id = event.get("connection_id")
        if (event["message"] != "first frame stored" or event.get("worker_id") == giver
                or stream_id not in wanted or at < signalled_at - 0.001):
            continue
        if stream_id not in found or at < found[stream_id][0]:
            seq = event.get("seq")
            found[stream_id] = (at, seq if isinstance(seq, int) else None)
    return found  # fmt: skip


def giver_ends(
    events: Sequence[Mapping[str, Any]], ids: Sequence[str], *, signalled_at: float, giver: str
) -> dict[str, float]:
    """Per connection, when the giver's lease write that ended its session landed after the
    signal (epoch seconds): ``session transferred`` (overlap) or ``session finished`` with the
    release (break). The giver writes no frame after it (the transfer follows its quiesce; the
    release its flush), so its last stored frame landed before."""
    wanted = set(ids)
    found: dict[str, float] = {}
    for event in events:
        at = float(event["at"])
        stream_id = event.get("connection_id")
        ended = event["message"] == "session transferred" or (
            event["message"] == "session finished" and event.get("released"))
        if (not ended or event.get("worker_id") != giver or stream_id not in wanted
                or at < signalled_at - 0.001):
            continue
        _first(found, stream_id, at)
    return found  # fmt: skip


def store_stalls(
    items: Mapping[str, Sequence[Mapping[str, Any]]],
    first_stored: Mapping[str, tuple[float, int | None]],
    *,
    signalled_at: float,
    giver: str,
    giver_ended: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What a reader of the messages table feels during a hand-off, per connection, from its
    stored items (``seq``, ``worker_id``, ``received_at_ms``) and its taker's ``first frame
    stored`` (:func:`first_stored_frames`); percentiles in seconds:

    * ``store_stall``: the giver's last stored frame -> the taker's first stored frame. The
      giver's side is its last item's ``received_at_ms`` (items carry no write time): its
      write landed the giver's store delay later (a flush wait plus one write; seconds when
      the giver's writes fall behind), so this is an upper bound;
    * ``store_stall_lower``: the same from the giver's end (``giver_ended``,
      :func:`giver_ends`: its last frame was stored before it), a lower bound;
    * ``giver_last_received``: that frame's receipt, after the signal (the giver stores until
      its transfer, or its close on the break path);
    * ``first_frame_age``: the taker's first stored frame (the seq its line names) from its
      receipt to that line: how late that frame reached the table (a prepared taker receives
      and buffers before the transfer; the steady store delay is the flush wait plus a write).

    A connection without a taker's line, or without a giver's item, is counted in
    ``missing`` and left out of the figures."""
    stalls, lower, giver_last, ages = [], [], [], []
    giver_ended = giver_ended or {}
    missing = 0
    for stream_id, (stored_at, seq) in sorted(first_stored.items()):
        stream_items = items.get(stream_id, ())
        givers = [int(i["received_at_ms"]) for i in stream_items
                  if i.get("worker_id") == giver and "received_at_ms" in i]  # fmt: skip
        if not givers:
            missing += 1
            continue
        last = max(givers) / 1000
        stalls.append(stored_at - last)
        giver_last.append(last - signalled_at)
        if stream_id in giver_ended:
            lower.append(stored_at - giver_ended[stream_id])
        taken = [int(i["received_at_ms"]) for i in stream_items
                 if seq is not None and i.get("seq") == seq and i.get("worker_id") != giver
                 and "received_at_ms" in i]  # fmt: skip
        if taken:
            ages.append(stored_at - min(taken) / 1000)
    missing += sum(1 for stream_id in items if stream_id not in first_stored)
    result: dict[str, Any] = {"missing": missing}
    for name, values in (("store_stall", stalls), ("store_stall_lower", lower),
                         ("giver_last_received", giver_last),
                         ("first_frame_age", ages)):  # fmt: skip
        if (stats := _stats(values)) is not None:
            result[name] = stats
    return result
