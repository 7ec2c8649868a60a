"""The worker's upstream connection bounds what websockets leaves unbounded (issue #23, 2 and 3).

A raw asyncio server on 127.0.0.1 plays the upstream, so it can do what a websockets server
never would: keep TCP open after the worker's close frame, and trickle a message a byte at a
time while answering pings. The worker side is the real connector (``make_connector``). The
scenarios are bounded by a generous ``asyncio.wait_for`` only so that a regression fails
instead of hanging the suite; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from collections.abc import Awaitable, Callable

import pytest
from websockets.exceptions import ConnectionClosedError

from wsfleet_worker.connector import make_connector

pytestmark = pytest.mark.integration

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: Guards against a hang only (see the module docstring).
GUARD_SECONDS = 30


def frame(opcode: int, payload: bytes, *, fin: bool = True, length: int | None = None) -> bytes:
    """An unmasked server frame; ``length`` may claim more than ``payload`` holds."""
    size = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    if size < 126:
        head += bytes([size])
    elif size < 65536:
        head += bytes([126]) + struct.pack("!H", size)
    else:
        head += bytes([127]) + struct.pack("!Q", size)
    return head + payload


class RawUpstream:
    """Accepts one WebSocket handshake per connection, then runs ``script(reader, writer)``.
    It never closes TCP by itself and ignores every frame the client sends (close included)."""

    def __init__(
        self, script: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
    ) -> None:
        self.script = script
        self.client_frames: list[bytes] = []  # raw bytes the client sent after the handshake
        self.clients: list[str] = []  # "ip:port" of each client, as its request arrived
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        host, port = writer.get_extra_info("peername")[:2]
        self.clients.append(f"{host}:{port}")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        collect = asyncio.create_task(self._collect(reader))
        try:
            await self.script(reader, writer)
            await asyncio.sleep(GUARD_SECONDS)  # keep TCP open whatever the client sends
        finally:
            collect.cancel()
            writer.close()

    async def _collect(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(4096):
            self.client_frames.append(chunk)

    async def __aenter__(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/s1"


def connector(**limits: float | None):
    return make_connector(
        allowed_hosts=("127.0.0.1",), allow_insecure=True, ping_interval=None, **limits
    )


async def receive_until_closed(ws) -> list[str | bytes]:
    """What ``async for`` yields before the connection ends, as the session's loop does."""
    received: list[str | bytes] = []
    with pytest.raises(ConnectionClosedError):
        async for message in ws:
            received.append(message)
    return received


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, GUARD_SECONDS))


def test_the_workers_own_protocol_close_is_bounded_when_the_upstream_keeps_tcp_open():
    # GIVEN an upstream that sends one good message, then a frame over the worker's limit,
    # and never answers the close nor closes TCP (keepalive pings off: nothing else would end it)
    async def oversize(reader, writer):
        writer.write(frame(0x1, b"hello"))
        writer.write(frame(0x1, b"", length=4096))  # the header alone is enough to refuse it

    async def scenario():
        async with RawUpstream(oversize) as upstream:
            ws = await connector(max_frame_bytes=1024, close_timeout=0.2)(upstream.url)
            # WHEN the worker reads until the connection ends
            received = await receive_until_closed(ws)
            return upstream, ws, received

    upstream, ws, received = run(scenario())
    # THEN it ended: the close frame (1009) went out and the transport was aborted after the
    # close timeout, the good message first delivered
    assert received == ["hello"]
    assert ws.protocol.close_sent.code == 1009
    assert ws.protocol.close_rcvd is None
    assert ws.transport.is_closing()
    assert any(b"\x88" in chunk for chunk in upstream.client_frames)  # a close frame was sent


def test_a_fragmented_message_trickled_a_byte_at_a_time_fails_after_the_message_timeout():
    # GIVEN an upstream that starts a fragmented text message and adds one byte per tick,
    # forever, never closing TCP
    async def trickle(reader, writer):
        writer.write(frame(0x1, b"{", fin=False))
        while True:
            await asyncio.sleep(0.02)
            writer.write(frame(0x0, b" ", fin=False))

    async def scenario():
        async with RawUpstream(trickle) as upstream:
            connect = connector(message_timeout=0.5, close_timeout=0.2)
            ws = await connect(upstream.url)
            received = await receive_until_closed(ws)
            return ws, received

    ws, received = run(scenario())
    # THEN the worker failed the connection with 1008 "message timeout" and, the upstream
    # ignoring the close, aborted it
    assert received == []
    assert (ws.protocol.close_sent.code, ws.protocol.close_sent.reason) == (1008, "message timeout")
    assert ws.transport.is_closing()


def test_one_frame_trickled_a_byte_at_a_time_fails_after_the_message_timeout():
    # GIVEN an upstream that announces a 200-byte frame and sends its payload a byte per tick
    async def trickle(reader, writer):
        writer.write(frame(0x1, b"", length=200))
        while True:
            await asyncio.sleep(0.02)
            writer.write(b"x")

    async def scenario():
        async with RawUpstream(trickle) as upstream:
            ws = await connector(message_timeout=0.5, close_timeout=0.2)(upstream.url)
            return ws, await receive_until_closed(ws)

    ws, received = run(scenario())
    # THEN the same bound applies
    assert received == []
    assert ws.protocol.close_sent.code == 1008


def test_messages_that_complete_are_never_timed_out_however_slow_the_stream():
    # GIVEN an upstream that sends complete messages (some fragmented) with pauses longer than
    # the message timeout between them, then closes normally
    async def slow_but_whole(reader, writer):
        for n in range(3):
            writer.write(frame(0x1, b"part", fin=False) + frame(0x0, f"-{n}".encode()))
            await asyncio.sleep(0.4)
        writer.write(frame(0x8, struct.pack("!H", 1000)))

    async def scenario():
        async with RawUpstream(slow_but_whole) as upstream:
            ws = await connector(message_timeout=0.2, close_timeout=0.2)(upstream.url)
            received = [message async for message in ws]
            return ws, received

    ws, received = run(scenario())
    # THEN every message arrived, and the connection ended by the upstream's close (the
    # worker echoed it; TCP still open, the close timeout ended it)
    assert received == ["part-0", "part-1", "part-2"]
    assert ws.protocol.close_rcvd.code == 1000
    assert ws.protocol.close_sent.code == 1000


def test_the_workers_close_completes_its_handshake_when_it_stopped_reading_a_busy_stream():
    # GIVEN an upstream (a websockets server, which answers a close at once) that sends far
    # more messages than websockets queues unread (max_queue), then waits for the worker's close
    from websockets.asyncio.server import serve

    async def busy(server_ws):
        for n in range(2000):
            await server_ws.send(f'{{"seq": {n + 1}, "pad": "{"x" * 200}"}}')
        await server_ws.wait_closed()

    async def scenario():
        async with serve(busy, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            ws = await connector(close_timeout=GUARD_SECONDS / 3)(f"ws://127.0.0.1:{port}/s1")
            first = await ws.recv()
            # WHEN the worker stops reading (the session's reader is cancelled once the
            # queue of unread messages made websockets pause the socket) and closes
            while not ws.recv_messages.paused:  # noqa: ASYNC110 (websockets has no event for it)
                await asyncio.sleep(0.01)
            await ws.close(1001)
            return ws, first

    ws, first = run(scenario())
    # THEN the upstream's close frame was read: the handshake completed, not the timeout's
    # abort (before, the paused socket never delivered it and close() ran to close_timeout)
    assert first.startswith('{"seq": 1,')
    assert ws.protocol.close_sent.code == 1001
    assert ws.protocol.close_rcvd is not None
    assert ws.protocol.close_rcvd.code == 1001


def test_the_socket_is_reported_before_the_handshake_with_the_address_the_upstream_sees():
    # GIVEN an upstream that notes each client's address when its handshake request arrives
    # (as an access log does)
    async def quiet(reader, writer):
        pass

    reported: list[tuple[str, str, int]] = []

    async def scenario():
        async with RawUpstream(quiet) as upstream:
            # WHEN the worker connects with a socket observer
            ws = await connector()(
                upstream.url,
                on_socket=lambda local, peer: reported.append(
                    (local, peer, len(upstream.clients))
                ),
            )
            await ws.close()
            return upstream

    upstream = run(scenario())
    # THEN it was told once, before the upstream had the request, the address the upstream
    # logs as the client's, and the upstream's own
    ((local, peer, requests_before),) = reported
    assert requests_before == 0
    assert upstream.clients == [local]
    assert peer == f"127.0.0.1:{upstream.port}"
