"""The worker's connector applies the SSRF policy to resolved addresses and redirect hops.

Real WebSocket servers on loopback (127.0.0.1, and 127.0.0.2 as the "refused host", which
Linux answers on the whole 127/8 range); names are resolved by an injected resolver, so no
real DNS is involved. Every assertion is on what the servers actually saw.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from wsfleet.exceptions import UpstreamRefused
from wsfleet_worker.connector import make_connector

pytestmark = pytest.mark.integration


class Listener:
    """A loopback WebSocket server that records each handshake's Host header and sends one
    frame per accepted connection; optionally answers every handshake with a redirect."""

    def __init__(self, host: str, redirect_to: str | None = None) -> None:
        self.host = host
        self.redirect_to = redirect_to
        self.handshakes: list[str] = []
        self.accepted = 0

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.handshakes.append(request.headers.get("Host", ""))
        if self.redirect_to is None:
            return None
        response = connection.respond(http.HTTPStatus.FOUND, "moved\n")
        response.headers["Location"] = self.redirect_to
        return response

    async def handler(self, connection: ServerConnection) -> None:
        self.accepted += 1
        await connection.send("secret-from-" + self.host)

    def serve(self):
        return serve(self.handler, self.host, 0, process_request=self.process_request)


def port_of(server) -> int:
    return next(iter(server.sockets)).getsockname()[1]


def resolver_to(*answers: str):
    """A resolver that maps every name to ``answers`` and records what it was asked."""
    asked: list[str] = []

    async def resolve(host: str, port: int):
        asked.append(host)
        return [ipaddress.ip_address(a) for a in answers]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# ---------------------------------------------------------------- resolved addresses
def test_a_name_resolving_to_a_listed_address_connects_to_that_address_with_its_host_header():
    async def scenario():
        listener = Listener("127.0.0.1")
        async with listener.serve() as server:
            port = port_of(server)
            resolve = resolver_to("127.0.0.1")
            connect = make_connector(
                allowed_hosts=("feed.example", "127.0.0.1"), allow_insecure=True, resolver=resolve
            )
            ws = await connect(f"ws://feed.example:{port}/s1")
            try:
                frame = await ws.recv()
            finally:
                await ws.close()
            return listener, resolve.asked, frame, port

    listener, asked, frame, port = run(scenario())
    assert asked == ["feed.example"]  # one lookup; the socket went to its answer
    assert listener.handshakes == [f"feed.example:{port}"]  # the Host header keeps the name
    assert frame == "secret-from-127.0.0.1"


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::ffff:127.0.0.1", "an IPv6 form of 127.0.0.1"),
        ("10.0.0.1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
    ],
)
def test_a_listed_name_resolving_to_an_unlisted_private_address_is_refused(answer, needle):
    async def scenario():
        listener = Listener("127.0.0.1")
        async with listener.serve() as server:
            connect = make_connector(
                allowed_hosts=("feed.example",), allow_insecure=True, resolver=resolver_to(answer)
            )
            with pytest.raises(UpstreamRefused) as caught:
                await connect(f"ws://feed.example:{port_of(server)}/s1?token=s3cret")
            return listener, str(caught.value)

    listener, message = run(scenario())
    assert needle in message
    assert "s3cret" not in message
    assert listener.handshakes == [] and listener.accepted == 0  # nothing was opened


def test_the_url_itself_is_checked_with_the_worker_settings():
    connect = make_connector(allowed_hosts=("feed.example",), allow_insecure=False)
    with pytest.raises(UpstreamRefused, match="not in ALLOWED_UPSTREAM_HOSTS"):
        run(connect("wss://other.example/s1"))


# ---------------------------------------------------------------- redirects
def test_a_redirect_to_a_refused_host_is_not_followed():
    async def scenario():
        refused = Listener("127.0.0.2")
        async with refused.serve() as refused_server:
            allowed = Listener(
                "127.0.0.1", redirect_to=f"ws://127.0.0.2:{port_of(refused_server)}/s1?k=v"
            )
            async with allowed.serve() as allowed_server:
                connect = make_connector(allowed_hosts=("127.0.0.1",), allow_insecure=True)
                with pytest.raises(UpstreamRefused) as caught:
                    await connect(f"ws://127.0.0.1:{port_of(allowed_server)}/s1")
        return allowed, refused, str(caught.value)

    allowed, refused, message = run(scenario())
    assert len(allowed.handshakes) == 1
    assert refused.handshakes == [] and refused.accepted == 0
    assert "127.0.0.2 is not in ALLOWED_UPSTREAM_HOSTS" in message
    assert "k=v" not in message  # the target is shown without its query


def test_a_redirect_to_an_allowed_host_is_followed():
    async def scenario():
        target = Listener("127.0.0.2")
        async with target.serve() as target_server:
            first = Listener("127.0.0.1", redirect_to=f"ws://127.0.0.2:{port_of(target_server)}/s")
            async with first.serve() as first_server:
                connect = make_connector(
                    allowed_hosts=("127.0.0.1", "127.0.0.2"), allow_insecure=True
                )
                ws = await connect(f"ws://127.0.0.1:{port_of(first_server)}/s")
                try:
                    return await ws.recv()
                finally:
                    await ws.close()

    assert run(scenario()) == "secret-from-127.0.0.2"


def test_a_redirect_loop_stops_after_the_hop_limit():
    async def scenario():
        loop = Listener("127.0.0.1")
        async with loop.serve() as server:
            loop.redirect_to = f"ws://127.0.0.1:{port_of(server)}/again"
            connect = make_connector(allowed_hosts=("127.0.0.1",), allow_insecure=True)
            with pytest.raises(UpstreamRefused) as caught:
                await connect(f"ws://127.0.0.1:{port_of(server)}/start")
        return loop, str(caught.value)

    loop, message = run(scenario())
    assert "more than 3 redirects" in message
    assert len(loop.handshakes) == 4  # the original request and three followed hops


@pytest.mark.parametrize(
    ("location", "needle"),
    [
        ("http://127.0.0.1:{port}/s1?token=s3cret", "scheme must be wss or ws, got 'http'"),
        ("https://127.0.0.1:{port}/s1", "scheme must be wss or ws, got 'https'"),
        ("ws://127.0.0.1:{port}/s1#frag", "must not have a #fragment"),
        ("ws://127.0.0.1./s1", "must not end with a dot"),
        ("ws://[::1/s1", "not a valid"),
    ],
)
def test_a_redirect_to_a_target_websockets_cannot_parse_is_a_policy_refusal(location, needle):
    # Issue #23: websockets' own parser raised InvalidURI on such a Location, which the worker
    # took for its own ws_url being invalid (stop_reason invalid_ws_url, last_error empty).
    async def scenario():
        listener = Listener("127.0.0.1")
        async with listener.serve() as server:
            listener.redirect_to = location.format(port=port_of(server))
            connect = make_connector(allowed_hosts=("127.0.0.1",), allow_insecure=True)
            with pytest.raises(UpstreamRefused) as caught:
                await connect(f"ws://127.0.0.1:{port_of(server)}/start")
        return listener, str(caught.value)

    listener, message = run(scenario())
    assert message.startswith("redirect refused: ")
    assert needle in message
    assert "s3cret" not in message
    assert len(listener.handshakes) == 1 and listener.accepted == 0

