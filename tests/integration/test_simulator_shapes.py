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

from bench.waiting import wait_until_async
from wsfleet_local.simulator import SimulatorClient, SimulatorThread, UpstreamSimulator

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
