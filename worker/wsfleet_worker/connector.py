"""Opening upstream WebSocket connections cheaply.

A worker holds thousands of connections, so per-connection costs matter more than features:

* ``compression=None``: a permessage-deflate context costs hundreds of KB per connection.
* one shared TLS context for every ``wss://`` connection (asyncio would otherwise build, and
  load the CA bundle into, a new one per connection).
* ``max_queue`` small: frames are handed to the write queue at once, so a deep per-connection
  buffer only adds memory. ``max_size`` bounds one frame (DynamoDB items are <= 400 KB).
* ``write_limit`` small: the worker sends nothing but pongs and close frames.

SSRF guard (issue #11). The router judged the URL text; the worker judges what it leads to:

* every 3xx hop, through websockets' own ``process_redirect`` hook: a hop must pass
  :func:`wsfleet.upstream_url.validate_redirect` (the router's rules with the worker's
  ``ALLOWED_UPSTREAM_HOSTS`` / ``ALLOW_INSECURE_WS``, at most ``MAX_REDIRECTS`` hops). websockets
  itself also refuses ``wss`` to ``ws`` even when insecure URLs are allowed, which is stricter;
* every address the host resolves to, through the ``open_tcp_connection`` hook: the resolver
  (injectable, for tests) answers once, :func:`wsfleet.upstream_url.refused_resolution_reason`
  checks all answers, and the socket is opened to a checked *address*, so there is no second
  lookup a rebinding DNS server could answer differently. TLS still verifies the certificate
  against the original name (``server_hostname``, which also sets SNI) and the ``Host`` header
  still names it. Environment proxies (``HTTPS_PROXY``) are not used: through a proxy the
  proxy resolves the name and nothing here could check it.
* connects to one host that overlap (a take-over of a hundred connections to one feed) share
  one lookup (:func:`shared_lookups`): getaddrinfo runs on asyncio's default executor, a
  handful of threads, where a burst of identical lookups would queue one per connection.
  Nothing is cached: the next connect looks up again.

Handshake options (issue #13): extra headers and subprotocols go into the opening handshake.
A connect carrying a credential (``origin_locked``) additionally refuses a redirect to another
origin (scheme, host or port): websockets sends the same headers to the redirect target, so
following it would hand the secret to whoever the upstream points at. The guard's own checks
apply to every connect and every hop whatever the options.

Attribution: ``on_socket(local, peer)``, if given, is called with the socket's two addresses
(``ip:port``, :func:`socket_address`) as soon as the TCP connection is open, before the
opening handshake is sent, so a worker can log its end of the socket before the upstream sees
the session: the client address in an upstream's access log then names the worker (and the
connection) that opened it, with no header telling the upstream anything about the fleet.

A refusal raises :class:`wsfleet.exceptions.UpstreamRefused`.

Errors: :func:`is_permanent` separates URLs that can never work from transient failures.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from typing import Any
from urllib.parse import urljoin

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, InvalidURI

from wsfleet.exceptions import InvalidUpstreamUrl, UpstreamRefused
from wsfleet.upstream_url import (
    redact_url,
    refused_resolution_reason,
    validate_redirect,
    validate_ws_url,
)

from .handshake import same_origin
from .upstream_connection import bounded_connection

__all__ = [
    "Connector",
    "Resolver",
    "describe_error",
    "is_permanent",
    "make_connector",
    "shared_lookups",
    "socket_address",
    "system_resolver",
]

#: ``connect(url, *, headers=(), subprotocols=(), origin_locked=False, on_socket=None)``.
Connector = Callable[..., Awaitable[ClientConnection]]
#: ``on_socket(local, peer)``: a TCP connection to the upstream is open (see the module doc).
SocketOpened = Callable[[str, str], None]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: ``resolve(host, port) -> addresses``; injectable so tests never touch real DNS.
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to (deduplicated, resolver order), via getaddrinfo.

    >>> asyncio.run(system_resolver("127.0.0.1", 80))
    [IPv4Address('127.0.0.1')]
    """
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        # getaddrinfo gives "fe80::1%eth0" for scoped answers; the scope does not change
        # what the policy thinks of the address (link-local is refused either way).
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in found:
            found.append(address)
    return found


def shared_lookups(resolve: Resolver) -> Resolver:
    """``resolve``, with the lookups of one ``(host, port)`` that overlap done once.

    A connect that asks while a lookup of its name is out waits for that answer instead of
    queueing one of its own. The answer is not kept: a lookup asked after it came back goes
    out again (no cache to go stale, no answer reused past its DNS TTL). A failed lookup fails
    every connect that waited for it. One connect cancelled while waiting does not cancel the
    lookup the others wait for.
    """
    pending: dict[tuple[str, int], asyncio.Future[Sequence[IPAddress]]] = {}

    async def lookup(host: str, port: int) -> Sequence[IPAddress]:
        key = (host.lower(), port)
        answer = pending.get(key)
        if answer is None:
            answer = asyncio.ensure_future(resolve(host, port))
            pending[key] = answer
            answer.add_done_callback(lambda _done: pending.pop(key, None))
        return await asyncio.shield(answer)

    return lookup


class _GuardedConnect(connect):
    """websockets' ``connect`` with the SSRF checks in its two hooks (see the module doc)."""

    def __init__(
        self,
        url: str,
        *,
        resolver: Resolver,
        allowed_hosts: tuple[str, ...],
        allow_insecure: bool,
        origin_locked: bool = False,
        on_socket: SocketOpened | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, proxy=None, **kwargs)
        self._resolver = resolver
        self._allowed_hosts = allowed_hosts
        self._allow_insecure = allow_insecure
        self._origin = url if origin_locked else None
        self._on_socket = on_socket
        self._hops = 0

    def process_redirect(self, exc: Exception) -> Exception | str:
        response = exc.response if isinstance(exc, InvalidStatus) else None
        location = response.headers.get("Location") if response is not None else None
        if response is None or response.status_code not in _REDIRECTS or location is None:
            return exc  # not a redirect: websockets raises it as the handshake error
        self._hops += 1
        # Judged before websockets parses it: its parser raises InvalidURI on an http:// or
        # malformed target, which would end the connection as an invalid ws_url with no rule
        # in last_error, though the stored ws_url is fine and the upstream is what misbehaved.
        try:
            target = urljoin(self.uri, location)
        except ValueError:
            return UpstreamRefused("redirect refused: the Location header is not a valid URL")
        try:
            validate_redirect(
                self.uri,
                target,
                hop=self._hops,
                allowed_hosts=self._allowed_hosts,
                allow_insecure=self._allow_insecure,
            )
        except InvalidUpstreamUrl as refusal:
            return UpstreamRefused(f"{refusal} (to {redact_url(target)})")
        if self._origin is not None and not same_origin(self._origin, target):
            return UpstreamRefused(
                "redirect refused: a connection carrying a credential is not redirected to "
                f"another origin (to {redact_url(target)})"
            )
        try:
            outcome = super().process_redirect(exc)
        except (InvalidURI, ValueError) as refusal:  # defensive: our check already passed it
            return UpstreamRefused(f"redirect refused: {describe_error(refusal)}")
        if isinstance(outcome, Exception):  # websockets' own refusal (e.g. a TLS downgrade)
            return UpstreamRefused(f"redirect refused: {describe_error(outcome)}")
        return outcome

    async def open_tcp_connection(self) -> ClientConnection:
        host, port = self.ws_uri.host, self.ws_uri.port
        try:
            address: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            address = None
        found = [address] if address is not None else list(await self._resolver(host, port))
        reason = refused_resolution_reason(host, found, allowed_hosts=self._allowed_hosts)
        if reason:
            raise UpstreamRefused(f"address refused: {reason}")
        kwargs = self.create_connection_kwargs.copy()
        if self.ws_uri.secure:
            kwargs.setdefault("ssl", True)
            # Certificate verification and SNI use the name, though the socket goes to an address.
            kwargs["server_hostname"] = host
        loop = asyncio.get_running_loop()
        last: OSError | None = None
        for checked in found:  # every one passed; try them in the resolver's order
            try:
                _, connection = await loop.create_connection(
                    lambda: self.factory(self.ws_uri), host=str(checked), port=port, **kwargs
                )
            except OSError as exc:
                last = exc
                continue
            if self._on_socket is not None:  # (every hop: each is a session the upstream sees)
                transport = connection.transport
                self._on_socket(socket_address(transport.get_extra_info("sockname")),
                                socket_address(transport.get_extra_info("peername")))  # fmt: skip
            return connection
        assert last is not None  # found is never empty: the policy refuses an empty answer
        raise last


#: The statuses websockets follows as redirects (``connect.process_redirect``).
_REDIRECTS = frozenset({300, 301, 302, 303, 307, 308})

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


@cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def make_connector(
    *,
    max_frame_bytes: int = 393_216,
    max_queue: int = 4,
    open_timeout: float = 10.0,
    ping_interval: float | None = 20.0,
    close_timeout: float = 2.0,
    message_timeout: float | None = None,
    allowed_hosts: tuple[str, ...],
    allow_insecure: bool,
    resolver: Resolver = system_resolver,
) -> Connector:
    """A coroutine function ``connect(url) -> ClientConnection`` with wsfleet's limits.

    ``allowed_hosts`` / ``allow_insecure`` are the worker's ``ALLOWED_UPSTREAM_HOSTS`` /
    ``ALLOW_INSECURE_WS``; they are required so no caller gets a connector without the guard.
    The URL itself, every redirect hop and every resolved address are checked against them;
    a refusal raises :class:`~wsfleet.exceptions.UpstreamRefused`. ``close_timeout`` bounds
    every closing handshake, and ``message_timeout`` an incomplete message
    (:mod:`~wsfleet_worker.upstream_connection`).

    Example::

        connect = make_connector(allowed_hosts=("feed.example",), allow_insecure=False)
        ws = await connect("wss://feed.example/v1?token=...")
    """

    # websockets logs every handshake header (and the request path, query included) at DEBUG;
    # a credential rides in them (issue #13), so that logger never goes below INFO, whatever
    # the worker's log level.
    client_log = logging.getLogger("websockets.client")
    client_log.setLevel(max(client_log.getEffectiveLevel(), logging.INFO))
    connection_class = bounded_connection(message_timeout)
    resolver = shared_lookups(resolver)

    async def open_connection(
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        subprotocols: Sequence[str] = (),
        origin_locked: bool = False,
        on_socket: SocketOpened | None = None,
    ) -> ClientConnection:
        try:
            validate_ws_url(url, allowed_hosts=allowed_hosts, allow_insecure=allow_insecure)
        except InvalidUpstreamUrl as exc:
            # The router checked this URL against its own settings; the worker's may differ
            # (or the record was written by something else), and the worker is the one that
            # connects.
            raise UpstreamRefused(f"url refused: {exc}") from None
        options: dict[str, Any] = {}
        if url.lower().startswith("wss:"):
            options["ssl"] = _tls_context()
        if headers:
            options["additional_headers"] = list(headers)
        if subprotocols:
            options["subprotocols"] = list(subprotocols)
        return await _GuardedConnect(
            url,
            resolver=resolver,
            allowed_hosts=allowed_hosts,
            allow_insecure=allow_insecure,
            origin_locked=origin_locked,
            on_socket=on_socket,
            compression=None,
            max_size=max_frame_bytes,
            max_queue=max_queue,
            write_limit=4096,
            open_timeout=open_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_interval,
            close_timeout=close_timeout,
            create_connection=connection_class,
            user_agent_header="wsfleet-worker",
            **options,
        )

    return open_connection


def socket_address(address: Any) -> str:
    """A socket address as an access log shows it: ``ip:port`` (``[ip]:port`` for IPv6).

    >>> socket_address(("127.0.0.1", 50123)), socket_address(("::1", 443, 0, 0))
    ('127.0.0.1:50123', '[::1]:443')
    """
    if isinstance(address, tuple) and len(address) >= 2:
        host = str(address[0])
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address)


def is_permanent(exc: BaseException) -> bool:
    """True for connect failures that retrying cannot fix (a malformed ``ws_url``)."""
    return isinstance(exc, (InvalidURI, ValueError)) and not isinstance(exc, OSError)


def describe_error(exc: BaseException) -> str:
    """A short description for logs and ``last_error``; URLs in it are redacted.

    >>> describe_error(ValueError("wss://u:pw@h/s?token=x isn't valid"))
    "ValueError: wss://h/s?token=*** isn't valid"
    """
    text = _URL.sub(lambda m: redact_url(m.group(0)), str(exc))
    return f"{type(exc).__name__}: {text}"[:300]
