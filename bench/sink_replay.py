"""Frames lost and re-sent by an at-least-once sink through a SIGKILL, a rebalance and a SIGTERM
(issue #27, the delivery contract): ``python -m bench --only sinkreplay``.

One local fleet (moto server: tables, Kinesis or Firehose; the simulator upstream) with the
stream sink, ``connections`` streams at ``rate`` frames/s on two workers, and
MESSAGE_REPLAY_WINDOW = ``window`` with CHECKPOINT_SECONDS = 600, so the send limit (not the
clock) drives the checkpoints. In turn:

1. **SIGKILL** the worker holding the most connections; its peer takes them over (task exit
   event, as in ECS) and re-sends what lies above each checkpoint;
2. **rebalance**: a third worker joins and the spread evens out (graceful moves);
3. **SIGTERM** the other first worker (a drain: release with the final checkpoint).

Then every stream is STOPped and read back from the sink. Each frame carries its lease epoch
and worker id, so a copy of a seq stored a second time is attributed to the session that sent
it again and to how that session's connection reached it: from the SIGKILLed worker (a crash
takeover), from the SIGTERMed one (a drain), or by any other graceful hand-off (a rebalancing
move). The connection views are read after each step: the ``replayed`` window reported for the
takeover and the frames re-sent inside it.

Counts: ``lost`` (a seq up to the final checkpoint missing from the sink), and per kind of
hand-off ``re_sent`` (copies beyond the first), ``reported`` (the ``replayed.frames`` the views
gained), ``outside`` (re-sent copies outside every window the views reported). The contract:
lost 0; re_sent <= reported and outside 0; 0 re-sent after a SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ReplayCounts", "run_sink_replay"]

T = TypeVar("T")

#: The kinds of hand-off counted, in the order they happen.
KINDS = ("sigkill", "rebalance", "sigterm")


@dataclass
class ReplayCounts:
    """What one kind of hand-off did to the frames in the sink."""

    handoffs: int = 0
    re_sent: int = 0
    reported: int = 0
    outside: int = 0
    windows: list[tuple[str, int, int]] = field(default_factory=list)


def _wait(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_sink_replay(
    *,
    run_dir: Path,
    sink: str = "kinesis",
    connections: int = 6,
    rate: float = 20.0,
    window: int = 60,
) -> dict[str, Any]:
    """Run the three hand-offs on one fleet; the counts per kind (see the module docstring)."""
    from wsfleet.record import ConnectionRecord
    from wsfleet_local.backend import local_client
    from wsfleet_local.client import ApiClient, scan_table
    from wsfleet_local.fleet import FleetTimings, LocalFleet
    from wsfleet_local.frame_sinks import local_sink

    timings = FleetTimings(
        lease_seconds=4.0, heartbeat_seconds=1.0, rebalance_seconds=1.0, checkpoint_seconds=600
    )
    ids = [f"rp{i:02d}" for i in range(connections)]
    extra = {"MESSAGE_REPLAY_WINDOW": str(window)}
    load_before = round(os.getloadavg()[0], 2)
    with LocalFleet(
        workers=2, timings=timings, run_dir=run_dir, rate=rate, sink=sink, extra_worker_env=extra
    ) as fleet:
        dynamodb = local_client("dynamodb", fleet.dynamodb_endpoint_url)
        api = ApiClient(fleet.api_url)

        def records() -> dict[str, ConnectionRecord]:
            items, _ = scan_table(dynamodb, fleet.resources.connections_table)
            found = [ConnectionRecord.from_item(item) for item in items]
            return {r.connection_id: r for r in found if r.connection_id in ids}

        def settled(
            owners: list[str], crashed: frozenset[str] = frozenset()
        ) -> dict[str, ConnectionRecord] | None:
            """Every stream held by one of ``owners``, checkpointed past its replay window;
            the ``crashed`` ones with the window of their takeover stored."""
            now = records()
            if len(now) < len(ids):
                return None
            for r in now.values():
                if r.lease_owner not in owners or r.last_seq <= (r.replayed_to_seq or 0):
                    return None
                taken = r.replayed_takeovers > snapshots[-1][r.connection_id].replayed_takeovers
                if r.connection_id in crashed and not taken:
                    return None
            return now

        for stream_id in ids:
            api.start(stream_id, fleet.simulator.url_for(stream_id))
        first = list(fleet.worker_ids)
        snapshots: list[dict[str, ConnectionRecord]] = [
            {i: ConnectionRecord.new(i, "", 0) for i in ids}
        ]
        before = _wait(lambda: settled(first), 120, "the first two workers to stream everything")
        # Every stream past a few checkpoints of the window (the send limit drives them).
        floor = {i: r.last_seq + window for i, r in before.items()}
        _wait(
            lambda: all(r.last_seq >= floor[i] for i, r in records().items()) or None,
            120,
            "checkpoints to advance",
        )
        snapshots = [records()]
        held = Counter(r.lease_owner for r in snapshots[0].values())
        killed = max(first, key=lambda w: held[w])
        drained = next(w for w in first if w != killed)
        crashed = frozenset(i for i, r in snapshots[0].items() if r.lease_owner == killed)
        started_at = time.time()

        # 1. SIGKILL: the peer takes over (the fleet publishes the task's exit, as ECS does).
        fleet.kill_worker(first.index(killed), signal.SIGKILL)
        snapshots.append(_wait(lambda: settled([drained], crashed), 120, "the takeovers"))
        # 2. rebalance: a third worker joins; the spread evens out.
        joined = fleet.add_worker().worker_id

        def moved() -> dict[str, ConnectionRecord] | None:
            now = settled([drained, joined])
            return now if now and any(r.lease_owner == joined for r in now.values()) else None

        snapshots.append(_wait(moved, 180, "a rebalancing move to the new worker"))
        # 3. SIGTERM: the other first worker drains (releases with its final checkpoint).
        fleet.kill_worker(first.index(drained), signal.SIGTERM)
        snapshots.append(_wait(lambda: settled([joined]), 120, "the drain's hand-offs"))
        # Stream a little more, then STOP everything: the final checkpoints cover the sink.
        floor = {i: r.last_seq + 20 for i, r in snapshots[-1].items()}
        _wait(
            lambda: all(r.last_seq >= floor[i] for i, r in records().items()) or None,
            120,
            "streaming after the drain",
        )
        for stream_id in ids:
            api.stop(stream_id)
        def stopped() -> dict[str, ConnectionRecord] | None:
            now = records()
            free = all(
                r.desired_state.value == "STOPPED" and not r.lease_owner for r in now.values()
            )
            return now if free else None

        final = _wait(stopped, 60, "every stream STOPPED and released")
        state = json.loads((run_dir / "fleet.json").read_text(encoding="utf-8"))
        reader = local_sink(state)
        frames = {i: reader.read_frames(final[i].pk) for i in ids}
    counts, lost = _count(ids, frames, final, snapshots)
    return {
        "sink": sink,
        "connections": connections,
        "rate": rate,
        "replay_window": window,
        "seconds": round(time.time() - started_at, 1),
        "frames": sum(len(f) for f in frames.values()),
        "checkpointed": sum(r.last_seq for r in final.values()),
        "lost": lost,
        "kinds": {kind: asdict(c) for kind, c in counts.items()},
        "met": lost == 0 and _met(counts),
        "load_before": load_before,
        "load_after": round(os.getloadavg()[0], 2),
    }


def _met(counts: Mapping[str, ReplayCounts]) -> bool:
    return (
        all(c.outside == 0 and c.re_sent <= c.reported for c in counts.values())
        and counts["sigterm"].re_sent == 0
    )


def _count(
    ids: list[str],
    frames: Mapping[str, list[dict[str, Any]]],
    final: Mapping[str, Any],
    snapshots: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, ReplayCounts], int]:
    """Re-sends per kind of hand-off, and the frames lost (see the module docstring)."""
    counts = {kind: ReplayCounts() for kind in KINDS}
    lost = 0
    # The replayed frames each step's views gained, and every window they reported.
    for step, kind in enumerate(KINDS, start=1):
        for stream_id in ids:
            now, then = snapshots[step][stream_id], snapshots[step - 1][stream_id]
            counts[kind].reported += now.replayed_frames - then.replayed_frames
            if now.replayed_takeovers > then.replayed_takeovers:
                window = (stream_id, now.replayed_from_seq, now.replayed_to_seq)
                counts[kind].windows.append(window)
    reported = {(w[0], w[1], w[2]) for c in counts.values() for w in c.windows}
    for stream_id in ids:
        stored = frames[stream_id]
        # An epoch acquired by step k (its snapshot shows it, the one before does not) belongs
        # to that step's kind; the moves before the first step are rebalancing moves too.
        reached = [snapshot[stream_id].lease_epoch for snapshot in snapshots]

        def kind_of(epoch: int, reached: list[int] = reached) -> str:
            for step in range(1, len(KINDS) + 1):
                if reached[step - 1] < epoch <= reached[step]:
                    return KINDS[step - 1]
            return "rebalance"

        for epoch in {f["lease_epoch"] for f in stored} - {1}:
            counts[kind_of(epoch)].handoffs += 1
        seen: dict[int, list[int]] = defaultdict(list)
        for f in stored:
            if "seq" in f:
                seen[f["seq"]].append(f["lease_epoch"])
        lost += len(set(range(1, final[stream_id].last_seq + 1)) - set(seen))
        for seq, copies in seen.items():
            for epoch in sorted(copies)[1:]:
                resend = counts[kind_of(epoch)]
                resend.re_sent += 1
                inside = any(w[0] == stream_id and w[1] <= seq <= w[2] for w in reported)
                resend.outside += not inside
    return counts, lost
