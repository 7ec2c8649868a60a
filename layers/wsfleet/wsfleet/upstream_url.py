"""Upstream URL rules: which ``ws_url`` the API accepts, and how one is shown without its secrets.

The router stores whatever ``ws_url`` a START names, and a worker later opens a socket to it
from inside the VPC. Without a check, the API would be a server-side request forgery (SSRF)
gadget: ``ws://169.254.169.254/...`` or ``ws://10.0.0.5:6379`` would make a worker connect to
the instance metadata service or an internal host. :func:`validate_ws_url` refuses such URLs
before anything is written.

What it checks (each refusal is an :class:`InvalidUpstreamUrl` whose message names the problem):

* at most :data:`MAX_URL_LENGTH` printable ASCII characters (IDN hosts in punycode form);
* scheme ``wss`` (``ws`` only with ``allow_insecure``), a host, a valid port, no fragment
  (RFC 6455 forbids one) and no ``user:password@`` (URLs are logged and shown; credentials
  must not sit in them);
* the host is a DNS name made of ``[a-z0-9_-]`` labels, or a canonical IP literal. Numeric
  hosts in the legacy forms resolvers still accept (``127.1``, ``2130706433``, ``0x7f.0.0.1``)
  are refused outright: they would slip past a check that only knows dotted quads;
* no trailing dot (``feed.example.``, ``127.0.0.1.``): what a dotted host reaches depends on
  who reads it (a URL parser calls ``127.0.0.1.`` an address, the system resolver a name it
  cannot find; ``/etc/hosts`` and TLS certificate names never match the dotted form), so the
  worker would either connect somewhere the router did not judge or retry a connect that
  can never succeed. One spelling per host: write it without the dot;
* IP literals that are not globally routable (loopback, private, link-local, CGNAT, reserved,
  multicast, unspecified, the cloud metadata addresses ``169.254.169.254`` and
  ``fd00:ec2::254``), including IPv6 forms that embed such an IPv4 address (IPv4-mapped,
  NAT64, 6to4, Teredo), plus ``localhost`` and well-known metadata host names, are refused
  unless ``allowed_hosts`` lists that host exactly;
* with a non-empty ``allowed_hosts``, the host must equal an entry or end with ``"." + entry``
  (IP literals only ever match exactly). Listing a host is an explicit decision, so it also
  lifts the private-address refusal: the local runtime allows its loopback simulator with
  ``ALLOWED_UPSTREAM_HOSTS=127.0.0.1``.

Redirects and DNS answers are the worker's to check (it is the one that connects):
:func:`validate_redirect` judges each 3xx hop with the same rules plus a hop limit, and
:func:`refused_resolution_reason` judges every address a name resolved to. What an
``ALLOWED_UPSTREAM_HOSTS`` entry means for a resolved address: an IP literal entry allows
exactly that address; a *name* entry allows the name, not whatever it resolves to. A listed
name that resolves to a private, loopback or metadata address is refused unless that address
is listed too (``feed.internal,10.0.0.7``), because a listed provider's DNS being wrong or
hijacked must not turn the worker into a path to the VPC. The one exception is a listed
loopback name such as ``localhost``: its loopback answers are what listing it meant.

Why no DNS lookup at the router: a name that resolves to a public address when the router
checks it can resolve to ``127.0.0.1`` or ``169.254.169.254`` when the worker connects seconds
or days later (DNS rebinding), so a resolve-time check at the router proves nothing and only
adds latency and a failure mode. This module therefore stays pure: it judges the URL text (and,
for the worker, the addresses it is handed). Deployments must
fence the *network* instead: run workers in subnets whose security groups and network ACLs
allow egress only to the upstream providers (or through an egress proxy / AWS Network
Firewall with a domain allow-list), require IMDSv2 with a hop limit of 1 (Fargate tasks have
no EC2 metadata service; keep the task metadata endpoint out of reach of upstream code), and
set ``ALLOWED_UPSTREAM_HOSTS`` to the providers' domains.

Example::

    >>> validate_ws_url("wss://stream.example.com/v1?token=abc", allowed_hosts=(),
    ...                 allow_insecure=False)
    'wss://stream.example.com/v1?token=abc'
    >>> redact_url("wss://stream.example.com/v1?token=abc&symbol=X")
    'wss://stream.example.com/v1?token=***&symbol=***'
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

from .exceptions import InvalidUpstreamUrl

__all__ = [
    "MAX_REDIRECTS",
    "MAX_URL_LENGTH",
    "METADATA_ADDRESSES",
    "InvalidUpstreamUrl",
    "normalize_allowed_hosts",
    "redact_url",
    "refused_address_reason",
    "refused_resolution_reason",
    "validate_redirect",
    "validate_ws_url",
]

MAX_URL_LENGTH = 2048
#: Redirect hops one connect may follow. Real feeds use one (a load balancer or a moved
#: endpoint); a chain longer than this is a loop or someone probing.
MAX_REDIRECTS = 3

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Instance metadata services (EC2 IPv4 and IPv6; ECS task metadata uses 169.254.170.2).
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset({
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("169.254.170.2"),
    ipaddress.ip_address("fd00:ec2::254"),
})

#: Host names that mean "this machine" or "the metadata service" without being IP literals.
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_METADATA_NAMES = frozenset({
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.google.internal",
    "metadata.azure.internal",
})

#: NAT64 well-known prefix (RFC 6052): 64:ff9b::a.b.c.d reaches a.b.c.d through the gateway.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: Shared address space (RFC 6598); not "private" to Python but never a public upstream.
_SHARED = ipaddress.ip_network("100.64.0.0/10")

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
#: WHATWG URL rule: a host whose last label is numeric is parsed as an IPv4 address.
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_MAX_HOST_LENGTH = 253
#: The netloc once user info is refused: a host (bracketed IPv6 or anything without brackets
#: and colons) and an optional port. urlsplit itself ignores text after "]" ("[::1]x").
_AUTHORITY = re.compile(r"(?P<host>\[[^\[\]]*\]|[^\[\]:]*)(?::[0-9]*)?")


def normalize_allowed_hosts(entries: Iterable[str]) -> tuple[str, ...]:
    """Lower-case entries without surrounding dots or brackets, empty ones dropped.

    >>> normalize_allowed_hosts([" .Example.COM ", "[::1]", ""])
    ('example.com', '::1')
    """
    normalized = (entry.strip().strip(".").strip("[]").lower() for entry in entries)
    return tuple(entry for entry in normalized if entry)


def validate_ws_url(url: object, *, allowed_hosts: tuple[str, ...], allow_insecure: bool) -> str:
    """Return ``url`` unchanged if a worker may connect to it; raise InvalidUpstreamUrl if not.

    :param allowed_hosts: host suffixes (``ALLOWED_UPSTREAM_HOSTS``); empty allows any public
        host. An entry that is an IP literal or a name like ``localhost`` allows exactly that
        host even though it is private.
    :param allow_insecure: accept ``ws://`` as well as ``wss://`` (``ALLOW_INSECURE_WS``).
    """
    if not isinstance(url, str):
        raise InvalidUpstreamUrl("ws_url must be a string")
    if not url:
        raise InvalidUpstreamUrl("ws_url must not be empty")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidUpstreamUrl(f"ws_url is longer than {MAX_URL_LENGTH} characters")
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise InvalidUpstreamUrl(
            "ws_url must be printable ASCII without spaces "
            "(percent-encode the path, write international host names in punycode)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidUpstreamUrl(f"ws_url is not a valid URL: {exc}") from None
    _check_scheme(parts.scheme.lower(), allow_insecure)
    if "@" in parts.netloc:
        raise InvalidUpstreamUrl(
            "ws_url must not contain user info (user:password@); credentials in URLs end up in logs"
        )
    if "#" in url:
        raise InvalidUpstreamUrl("ws_url must not have a #fragment (RFC 6455)")
    if not parts.hostname:
        raise InvalidUpstreamUrl("ws_url must name a host")
    if port == 0:
        raise InvalidUpstreamUrl("ws_url port must be between 1 and 65535")
    _check_authority(parts.netloc)
    _check_host(parts.hostname, parts.netloc, allowed_hosts)
    return url


def _check_scheme(scheme: str, allow_insecure: bool) -> None:
    if scheme == "wss" or (scheme == "ws" and allow_insecure):
        return
    if scheme == "ws":
        raise InvalidUpstreamUrl("ws_url scheme must be wss (ws:// needs ALLOW_INSECURE_WS=true)")
    expected = "wss or ws" if allow_insecure else "wss"
    raise InvalidUpstreamUrl(f"ws_url scheme must be {expected}, got {scheme or 'none'!r}")


def _check_authority(netloc: str) -> None:
    """Refuse what urlsplit tolerates around the host: text after ``[...]`` and a trailing dot."""
    matched = _AUTHORITY.fullmatch(netloc)
    if matched is None:
        raise InvalidUpstreamUrl("ws_url host and port are malformed (write host:port)")
    host = matched.group("host")
    if host.endswith("."):
        raise InvalidUpstreamUrl(
            f"ws_url host {host!r} must not end with a dot; write {host.rstrip('.')!r} "
            "(resolvers, /etc/hosts and TLS certificates do not read the dotted form alike)"
        )


def _check_host(hostname: str, netloc: str, allowed_hosts: tuple[str, ...]) -> None:
    """Parse the host (IP literal or DNS name), then apply the allow-list or the SSRF rules."""
    bracketed = netloc.rpartition("@")[2].startswith("[")
    address = _parse_ip_host(hostname, bracketed)
    host = str(address) if address is not None else _parse_dns_host(hostname)
    allowed = normalize_allowed_hosts(allowed_hosts)
    if allowed:
        if not _is_listed(host, address, allowed):
            raise InvalidUpstreamUrl(f"ws_url host {host} is not in ALLOWED_UPSTREAM_HOSTS")
        return  # explicitly listed: trusted even if private (e.g. the local simulator)
    reason = refused_address_reason(address) if address is not None else _refused_name_reason(host)
    if reason:
        raise InvalidUpstreamUrl(
            f"ws_url host {host} is {reason}; list it in ALLOWED_UPSTREAM_HOSTS to allow it"
        )


def _parse_ip_host(hostname: str, bracketed: bool) -> IPAddress | None:
    """The IP literal in the host, None for a DNS name; refuses ambiguous numeric forms."""
    if bracketed:
        try:
            address = ipaddress.IPv6Address(hostname)
        except ValueError:
            address = None
        # urlsplit also accepts "[v1.x]" (IPvFuture) and zone ids; neither names an upstream.
        if address is None or address.scope_id:
            raise InvalidUpstreamUrl(f"ws_url host [{hostname}] is not a plain IPv6 address")
        return address
    if not _NUMERIC_LABEL.fullmatch(hostname.rpartition(".")[2]):
        return None
    try:
        return ipaddress.IPv4Address(hostname)
    except ValueError:
        raise InvalidUpstreamUrl(
            f"ws_url host {hostname} looks like an IPv4 address but is not a canonical "
            "dotted quad (write it as a.b.c.d)"
        ) from None


def _parse_dns_host(hostname: str) -> str:
    """The DNS name (urlsplit lower-cases it); refuses invalid names."""
    labels = hostname.split(".")
    if len(hostname) > _MAX_HOST_LENGTH or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidUpstreamUrl(f"ws_url host {hostname!r} is not a valid DNS name")
    return hostname


def _is_listed(host: str, address: IPAddress | None, allowed: tuple[str, ...]) -> bool:
    if address is not None:
        return any(_same_address(address, entry) for entry in allowed)
    return any(host == entry or host.endswith("." + entry) for entry in allowed)


def _same_address(address: IPAddress, entry: str) -> bool:
    try:
        return ipaddress.ip_address(entry) == address
    except ValueError:
        return False


def refused_address_reason(address: IPAddress) -> str | None:
    """Why a worker must not connect to this IP literal, or None for a public address.

    >>> refused_address_reason(ipaddress.ip_address("169.254.169.254"))
    'a cloud metadata address'
    >>> refused_address_reason(ipaddress.ip_address("93.184.216.34")) is None
    True
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = refused_address_reason(embedded)
            return f"an IPv6 form of {embedded} ({inner})" if inner else None
    checks = (
        (address in METADATA_ADDRESSES, "a cloud metadata address"),
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address in _SHARED, "a shared (carrier-grade NAT) address"),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "not a globally routable address"),
    )
    return next((reason for refused, reason in checks if refused), None)


def refused_resolution_reason(
    host: str, addresses: Iterable[IPAddress], *, allowed_hosts: tuple[str, ...]
) -> str | None:
    """Why a worker must not connect to ``host`` given what it resolved to, or None.

    Every address must pass, not just the first: the worker may fall back to any of them, and
    a DNS answer mixing a public and a private address is exactly how rebinding is staged. An
    address passes when :func:`refused_address_reason` finds nothing wrong with it, or when it
    is listed *as an IP literal* in ``allowed_hosts`` (an IPv4-mapped IPv6 answer counts as its
    IPv4 address). A listed name does not vouch for its addresses; see the module docstring.

    >>> import ipaddress as ip
    >>> refused_resolution_reason("feed.example", [ip.ip_address("93.184.216.34")],
    ...                           allowed_hosts=("feed.example",)) is None
    True
    >>> refused_resolution_reason("feed.example", [ip.ip_address("169.254.169.254")],
    ...                           allowed_hosts=("feed.example",))
    'feed.example resolves to 169.254.169.254, a cloud metadata address'
    >>> refused_resolution_reason("sim.local", [ip.ip_address("127.0.0.1")],
    ...                           allowed_hosts=("sim.local", "127.0.0.1")) is None
    True
    """
    allowed = normalize_allowed_hosts(allowed_hosts)
    found = list(addresses)
    if not found:
        return f"{host} resolved to no address"
    # A listed loopback name ("localhost") already means this machine, so its loopback
    # answers (127.0.0.1 and ::1 alike) are what listing it asked for.
    local_name = host.lower().rstrip(".") in _LOCAL_NAMES and host.lower().rstrip(".") in allowed
    for address in found:
        plain = _unmapped(address)
        if any(_same_address(plain, entry) for entry in allowed):
            continue
        if local_name and plain.is_loopback:
            continue
        reason = refused_address_reason(address)
        if reason:
            return f"{host} resolves to {address}, {reason}"
    return None


def _unmapped(address: IPAddress) -> IPAddress:
    """``::ffff:a.b.c.d`` as ``a.b.c.d``, so an allow-list entry matches both forms."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def validate_redirect(
    current_url: str,
    location_url: str,
    *,
    hop: int,
    allowed_hosts: tuple[str, ...],
    allow_insecure: bool,
) -> str:
    """Return ``location_url`` if the worker may follow this redirect; raise if not.

    ``hop`` counts from 1 for the first redirect of one connect. The target must pass
    :func:`validate_ws_url` with the same settings the router used for the original URL, may
    not leave TLS (``wss`` to ``ws``) unless ``allow_insecure``, and the chain may not be
    longer than :data:`MAX_REDIRECTS`. ``location_url`` must already be absolute (resolve a
    relative ``Location`` against ``current_url`` first).

    >>> validate_redirect("wss://a.example/x", "wss://b.example/y", hop=1,
    ...                   allowed_hosts=("example",), allow_insecure=False)
    'wss://b.example/y'
    >>> validate_redirect("wss://a.example/x", "wss://10.0.0.1/y", hop=1,
    ...                   allowed_hosts=(), allow_insecure=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    wsfleet.exceptions.InvalidUpstreamUrl: redirect refused: ws_url host 10.0.0.1 is a private ...
    """
    if hop > MAX_REDIRECTS:
        raise InvalidUpstreamUrl(f"redirect refused: more than {MAX_REDIRECTS} redirects")
    # Only a ws:// target is a downgrade; any other scheme is refused by the URL rules below.
    downgrade = current_url.lower().startswith("wss:") and location_url.lower().startswith("ws:")
    if downgrade and not allow_insecure:
        raise InvalidUpstreamUrl("redirect refused: wss:// to ws:// needs ALLOW_INSECURE_WS=true")
    try:
        validate_ws_url(location_url, allowed_hosts=allowed_hosts, allow_insecure=allow_insecure)
    except InvalidUpstreamUrl as exc:
        raise InvalidUpstreamUrl(f"redirect refused: {exc}") from None
    return location_url


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 literal would reach: IPv4-mapped, NAT64, 6to4 or Teredo."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # (server, client): traffic goes to the client address
    return None


def _refused_name_reason(host: str) -> str | None:
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        return "a loopback name"
    if host in _METADATA_NAMES:
        return "a cloud metadata name"
    return None


def redact_url(url: str) -> str:
    """``url`` safe to log or show: query values masked, user info and fragment dropped.

    The one redaction for logs, ``last_error`` and API responses. Upstream URLs often carry an
    API token in the query string; the parameter names stay visible so an operator can still
    tell two URLs apart. A query part without ``=`` has no name to keep (it may be a bare
    token), so it is masked whole. A URL that does not parse (including a non-numeric port,
    where the "host" may really be ``user:password`` cut short by a ``#`` or ``?``) is replaced.

    >>> redact_url("wss://u:p@h.example/feed?token=s3cret&x=1#f")
    'wss://h.example/feed?token=***&x=***'
    >>> redact_url("wss://h.example/feed?s3cret")
    'wss://h.example/feed?***'
    """
    try:
        parts = urlsplit(url)
        _ = parts.port  # ValueError unless the netloc ends in a host and an optional number
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "<invalid url>"
    masked = "&".join(_mask_query_part(part) for part in parts.query.split("&") if part)
    return urlunsplit((parts.scheme, host, parts.path, masked, ""))


def _mask_query_part(part: str) -> str:
    name, equals, _ = part.partition("=")
    return f"{name}=***" if equals and name else "***"
