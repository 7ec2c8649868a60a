"""Every upstream session can be attributed to the worker that opened it (issue #26).

A worker logs one "upstream socket opened" line per upstream socket, before the handshake goes
out, with its end of the socket (``local``), the ``connection_id``, the ``epoch``, whether it
is a taker's ``prepared`` session, and its ``worker_id``. An upstream's access log shows the
same address as the client's: the simulator's session log (``peer``) here. Real workers on
the moto server hand a stream over (a SIGTERM drain, make-before-break), and every session the
upstream saw is matched to exactly one worker's line. Nothing here is timed: waits are
bounded, and the check is on the two logs.
"""

from __future__ import annotations

import signal
from datetime import datetime

import fleet_helpers
import pytest
from fleet_helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

fleet, spawn, sim = fleet_helpers.fleet, fleet_helpers.spawn, fleet_helpers.sim

TIMING = fleet_helpers.HANDOFF_TIMING


def logged_at(line: dict) -> float:
    return datetime.strptime(line["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z").timestamp()


def test_every_upstream_session_of_a_hand_off_is_named_by_its_workers_log(fleet, spawn, sim):
    stream_id = "attributed-1"
    # GIVEN worker A streaming a connection, and a peer B
    a = spawn(**TIMING)
    fleet.start(stream_id, sim.url_for(stream_id))
    wait_until(lambda: fleet.record(stream_id).last_seq >= 5, timeout=60, message=a.tail)
    giver_epoch = fleet.record(stream_id).lease_epoch
    b = spawn(**TIMING)
    wait_until(lambda: fleet.worker_item(b.worker_id), timeout=60, message=b.tail)

    # WHEN A drains on SIGTERM, handing the connection to B (make-before-break)
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.tail()
    wait_until(lambda: fleet.record(stream_id).lease_owner == b.worker_id, timeout=60,
               message=b.tail)  # fmt: skip

    # THEN every session the upstream saw is named by exactly one line, logged before the
    # session opened, with the client address the upstream logged
    lines = [
        (worker.worker_id, line)
        for worker in (a, b)
        for line in worker.logs("upstream socket opened")
        if line["connection_id"] == stream_id
    ]
    sessions = sim.sessions(stream_id)
    assert len(sessions) >= 2, sessions
    named = {}
    for session in sessions:
        matches = [
            (worker_id, line) for worker_id, line in lines
            if line["local"] == session.peer and logged_at(line) <= session.opened_at + 0.01
        ]  # fmt: skip
        assert len(matches) == 1, (session, lines)
        worker_id, line = matches[0]
        assert line["worker_id"] == worker_id
        named[session.session_id] = line
    # AND A's sessions are its own under its epoch; B's first is the prepared one, under the
    # giver's epoch (it owned nothing yet), opened while A's was still open (the overlap)
    first = named[sessions[0].session_id]
    assert (first["worker_id"], first["epoch"], first["prepared"]) == (a.worker_id, giver_epoch,
                                                                      False)  # fmt: skip
    prepared = [line for line in named.values() if line["prepared"]]
    assert [line["worker_id"] for line in prepared] == [b.worker_id], named
    assert prepared[0]["epoch"] == giver_epoch
    assert prepared[0]["peer"] == sim.url_for(stream_id).split("/")[2]
