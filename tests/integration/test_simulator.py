"""The upstream simulator, driven by plain websockets clients over loopback.

Every test starts its own simulator on port 0 and stops it before returning. Streams run at a
few hundred frames/s so the tests are quick; nothing asserts on elapsed time: waits are
bounded polls on the simulator's own state, and assertions are on sequence numbers, close
codes and the session log.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect as sync_connect

# The shared waits under this file's names: ``wait_until`` is awaited (the tests run inside the
# simulator's event loop), ``wait_until_sync`` polls from a plain thread.
from bench.waiting import wait_until as wait_until_sync, wait_until_async as wait_until
from wsfleet_local.simulator import (
    InvalidRequest,
    SessionRecord,
    SimulatorClient,
    SimulatorThread,
    StreamClock,
    UnknownStream,
    UpstreamSimulator,
    find_overlaps,
    first_frame_after,
    frame_data,
    hostile_frame_data,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: A WebSocket handshake request's headers, for a client that must not follow redirects.
UPGRADE_HEADERS = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}

FAST = 200.0  # frames/s: quick tests, still slow enough that "live" is distinguishable
WAIT = 10.0  # upper bound for any single wait; a healthy run never gets near it

_T = TypeVar("_T")


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(coro)


async def recv_json(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        return json.loads(await ws.recv())


async def recv_seqs(ws: ClientConnection, count: int) -> list[int]:
    return [(await recv_json(ws))["seq"] for _ in range(count)]


async def recv_until_closed(ws: ClientConnection) -> tuple[list[str], ConnectionClosed]:
    """Every message until the connection closes, and the exception that said so."""
    messages: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while True:
                messages.append(str(await ws.recv()))
    except ConnectionClosed as exc:
        return messages, exc
    raise AssertionError("unreachable")


def assert_frame(message: dict[str, Any], stream_id: str, seq: int) -> None:
    assert message == {"seq": seq, "data": frame_data(stream_id, seq)}


# -- sequence and resume ---------------------------------------------------------------------


def test_a_new_stream_starts_at_seq_1_and_advances() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            # GIVEN a stream nobody has seen / WHEN a client connects without from_seq
            async with connect(sim.url_for("fresh")) as ws:
                frames = [await recv_json(ws) for _ in range(5)]
            # THEN it gets 1, 2, 3, ... with deterministic content
            for seq, frame in enumerate(frames, start=1):
                assert_frame(frame, "fresh", seq)

    run(scenario())


def test_resume_replays_exactly_from_the_requested_seq() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.open_stream("s")
            await wait_until(lambda: sim.current_seq("s") >= 30)
            async with connect(sim.url_for("s") + "?from_seq=10") as ws:
                seqs = await recv_seqs(ws, 40)  # replayed, then live
            assert seqs == list(range(10, 50))
            await wait_until(lambda: not sim.open_sessions("s"))
            [record] = sim.sessions("s")
            assert (record.from_seq, record.first_seq_sent, record.gap) == (10, 10, 0)
            assert record.frames_sent >= 40
            assert record.last_seq_sent == record.first_seq_sent + record.frames_sent - 1

    run(scenario())


def test_the_sequence_advances_while_no_client_is_connected() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            async with connect(sim.url_for("s")) as ws:
                assert await recv_seqs(ws, 3) == [1, 2, 3]
            await wait_until(lambda: not sim.open_sessions("s"))
            at_disconnect = sim.current_seq("s")
            # WHEN nobody is connected for a while
            await wait_until(lambda: sim.current_seq("s") >= at_disconnect + 20)
            assert not sim.open_sessions("s")
            # THEN a client resuming from 4 gets every frame it missed, in order
            target = sim.current_seq("s") + 5
            async with connect(sim.url_for("s") + "?from_seq=4") as ws:
                seqs = await recv_seqs(ws, target - 3)
            assert seqs == list(range(4, target + 1))

    run(scenario())


def test_from_seq_older_than_the_buffer_starts_at_the_oldest_and_records_the_gap() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST, buffer_frames=5) as sim:
            sim.open_stream("s")
            await wait_until(lambda: sim.current_seq("s") >= 20)
            sim.open_stream("s", rate=0)  # freeze it so "oldest" is a fixed number
            current = sim.current_seq("s")
            async with connect(sim.url_for("s") + "?from_seq=2") as ws:
                seqs = await recv_seqs(ws, 5)
            assert seqs == list(range(current - 4, current + 1))
            [record] = sim.sessions("s")
            assert record.gap == (current - 4) - 2

    run(scenario())


def test_from_seq_in_the_future_waits_for_that_frame() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.open_stream("s")
            wanted = sim.current_seq("s") + 20
            async with connect(sim.url_for("s") + f"?from_seq={wanted}") as ws:
                assert await recv_seqs(ws, 2) == [wanted, wanted + 1]

    run(scenario())


# -- end of stream ---------------------------------------------------------------------------


def test_max_seq_ends_the_session_with_1000_after_the_last_frame() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.open_stream("s", max_seq=5)
            async with connect(sim.url_for("s") + "?from_seq=1") as ws:
                messages, closed = await recv_until_closed(ws)
            assert [json.loads(m)["seq"] for m in messages] == [1, 2, 3, 4, 5]
            assert closed.rcvd is not None and closed.rcvd.code == 1000

    run(scenario())


def test_end_stream_sends_what_is_owed_then_closes_1000() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            async with connect(sim.url_for("s")) as ws:
                await recv_seqs(ws, 2)
                sim.end_stream("s")
                last = sim.current_seq("s")
                messages, closed = await recv_until_closed(ws)
            seqs = [1, 2] + [json.loads(m)["seq"] for m in messages]
            assert seqs == list(range(1, last + 1))
            assert closed.rcvd is not None and closed.rcvd.code == 1000
            with pytest.raises(UnknownStream):
                sim.end_stream("never-seen")

    run(scenario())


# -- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "code"), [("close_normal", 1000), ("close_error", 1011)])
def test_close_faults_close_the_current_session_with_their_code(kind: str, code: int) -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            async with connect(sim.url_for("s")) as ws:
                await recv_json(ws)
                sim.inject_fault("s", kind)
                _, closed = await recv_until_closed(ws)
            assert closed.rcvd is not None and closed.rcvd.code == code
            await wait_until(lambda: not sim.open_sessions("s"))
            [record] = sim.sessions("s")
            assert (record.close_code, record.faults) == (code, (kind,))

    run(scenario())


def test_drop_aborts_the_connection_without_a_close_frame() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            async with connect(sim.url_for("s")) as ws:
                await recv_json(ws)
                sim.inject_fault("s", "drop")
                _, closed = await recv_until_closed(ws)
            assert isinstance(closed, ConnectionClosedError)
            assert closed.rcvd is None  # no close frame: the TCP connection just went away
            await wait_until(lambda: not sim.open_sessions("s"))
            assert sim.sessions("s")[0].close_code == "abort"

    run(scenario())


def test_a_fault_armed_while_nobody_is_connected_hits_the_next_session() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.inject_fault("s", "close_error")
            async with connect(sim.url_for("s")) as ws:
                _, closed = await recv_until_closed(ws)
            assert closed.rcvd is not None and closed.rcvd.code == 1011
            async with connect(sim.url_for("s")) as ws:  # one-shot: the next one is fine
                await recv_json(ws)

    run(scenario())


@pytest.mark.parametrize("kind", ["garbage", "noseq"])
def test_bad_frame_faults_send_one_bad_frame_then_continue(kind: str) -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            async with connect(sim.url_for("s")) as ws:
                await recv_json(ws)
                sim.inject_fault("s", kind)
                bad: list[str] = []
                seqs: list[int] = []
                async with asyncio.timeout(WAIT):
                    while len(seqs) < 10 or not bad:
                        text = str(await ws.recv())
                        try:
                            frame = json.loads(text)
                        except json.JSONDecodeError:
                            bad.append(text)
                            continue
                        if "seq" in frame:
                            seqs.append(frame["seq"])
                        else:
                            bad.append(text)
            assert len(bad) == 1
            is_json = kind == "noseq"
            assert bad[0].startswith("{") is is_json
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing lost around it

    run(scenario())


def test_reject_refuses_the_next_handshake_with_503_once() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.inject_fault("s", "reject")
            with pytest.raises(InvalidStatus) as refused:
                async with connect(sim.url_for("s")):
                    pass
            assert refused.value.response.status_code == 503
            assert sim.sessions("s") == []  # a refused handshake is not a session
            async with connect(sim.url_for("s")) as ws:
                await recv_json(ws)

    run(scenario())


def test_unknown_fault_kind_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown fault kind"):
        UpstreamSimulator().inject_fault("s", "explode")


# -- session log -----------------------------------------------------------------------------


def test_session_log_and_overlaps_for_two_concurrent_sessions() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            # GIVEN sessions A and B open at the same time, then C after both closed
            a = await connect(sim.url_for("s"))
            b = await connect(sim.url_for("s") + "?from_seq=1")
            await recv_json(a)
            await recv_json(b)
            assert len(sim.open_sessions("s")) == 2
            await a.close()
            await b.close()
            await wait_until(lambda: not sim.open_sessions("s"))
            both_closed = time.time()
            async with connect(sim.url_for("s")) as c:
                await recv_json(c)
            await wait_until(lambda: not sim.open_sessions("s"))

            rec_a, rec_b, rec_c = sim.sessions("s")
            # THEN the log says what each session did
            assert rec_a.from_seq is None and rec_b.from_seq == 1
            assert rec_b.first_seq_sent == 1
            assert len({rec_a.session_id, rec_b.session_id, rec_c.session_id}) == 3
            assert len({rec_a.peer, rec_b.peer}) == 2
            for record in (rec_a, rec_b, rec_c):
                assert record.close_code == 1000
                assert record.closed_at is not None and record.first_frame_at is not None
                assert record.opened_at <= record.first_frame_at <= record.closed_at
                assert record.frames_sent == record.last_seq_sent - record.first_seq_sent + 1
            # AND only A and B overlap; C is the first to stream after both closed
            pairs = sim.overlaps("s")
            assert [(x.session_id, y.session_id) for x, y in pairs] == [
                (rec_a.session_id, rec_b.session_id)
            ]
            assert sim.first_frame_at("s", after=both_closed) == rec_c.first_frame_at
            assert sim.first_frame_at("s", after=time.time()) is None

    run(scenario())


def test_stop_closes_open_sessions_with_1001() -> None:
    async def scenario() -> None:
        sim = UpstreamSimulator(rate=FAST)
        await sim.start()
        try:
            async with connect(sim.url_for("s")) as ws:
                await recv_json(ws)
                stopping = asyncio.create_task(sim.stop())
                _, closed = await recv_until_closed(ws)
                await stopping
        finally:
            await sim.stop()
        assert closed.rcvd is not None and closed.rcvd.code == 1001
        assert sim.sessions("s")[0].close_code == 1001

    run(scenario())


# -- from synchronous code and other processes ----------------------------------------------


def test_simulator_thread_works_from_sync_code() -> None:
    with SimulatorThread(rate=FAST) as sim:
        with sync_connect(sim.url_for("s")) as ws:
            first = json.loads(ws.recv(timeout=WAIT))
            sim.inject_fault("s", "drop")
            with pytest.raises(ConnectionClosedError):
                while True:
                    ws.recv(timeout=WAIT)
        assert_frame(first, "s", 1)
        wait_until_sync(lambda: not sim.open_sessions("s"))
        [record] = sim.sessions("s")
        assert record.close_code == "abort"
        assert sim.current_seq("s") >= record.last_seq_sent
        assert sim.overlaps("s") == []


def test_http_control_endpoints_through_simulator_client() -> None:
    with SimulatorThread(rate=FAST) as sim:
        client = SimulatorClient(sim.url)
        # open with a rate and an end
        info = client.open_stream("a b/c", rate=FAST, max_seq=3)  # id needs quoting
        assert (info["stream_id"], info["rate"], info["max_seq"]) == ("a b/c", FAST, 3)
        assert client.url_for("a b/c") == sim.url_for("a b/c")
        with sync_connect(client.url_for("a b/c") + "?from_seq=1") as ws:
            seqs = [json.loads(ws.recv(timeout=WAIT))["seq"] for _ in range(3)]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=WAIT)
        assert seqs == [1, 2, 3]
        assert client.current_seq("a b/c") == 3
        assert client.streams()["a b/c"]["ended"] is True

        # faults and end over HTTP
        client.inject_fault("s", "reject")
        assert client.streams().get("s") is None  # arming a fault does not start a stream
        with pytest.raises(InvalidStatus):
            sync_connect(client.url_for("s"))
        with sync_connect(client.url_for("s")) as ws:
            ws.recv(timeout=WAIT)
            assert client.stream_info("s")["open_sessions"] == 1
            assert [r.stream_id for r in client.open_sessions("s")] == ["s"]
            info = client.end_stream("s")
            assert info["ended"] is True
            with pytest.raises(ConnectionClosed):
                while True:
                    ws.recv(timeout=WAIT)
        wait_until_sync(lambda: not client.open_sessions("s"))

        # the session log, as records
        records = client.sessions("s")
        assert len(records) == 1 and isinstance(records[0], SessionRecord)
        assert records[0].close_code == 1000
        assert records[0].last_seq_sent == info["current_seq"]
        assert client.overlaps("s") == []
        assert client.first_frame_at("s", after=0) == records[0].first_frame_at
        assert {r.stream_id for r in client.sessions()} == {"a b/c", "s"}

        # errors map to domain errors
        with pytest.raises(UnknownStream):
            client.end_stream("never-seen")
        with pytest.raises(InvalidRequest):
            client.inject_fault("s", "explode")
        assert client.current_seq("never-seen") == 0


def test_hostile_frames_and_redirects_through_simulator_client() -> None:
    with SimulatorThread(rate=FAST) as sim:
        client = SimulatorClient(sim.url)
        # one-shot hostile frames go out first, then the stream continues where it was
        client.inject_hostile("h", "out_of_range_seq")
        client.inject_hostile("h", "max_size", size=3000)
        with sync_connect(client.url_for("h") + "?from_seq=1") as ws:
            raw = [ws.recv(timeout=WAIT) for _ in range(3)]
        bad, big, first = (json.loads(r) for r in raw)
        assert bad["seq"] == 2**53
        assert len(raw[1].encode()) == 3000 and "seq" not in big
        assert_frame(first, "h", 1)
        wait_until_sync(lambda: not client.open_sessions("h"))
        [record] = client.sessions("h")
        kinds = [f.split(":") for f in record.faults]
        assert [(k[1], int(k[3])) for k in kinds] == [("out_of_range_seq", 0), ("max_size", 3000)]
        # the label is enough to recompute what a worker must store
        assert big["data"] == hostile_frame_data("h", "max_size", int(kinds[1][2]), 3000)

        # a poisoned stream opens every session with an oversized frame: a 1009 for a client
        client.poison_stream("p", 5000)
        for _ in range(2):
            with (
                sync_connect(client.url_for("p"), max_size=4096) as ws,
                pytest.raises(ConnectionClosedError),
            ):
                ws.recv(timeout=WAIT)
        wait_until_sync(lambda: not client.open_sessions("p"))
        assert [r.close_code for r in client.sessions("p")] == [1009, 1009]

        # a creeping stream sends each session the one frame it owes next, then an oversized
        # one: the client's position moves on every session while it keeps closing 1009
        client.creep_stream("c", 5000)
        for from_seq in (1, 2):
            with sync_connect(client.url_for("c") + f"?from_seq={from_seq}", max_size=4096) as ws:
                assert json.loads(ws.recv(timeout=WAIT))["seq"] == from_seq
                with pytest.raises(ConnectionClosedError):
                    ws.recv(timeout=WAIT)
        wait_until_sync(lambda: not client.open_sessions("c"))
        assert [r.close_code for r in client.sessions("c")] == [1009, 1009]

        # a trickling stream starts a fragmented message on every session and never ends it
        client.trickle_stream("t", 0.01)
        with sync_connect(client.url_for("t")) as ws, pytest.raises(TimeoutError):
            ws.recv(timeout=0.3)  # bytes keep coming, the message never completes
        wait_until_sync(lambda: not client.open_sessions("t"))
        assert client.sessions("t")[0].faults == ("trickle",)
        with pytest.raises(InvalidRequest):
            client.trickle_stream("t", -1.0)

        # redirects over HTTP: every handshake answered 302, counted
        client.redirect_stream("r", "ws://127.0.0.2:9/r")
        # a plain HTTP client, which does not follow the redirect (websockets would)
        http_client = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=WAIT)
        http_client.request("GET", "/r", headers=UPGRADE_HEADERS)
        response = http_client.getresponse()
        response.read()  # to the end: a half-read response keeps the server waiting on stop
        http_client.close()
        assert (response.status, response.getheader("Location")) == (302, "ws://127.0.0.2:9/r")
        assert client.redirects_served("r") == 1
        with pytest.raises(InvalidRequest):
            client.inject_hostile("h", "explode")


def test_module_entry_point_prints_its_url_and_exits_0_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "wsfleet_local.simulator", "--port", "0", "--rate", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        url = json.loads(process.stdout.readline())["url"]
        assert url.startswith("ws://127.0.0.1:")
        with sync_connect(f"{url}/s") as ws:
            assert_frame(json.loads(ws.recv(timeout=WAIT)), "s", 1)
            process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=WAIT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert process.wait(timeout=WAIT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the pure core -----------------------------------------------------------------------------


def test_stream_clock_keeps_produced_frames_across_a_rate_change() -> None:
    clock = StreamClock(rate=10.0, anchor_time=100.0)
    assert [clock.current(t) for t in (100.0, 100.09, 100.1, 101.0)] == [0, 0, 1, 10]
    clock.set_rate(1.0, now=101.05)
    assert clock.current(101.05) == 10
    assert clock.due_at(11) == pytest.approx(102.05)
    clock.set_rate(0.0, now=150.0)  # paused: 10 + 48 frames at 1/s, then nothing
    assert clock.current(1e9) == 58 and clock.due_at(59) == float("inf")
    clock.set_max_seq(3, now=150.0)  # an end cannot un-produce frames
    assert clock.max_seq == 58 and clock.ended(150.0)


def test_overlap_and_failover_helpers_on_hand_made_records() -> None:
    def rec(sid: int, opened: float, closed: float | None, first: float | None) -> SessionRecord:
        return SessionRecord("s", sid, "p", None, opened, closed_at=closed, first_frame_at=first)

    a, b, c, d = rec(1, 0, 10, 1), rec(2, 10, 20, 11), rec(3, 15, None, 16), rec(4, 30, None, None)
    pairs = find_overlaps([d, c, b, a])
    assert [(x.session_id, y.session_id) for x, y in pairs] == [(2, 3), (3, 4)]
    assert first_frame_after([a, b, c, d], after=10) == 16
    assert first_frame_after([a, b, c, d], after=30) is None
    assert SessionRecord.from_dict(c.to_dict()) == c


# -- one control API: the same answers wherever the simulator runs ---------------------------


def test_each_operation_answers_alike_in_a_thread_and_over_http() -> None:
    with SimulatorThread(rate=FAST) as sim:
        client = SimulatorClient(sim.url)
        # GIVEN state set through both paths (a max_seq of 0 must travel: 0 is not "absent")
        assert client.open_stream("z", rate=0, max_seq=0)["max_seq"] == 0
        sim.set_shape("a", "header_auth", header="X-Key", value="k")
        client.inject_fault("a", "garbage")
        sim.redirect_stream("r", "ws://127.0.0.2:9/r")
        with sync_connect(client.url_for("s") + "?from_seq=1") as ws:
            ws.recv(timeout=WAIT)
            # paused, so its live session record stops changing between the two reads (at
            # 200/s a frame can be sent between them on a busy machine)
            client.open_stream("s", rate=0)
            # THEN every read agrees, session records included
            wait_until_sync(
                lambda: client.open_sessions("s") == sim.open_sessions("s") != []
                and client.sessions() == sim.sessions(),
                "the two paths' session records of a paused stream agree",
                timeout=WAIT,
            )
        wait_until_sync(lambda: not sim.open_sessions())
        # "s" produces at 200/s between the two reads: its current_seq is compared by a bound
        via_http, in_thread = client.streams(), sim.streams()
        s_http, s_thread = via_http.pop("s"), in_thread.pop("s")
        assert s_http.pop("current_seq") <= s_thread.pop("current_seq")
        assert s_http == s_thread and via_http == in_thread
        assert client.stream_info("z") == sim.stream_info("z")
        assert client.current_seq("z") == sim.current_seq("z") == 0
        assert client.stream_info("s")["shape"] == "plain"
        assert (client.auth_rejects("a"), client.redirects_served("r")) == (0, 0)
        assert client.overlaps("s") == sim.overlaps("s") == []
        # AND an error is the same domain error on both paths
        for control in (sim, client):
            with pytest.raises(UnknownStream):
                control.stream_info("never-seen")
            with pytest.raises(InvalidRequest, match="unknown shape"):
                control.set_shape("a", "nope")


def test_control_http_answers_unknown_paths_methods_and_bad_numbers_with_4xx() -> None:
    with SimulatorThread(rate=FAST) as sim:
        SimulatorClient(sim.url).open_stream("s")

        def ask(method: str, path: str) -> tuple[int, dict[str, Any]]:
            connection = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=WAIT)
            connection.request(method, path)
            response = connection.getresponse()
            body = json.loads(response.read())
            connection.close()
            return response.status, body

        assert ask("GET", "/_sim/nothing")[0] == 404
        assert ask("POST", "/_sim/streams")[0] == 404  # a GET-only path
        assert ask("PUT", "/_sim/streams")[0] == 405
        status, body = ask("POST", "/_sim/streams/s/open?rate=fast")
        assert status == 400 and "rate must be a number" in body["error"]
        assert ask("GET", "/_sim/sessions?open=true")[1] == {"sessions": []}


def test_module_entry_point_stops_on_stdin_eof_and_a_second_signal_forces_exit() -> None:
    from wsfleet_local.procs import spawn

    argv = [sys.executable, "-m", "wsfleet_local.simulator", "--rate", "50"]
    # GIVEN a simulator told to watch stdin: closing it is a graceful stop
    child = spawn("sim", [*argv, "--exit-on-stdin-eof"], stdin_pipe=True, capture_stdout=True)
    try:
        assert child.read_json_line(WAIT)["url"].startswith("ws://127.0.0.1:")
        child.close_stdin()
        assert child.wait(WAIT) == 0
    finally:
        child.stop()
    # GIVEN a client that never answers the closing handshake (the stop would wait for it)
    child = spawn("sim", argv, capture_stdout=True)
    try:
        port = int(child.read_json_line(WAIT)["url"].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw:
            headers = "".join(f"{k}: {v}\r\n" for k, v in UPGRADE_HEADERS.items())
            raw.sendall(f"GET /s HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
            received = raw.recv(4096)
            assert received.startswith(b"HTTP/1.1 101")
            # WHEN the first SIGTERM starts the stop (the server sends its close frame) ...
            child.send_signal(signal.SIGTERM)
            while b"\x88" not in received:  # a close frame; JSON text frames are ASCII
                chunk = raw.recv(4096)
                assert chunk, "closed without a close frame"
                received += chunk
            # ... AND a second one arrives while it waits for our answer
            os.kill(child.pid, signal.SIGTERM)
            # THEN the child exits at once, saying it was forced
            assert child.wait(WAIT) == 1
    finally:
        child.stop()
