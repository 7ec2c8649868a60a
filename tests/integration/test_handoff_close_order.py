"""Break-before-make hand-offs close before they release (issue #26, item 3).

These connections ask for ``upstream.handoff: break`` (the mode for an upstream that allows
one session per account); make-before-break, the default, overlaps the two sessions on
purpose (tests/integration/test_handoff_overlap.py).

An upstream that allows one session per account refuses (or cuts) the taker if the giver's
session is still open when the taker connects. So on every planned hand-off (a rebalancing
move, a SIGTERM drain) the giver's closing handshake must be over, or its transport aborted,
before the release write that lets the taker acquire.

The upstream here is slow to complete a close: it processes what a client sends only
``close_delay`` seconds after it arrives, as a remote or loaded upstream would: within the
giver's close bound (the close completes) or beyond it (the giver aborts the transport). A
giver that released while its close was still in flight would let the taker connect well
within that delay, and the upstream's event log would show the taker's session opening
before the giver's closed. The check is the order of the upstream's own open and close
events (recorded on its event loop, at the handshake and at ``connection_lost``): never two
sessions of one stream open at once. Nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
import urllib.parse
from typing import Any

import fleet_helpers
import pytest
from fleet_helpers import StoreDriver, WorkerProcess, check_stream, wait_until
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from wsfleet.rebalance import FleetView, Move
from wsfleet.upstream_options import parse_upstream_options

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

fleet, spawn = fleet_helpers.fleet, fleet_helpers.spawn

#: Frames per second per session.
RATE = 10.0
#: The giver waits for a close up to a heartbeat, websockets' close_timeout (2 s) within it:
#: long enough here for the slow close to complete rather than be aborted.
TIMING = {
    "LEASE_SECONDS": "8",
    "HEARTBEAT_EVERY": "2",
    "LEASE_SAFETY_MARGIN_SECONDS": "2",
    "REBALANCE_SECONDS": "3",
}


BREAK = parse_upstream_options({"handoff": "break"}, secret_prefixes=())


class _SlowClosingConnection(ServerConnection):
    """Acts on client bytes only ``delay`` seconds after they arrive (once open), and
    reports the moment its socket is gone."""

    delay = 0.0
    on_lost: Any = None

    def data_received(self, data: bytes) -> None:
        if self.protocol.state is not State.OPEN:
            super().data_received(data)
            return
        self.loop.call_later(self.delay, self._late_data, data)

    def _late_data(self, data: bytes) -> None:
        if not self.transport.is_closing():
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost()


class OrderedUpstream(fleet_helpers.UpstreamThread):
    """A replaying upstream (``?from_seq=N``; frames ``{"seq": n, "data": "<id>:<n>"}``) on a
    daemon thread, logging ``(event, stream, session)`` in the order its loop saw them."""

    def __init__(self, close_delay: float) -> None:
        connection = type(
            "SlowClosingConnection", (_SlowClosingConnection,), {"delay": close_delay}
        )
        super().__init__(
            self._stream, create_connection=connection, compression=None, ping_interval=None
        )
        self.events: list[tuple[str, str, int]] = []
        self._ids = itertools.count(1)

    def of(self, stream_id: str) -> list[tuple[str, int]]:
        return [(event, session) for event, sid, session in list(self.events) if sid == stream_id]

    async def _stream(self, ws: ServerConnection) -> None:
        assert isinstance(ws, _SlowClosingConnection) and ws.request is not None
        path, _, query = ws.request.path.partition("?")
        stream_id = path.strip("/")
        session = next(self._ids)
        self.events.append(("open", stream_id, session))
        ws.on_lost = lambda: self.events.append(("close", stream_id, session))
        if ws.state is State.CLOSED:  # lost before the hook was set
            self.events.append(("close", stream_id, session))
            return
        from_seq = urllib.parse.parse_qs(query).get("from_seq", ["1"])[0]
        with contextlib.suppress(ConnectionClosed):
            for seq in itertools.count(max(1, int(from_seq))):
                await ws.send(json.dumps({"seq": seq, "data": f"{stream_id}:{seq}"}))
                await asyncio.sleep(1 / RATE)


def _never_two_open(events: list[tuple[str, int]]) -> list[str]:
    """Where the upstream had two sessions of the stream open at once (in its own order)."""
    open_now: set[int] = set()
    problems = []
    for event, session in events:
        if event == "open":
            if open_now:
                problems.append(f"session {session} opened while {sorted(open_now)} still open")
            open_now.add(session)
        else:
            open_now.discard(session)
    return problems


def _owned(fleet: StoreDriver, ids: list[str], worker: WorkerProcess) -> list[str]:
    return [i for i in ids if fleet.record(i).lease_owner == worker.worker_id]


@pytest.mark.parametrize(
    "close_delay",
    [
        pytest.param(1.5, id="close-completes"),  # within the giver's 2 s bound
        pytest.param(4.0, id="close-aborted-at-the-deadline"),  # beyond it: the giver aborts
    ],
)
def test_rebalancing_and_drain_close_the_givers_session_before_the_taker_opens(
    fleet, spawn, close_delay
):
    ids = [f"order{i}" for i in range(4)]
    with OrderedUpstream(close_delay) as upstream:
        # GIVEN one worker streaming four connections from an upstream slow to close
        a = spawn(**TIMING)
        for stream_id in ids:
            fleet.start(stream_id, upstream.url(stream_id), upstream=BREAK)
        wait_until(
            lambda: len(_owned(fleet, ids, a)) == len(ids)
            and all(fleet.record(i).last_seq >= 5 for i in ids),
            timeout=60, message=a.tail,
        )  # fmt: skip
        b = spawn(**TIMING)
        b_item = wait_until(lambda: fleet.worker_item(b.worker_id), timeout=60, message=b.tail)

        # WHEN a rebalancing plan (the reconciler's part, played here) moves two to B
        def plan() -> None:
            now = int(time.time() * 1000)
            fleet.store.put_fleet_view(FleetView(
                at_ms=now, plan_at_ms=now, workers=2, held=len(ids), capacity=200, best_free=100,
                moves=(Move(a.worker_id, b.worker_id, 2),),
                targets={a.worker_id: 2, b.worker_id: 2},
                queues={b.worker_id: b_item.control_queue_url},
            ))  # fmt: skip

        # A acts on a plan only within REBALANCE_SECONDS of its making, and a loaded machine
        # may delay its read past that: the plan is made again until the moves show. A giver
        # never gives below its target, so a plan made again after it gave moves nothing more.
        planned_at = [0.0]

        def moved_to_b() -> list[str] | None:
            if time.monotonic() - planned_at[0] > 2:
                plan()
                planned_at[0] = time.monotonic()
            owned = _owned(fleet, ids, b)
            return owned if len(owned) == 2 else None

        moved = wait_until(moved_to_b, timeout=60, message=lambda: a.tail() + "\n---\n" + b.tail())
        for stream_id in moved:
            assert fleet.record(stream_id).rebalanced_at_ms is not None
        # AND then A drains on SIGTERM, handing the other two to B
        wait_until(lambda: all(len(upstream.of(i)) >= 3 for i in moved), timeout=60)
        a.signal(signal.SIGTERM)
        assert a.wait(60) == 0, a.tail()
        wait_until(
            lambda: len(_owned(fleet, ids, b)) == len(ids)
            and all(len(upstream.of(i)) >= 3 for i in ids),
            timeout=60, message=b.tail,
        )  # fmt: skip

        # THEN every stream moved once, and the upstream never had two of its sessions open
        for stream_id in ids:
            events = upstream.of(stream_id)
            assert [e for e, _ in events].count("open") == 2, (stream_id, events)
            assert _never_two_open(events) == [], (stream_id, events)
        # AND the final checkpoints lost nothing (the taker resumed from them)
        b.signal(signal.SIGTERM)
        assert b.wait(60) == 0, b.tail()
        for stream_id in ids:
            upto = fleet.record(stream_id).last_seq
            check = check_stream(fleet.stored(stream_id), stream_id, upto)
            assert check.ok, (stream_id, check)
