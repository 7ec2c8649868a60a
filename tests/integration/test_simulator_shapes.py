"""The simulator's stream shapes (header_auth, subscribe, live_only), driven by plain clients.

Nothing asserts on elapsed time: waits are bounded polls on the simulator's own state.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from bench.waiting import wait_until, wait_until_async
from wsfleet_local.simulator import (
    InvalidRequest,
    SimulatorClient,
    SimulatorThread,
    UpstreamSimulator,
    overlap_seconds,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = 200.0
WAIT = 10.0


async def recv_seq(ws: ClientConnection) -> int:
    async with asyncio.timeout(WAIT):
        return int(json.loads(await ws.recv())["seq"])


async def wait_for_seq(sim: UpstreamSimulator, stream: str, seq: int) -> None:
    sim.open_stream(stream)  # a no-op for a stream already running
    await wait_until_async(lambda: sim.current_seq(stream) >= seq, timeout=WAIT)


def test_header_auth_rejects_a_handshake_without_the_header_and_logs_what_it_got() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.set_shape("s", "header_auth", header="Authorization", value="Bearer t0k")
            with pytest.raises(InvalidStatus) as refused:
                async with connect(sim.url_for("s"), additional_headers={"Authorization": "x"}):
                    pass
            assert refused.value.response.status_code == 401
            assert sim.auth_rejects("s") == 1 and sim.sessions("s") == []
            async with connect(
                sim.url_for("s") + "?from_seq=1",
                additional_headers={"Authorization": "Bearer t0k", "X-Client": "acme"},
                subprotocols=["feed.v2", "feed.v1"],
            ) as ws:
                assert await recv_seq(ws) == 1
                assert ws.subprotocol == "feed.v2"
            record = sim.sessions("s")[0]
            assert record.headers["Authorization"] == "Bearer t0k"
            assert record.headers["X-Client"] == "acme"
            assert record.subprotocols == ("feed.v2", "feed.v1")

    asyncio.run(scenario())


def test_subscribe_waits_for_the_message_and_resumes_from_its_field() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.set_shape("s", "subscribe")
            await wait_for_seq(sim, "s", 20)
            async with connect(sim.url_for("s") + "?from_seq=1") as ws:  # the query is ignored
                await ws.send(json.dumps({"op": "subscribe", "from_seq": 7}))
                assert await recv_seq(ws) == 7
            async with connect(sim.url_for("s")) as ws:
                await ws.send('{"op": "subscribe", "from_seq": null}')
                first = await recv_seq(ws)
                assert first > 20  # null: live
            records = sim.sessions("s")
            assert records[0].from_seq == 7 and json.loads(records[0].subscribe or "")["op"]
            assert records[1].from_seq is None

    asyncio.run(scenario())


def test_subscribe_closes_1008_on_a_message_that_is_not_a_subscription() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.set_shape("s", "subscribe")
            async with connect(sim.url_for("s")) as ws:
                await ws.send("hello")
                async with asyncio.timeout(WAIT):
                    await ws.wait_closed()
                assert ws.close_code == 1008

    asyncio.run(scenario())


def test_live_only_ignores_from_seq_and_frames_nobody_heard_are_gone() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.set_shape("s", "live_only")
            await wait_for_seq(sim, "s", 30)
            async with connect(sim.url_for("s") + "?from_seq=1") as ws:
                assert await recv_seq(ws) > 30

    asyncio.run(scenario())


def test_shapes_over_http_control() -> None:
    with SimulatorThread(rate=FAST) as sim:
        client = SimulatorClient(sim.url)
        client.set_shape("s", "header_auth", header="X-Key", value="k1")
        info: dict[str, Any] = client.stream_info("s") if "s" in client.streams() else {}
        assert info == {}  # a shape alone does not open the stream
        client.open_stream("s")
        assert client.stream_info("s")["shape"] == "header_auth"
        assert client.auth_rejects("s") == 0
        client.set_shape("s", "plain")
        assert client.stream_info("s")["shape"] == "plain"


# --------------------------------------------------------------------------------------------
# Session limits: one session per account, or the newest cuts the first (issue #26)


def test_a_one_session_limit_refuses_a_second_handshake_until_the_first_is_gone() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.limit_sessions("s", "one")
            async with connect(sim.url_for("s")) as first:
                await recv_seq(first)
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(sim.url_for("s")):
                        pass
                assert refused.value.response.status_code == 409
                assert sim.limit_refusals("s") == 1
                assert sim.stream_info("s")["refused_handshakes"] == 1
            # the first session's TCP connection is gone: the next handshake is accepted
            await wait_until_async(lambda: not sim.open_sessions("s"), timeout=WAIT)
            async with connect(sim.url_for("s")) as second:
                await recv_seq(second)
            events = [(e.event, e.session_id) for e in sim.events("s")]
            assert events[:4] == [("open", 1), ("refused", 0), ("close", 1), ("open", 2)]
            assert sim.open_together("s") == []
            assert [e.n for e in sim.events("s")] == sorted(e.n for e in sim.events("s"))

    asyncio.run(scenario())


def test_a_one_session_limit_is_shared_by_the_streams_of_one_account() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.limit_sessions("a", "one", account="acct")
            sim.limit_sessions("b", "one", account="acct")
            sim.limit_sessions("c", "one")  # its own account
            async with connect(sim.url_for("a")) as ws_a, connect(sim.url_for("c")) as ws_c:
                await recv_seq(ws_a)
                await recv_seq(ws_c)
                with pytest.raises(InvalidStatus):
                    async with connect(sim.url_for("b")):
                        pass
            assert (sim.limit_refusals("a"), sim.limit_refusals("b")) == (0, 1)
            assert sim.limit_refusals("c") == 0

    asyncio.run(scenario())


def test_a_cut_first_limit_accepts_the_second_session_and_closes_the_first_1008() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.limit_sessions("s", "cut_first")
            async with connect(sim.url_for("s")) as first:
                await recv_seq(first)
                async with connect(sim.url_for("s")) as second:
                    await recv_seq(second)
                    async with asyncio.timeout(WAIT):
                        await first.wait_closed()
                    assert first.close_code == 1008
                    await recv_seq(second)  # the newer one streams on
                    assert [s.session_id for s in sim.open_sessions("s")] == [2]
            records = sim.sessions("s")
            assert records[0].faults == ("cut",) and records[0].close_code == 1008
            assert records[1].faults == ()
            events = [(e.event, e.session_id) for e in sim.events("s")]
            assert events[:4] == [("open", 1), ("open", 2), ("cut", 1), ("close", 1)]
            # the upstream saw both open for a moment, and says for how long
            assert sim.open_together("s") == [(1, 2)]
            ((older, newer, seconds),) = overlap_seconds(records)
            assert (older.session_id, newer.session_id) == (1, 2)
            assert 0 <= seconds <= records[0].closed_at - records[1].opened_at + 1e-9

    asyncio.run(scenario())


def test_a_live_only_stream_with_a_one_session_limit_combines_both() -> None:
    async def scenario() -> None:
        async with UpstreamSimulator(rate=FAST) as sim:
            sim.set_shape("s", "live_only")
            sim.limit_sessions("s", "one")
            await wait_for_seq(sim, "s", 30)
            async with connect(sim.url_for("s") + "?from_seq=1") as ws:
                assert await recv_seq(ws) > 30  # live only
                with pytest.raises(InvalidStatus):
                    async with connect(sim.url_for("s") + "?from_seq=1"):
                        pass
            info = sim.stream_info("s")
            assert (info["shape"], info["session_limit"]) == ("live_only", "one")
            sim.limit_sessions("s", "many")
            assert sim.stream_info("s")["session_limit"] == "many"

    asyncio.run(scenario())


def test_session_limits_and_the_event_log_over_http_control() -> None:
    with SimulatorThread(rate=FAST) as sim:
        client = SimulatorClient(sim.url)
        client.limit_sessions("s", "one")
        with pytest.raises(InvalidRequest):
            client.limit_sessions("s", "two")
        client.open_stream("s")
        assert client.stream_info("s")["session_limit"] == "one"

        async def two_handshakes() -> None:
            async with connect(sim.url_for("s")) as ws:
                await recv_seq(ws)
                with pytest.raises(InvalidStatus):
                    async with connect(sim.url_for("s")):
                        pass

        asyncio.run(two_handshakes())
        wait_until(lambda: not client.open_sessions("s"), timeout=WAIT)
        assert client.limit_refusals("s") == 1
        over_http = client.events("s")
        assert over_http == sim.events("s")
        assert [e.event for e in over_http] == ["open", "refused", "close"]
        assert client.open_together("s") == []


def test_the_simulators_doctests_hold() -> None:
    import doctest

    from wsfleet_local import simulator

    assert doctest.testmod(simulator).failed == 0


def test_a_muted_stream_sends_nothing_to_sessions_opened_meanwhile_until_unmuted() -> None:
    async def scenario() -> None:
        # (unbounded client queues: a client that stops reading could not see the close)
        async with (
            UpstreamSimulator(rate=FAST) as sim,
            connect(sim.url_for("s") + "?from_seq=1", max_queue=None) as giver,
        ):
            assert await recv_seq(giver) == 1
            sim.mute_stream("s", True)
            assert sim.stream_info("s")["muted"] is True
            async with connect(sim.url_for("s") + "?from_seq=5", max_queue=None) as taker:
                # the open session streams on while the new one gets nothing
                await wait_until_async(lambda: sim.sessions("s")[0].frames_sent >= 40, timeout=WAIT)
                await recv_seq(giver)
                assert sim.sessions("s")[1].frames_sent == 0
                assert sim.sessions("s")[1].faults == ("muted",)
                sim.mute_stream("s", False)
                assert await recv_seq(taker) == 5  # from where it would have started

    asyncio.run(scenario())


def test_a_hostile_frame_goes_to_every_session_open_when_armed_like_stream_content() -> None:
    async def scenario() -> None:
        async with (
            UpstreamSimulator(rate=FAST) as sim,
            connect(sim.url_for("s") + "?from_seq=1", max_queue=None) as giver,
            connect(sim.url_for("s") + "?from_seq=1", max_queue=None) as taker,
        ):
            await recv_seq(giver)
            await recv_seq(taker)
            sim.inject_hostile("s", "digits_seq")

            async def hostile_of(ws: ClientConnection) -> str:
                async with asyncio.timeout(WAIT):
                    while True:
                        frame = json.loads(await ws.recv())
                        if str(frame["data"]).startswith("hostile:"):
                            return str(frame["data"])

            # both subscribers get the same frame (same number), as from a real feed
            assert await hostile_of(giver) == await hostile_of(taker)
            giver_faults, taker_faults = (r.faults for r in sim.sessions("s"))
            assert giver_faults == taker_faults and giver_faults[0].startswith("hostile:")

    asyncio.run(scenario())
