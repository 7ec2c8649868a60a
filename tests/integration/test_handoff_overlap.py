"""Make-before-break hand-offs (issue #26, items 1, 2, 4) with real workers on the moto server.

A live-only upstream (the simulator's ``live_only`` shape: ``from_seq`` is ignored, frames
sent while nobody listens are gone) is streamed through a rebalancing move and a SIGTERM
drain. With ``upstream.handoff: overlap`` the taker opens its own session and buffers before
the giver closes, and ownership moves in one conditional write: no frame is lost, no gap is
reported, and no seq is stored by both sides. The same run with ``upstream.handoff: break``
loses the hand-off time in frames (and reports exactly that gap): disabling the overlap fails
the 0-loss check.

Who wrote what is read from the messages table: every item carries the ``worker_id`` and the
``lease_epoch`` it was written under. One epoch is one owner, and the giver's items end at the
checkpoint its transfer wrote, where the taker's begin: the taker wrote nothing before it
owned, and nothing the giver had stored. Nothing here is timed: waits are bounded, and every
check is on what was stored.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import fleet_helpers
import pytest
from fleet_helpers import StoreDriver, WorkerProcess, wait_until

from wsfleet.rebalance import FleetView, Move
from wsfleet.upstream_options import parse_upstream_options

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

fleet, spawn, sim = fleet_helpers.fleet, fleet_helpers.spawn, fleet_helpers.sim

TIMING = fleet_helpers.HANDOFF_TIMING | {"REBALANCE_SECONDS": "3"}


def live_only(mode: str | None) -> Any:
    raw: dict[str, Any] = {"resume": "none"}
    if mode is not None:
        raw["handoff"] = mode
    return parse_upstream_options(raw, secret_prefixes=())


def owned(fleet: StoreDriver, ids: list[str], worker: WorkerProcess) -> list[str]:
    return [i for i in ids if fleet.record(i).lease_owner == worker.worker_id]


def missing_between(seqs: list[int]) -> list[int]:
    have = set(seqs)
    return [s for s in range(min(have), max(have) + 1) if s not in have]


def writers(items: list[dict[str, Any]]) -> dict[int, set[str]]:
    """epoch -> the worker ids that wrote items under it."""
    found: dict[int, set[str]] = {}
    for item in items:
        found.setdefault(int(item["lease_epoch"]), set()).add(str(item["worker_id"]))
    return found


def move_one(fleet: StoreDriver, ids: list[str], a: WorkerProcess, b: WorkerProcess) -> str:
    """A rebalancing plan (the reconciler's part, played here) moving one connection A -> B,
    made again until the move shows (A acts on a plan only within REBALANCE_SECONDS)."""
    b_item = wait_until(lambda: fleet.worker_item(b.worker_id), timeout=60, message=b.tail)
    planned_at = [0.0]

    def moved() -> str | None:
        if time.monotonic() - planned_at[0] > 2:
            now = int(time.time() * 1000)
            fleet.store.put_fleet_view(FleetView(
                at_ms=now, plan_at_ms=now, workers=2, held=len(ids), capacity=200,
                best_free=100, moves=(Move(a.worker_id, b.worker_id, 1),),
                targets={a.worker_id: len(ids) - 1, b.worker_id: 1},
                queues={b.worker_id: b_item.control_queue_url},
            ))  # fmt: skip
            planned_at[0] = time.monotonic()
        taken = owned(fleet, ids, b)
        return taken[0] if taken else None

    result: str = wait_until(moved, timeout=90, message=lambda: a.tail() + "\n---\n" + b.tail())
    return result


def advanced(fleet: StoreDriver, stream_id: str, frames: int) -> None:
    before = fleet.record(stream_id).last_seq
    wait_until(lambda: fleet.record(stream_id).last_seq >= before + frames, timeout=60)


@pytest.mark.parametrize("mode", ["overlap", "break"])
def test_a_live_only_stream_through_a_move_and_a_drain(fleet, spawn, sim, mode):
    ids = [f"live-{mode}-{i}" for i in range(2)]
    for stream_id in ids:
        sim.set_shape(stream_id, "live_only")
    # GIVEN worker A streaming two live-only connections, and a peer B
    a = spawn(**TIMING)
    for stream_id in ids:
        fleet.start(stream_id, sim.url_for(stream_id),
                    upstream=live_only(None if mode == "overlap" else mode))
    wait_until(
        lambda: len(owned(fleet, ids, a)) == len(ids)
        and all(fleet.record(i).last_seq >= 10 for i in ids),
        timeout=60, message=a.tail,
    )  # fmt: skip
    b = spawn(**TIMING)

    # WHEN a rebalancing move hands one to B
    moved = move_one(fleet, ids, a, b)
    advanced(fleet, moved, 10)
    # AND A drains on SIGTERM, handing the other to B
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.tail()
    wait_until(lambda: len(owned(fleet, ids, b)) == len(ids), timeout=60, message=b.tail)
    for stream_id in ids:
        advanced(fleet, stream_id, 10)
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.tail()

    transfers = {log["connection_id"]: log for log in a.logs("session transferred")}
    for stream_id in ids:
        record = fleet.record(stream_id)
        items = [item for item in fleet.stored(stream_id) if "seq" in item]
        seqs = sorted(int(item["seq"]) for item in items)
        lost = missing_between(seqs)
        # one owner per epoch, whatever the mode: nobody wrote under an epoch it did not hold
        assert all(len(ws) == 1 for ws in writers(items).values()), writers(items)
        if mode == "overlap":
            # THEN nothing was lost and no gap reported
            around = [(int(i["seq"]), i["worker_id"][-6:], int(i["lease_epoch"])) for i in items
                      if lost and abs(int(i["seq"]) - lost[0]) <= 3]
            assert lost == [], (stream_id, lost[:20], around, transfers.get(stream_id),
                                b.logs("prepared session adopted"))
            assert record.gap_frames == 0, record
            # AND ownership moved by a transfer, and each seq was written by one side only:
            # the giver up to the checkpoint it transferred, the taker above it
            transfer = transfers.get(stream_id)
            assert transfer is not None, a.tail(80)
            upto, epoch = int(transfer["last_seq"]), int(transfer["epoch"])
            givers = [int(i["seq"]) for i in items if int(i["lease_epoch"]) == epoch]
            takers = [int(i["seq"]) for i in items if int(i["lease_epoch"]) == epoch + 1]
            assert max(givers) == upto, (stream_id, upto, max(givers))
            assert min(takers) == upto + 1, (stream_id, upto, min(takers))
            assert writers(items)[epoch + 1] == {b.worker_id}
        else:
            # THEN the break reports exactly what it lost (at 20 frames/s a break as quick as
            # the frame interval may lose nothing; that a break loses frames where overlap
            # loses none is test_handoff_modes_bench's, at 100 frames/s)
            assert stream_id not in transfers
            assert record.gap_frames == len(lost), (record.gap_frames, len(lost))


# ----------------------------------------------------------------------------- fallbacks
def hand_decisions(worker: WorkerProcess, stream_id: str) -> list[str]:
    return [log["decision"] for log in worker.logs("hand-off decided")
            if log["connection_id"] == stream_id]


@pytest.mark.parametrize(
    ("upstream", "decisions"),
    [
        # the taker's session gets no frame (the upstream mutes sessions that open now): the
        # giver hears no READY and breaks after the bound, or (the two bounds end together)
        # first hears the taker's DECLINE for want of a frame
        pytest.param("no_frame", {"no_ready", "declined"}, id="taker-gets-no-frame"),
        # one session per account: the taker's handshake is refused (409), it DECLINEs
        pytest.param("one", {"declined"}, id="one-session-declined"),
        # a second session cuts the first: the giver's session ends while the taker connects.
        # It breaks at once, unless the taker's READY (whose frames start right above what
        # the giver stored) came first: then the transfer still loses nothing
        pytest.param("cut_first", {"giver_session_ended", "transfer"}, id="giver-session-cut"),
    ],
)
def test_fallbacks_break_and_report_what_a_live_only_stream_lost(
    fleet, spawn, sim, upstream, decisions
):
    stream_id = f"fallback-{upstream}"
    sim.set_shape(stream_id, "live_only")
    if upstream != "no_frame":
        sim.limit_sessions(stream_id, upstream)
    a = spawn(**TIMING)
    fleet.start(stream_id, sim.url_for(stream_id), upstream=live_only(None))
    wait_until(lambda: fleet.record(stream_id).last_seq >= 10, timeout=60, message=a.tail)
    b = spawn(**TIMING)
    wait_until(lambda: fleet.worker_item(b.worker_id), timeout=60, message=b.tail)
    if upstream == "no_frame":  # (sessions that open from now on: not the giver's)
        sim.mute_stream(stream_id, True)

    # WHEN A drains on SIGTERM with B as the named taker
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.tail()
    wait_until(lambda: fleet.record(stream_id).lease_owner == b.worker_id, timeout=60,
               message=b.tail)
    if upstream == "no_frame":  # the feed talks to B's session again
        sim.mute_stream(stream_id, False)
    advanced(fleet, stream_id, 10)
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.tail()

    # THEN the giver took the fallback the case calls for
    decided = hand_decisions(a, stream_id)
    assert len(decided) == 1 and decided[0] in decisions, (decided, a.tail(60))
    if upstream == "no_frame" and decided[0] == "declined":
        declined = [log["reason"] for log in a.logs("hand-off declined")]
        assert declined == ["no_frame"], declined
    # AND whatever was lost is reported exactly, and every epoch had one writer
    record = fleet.record(stream_id)
    items = [item for item in fleet.stored(stream_id) if "seq" in item]
    lost = missing_between(sorted(int(item["seq"]) for item in items))
    assert record.gap_frames == len(lost), (record.gap_frames, lost[:20])
    assert all(len(ws) == 1 for ws in writers(items).values()), writers(items)
    if decided[0] == "transfer":
        assert lost == []
    else:
        # (a break usually loses frames, but one as quick as the feed's frame interval may
        # not: what is lost is checked above, reported exactly, whatever it is)
        assert b.worker_id not in writers(items).get(int(a.logs("hand-off decided")[0]["epoch"]),
                                                     set())
