"""What one connect sends: URL, headers, subprotocols, subscribe message. Pure, no I/O.

:func:`plan_handshake` turns a connection's options (:class:`wsfleet.upstream_options.
UpstreamOptions`), the resume position and the resolved credential (if any) into a
:class:`Handshake`. The resume modes:

=============  ==============================================  ==============================
``resume``     the URL                                          the subscribe message
=============  ==============================================  ==============================
``query``      ``<resume_param>=<from_seq>`` (today's way)     sent as written (if any)
``subscribe``  as stored                                        ``{{from_seq}}`` = from_seq
``none``       as stored                                        sent as written (if any)
=============  ==============================================  ==============================

A START with ``resume: false`` asks for live data: no ``from_seq`` is sent in either place (a
JSON subscribe message gets ``null``). The credential goes where its placement says: a header
(through its ``format``), a query parameter (replacing one of the same name), or the subscribe
message's ``{{secret}}``. A handshake carrying a credential is origin-locked: the connector
refuses a redirect to another scheme, host or port (websockets would send the same headers
there).

Nothing here is logged: a :class:`Handshake` may hold a secret. Its ``repr`` leaves the
header values, the URL's query values and the subscribe message out.

>>> from wsfleet.upstream_options import UpstreamOptions, ResumeMode
>>> h = plan_handshake("wss://feed.example/s", UpstreamOptions(), from_seq=11,
...                    resume_enabled=True, default_resume_param="from_seq")
>>> h.url, h.asked_from
('wss://feed.example/s?from_seq=11', 11)
>>> plan_handshake("wss://feed.example/s", UpstreamOptions(resume=ResumeMode.NONE), from_seq=11,
...                resume_enabled=True, default_resume_param="from_seq").asked_from is None
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from wsfleet.upstream_options import (
    CredentialPlacement,
    ResumeMode,
    UpstreamOptions,
    render_subscribe,
)
from wsfleet.upstream_url import redact_url

from .frames import resume_url, with_query_param

__all__ = ["Handshake", "plan_handshake", "same_origin", "with_query_param"]


@dataclass(frozen=True)
class Handshake:
    """One connect's request. ``asked_from``: the seq the upstream was asked to resume from
    (None: live, nothing asked)."""

    url: str = field(repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    subprotocols: tuple[str, ...] = ()
    subscribe: str | None = field(default=None, repr=False)
    origin_locked: bool = False
    asked_from: int | None = None

    def __repr__(self) -> str:  # never the secret
        return (
            f"Handshake(url={redact_url(self.url)!r}, headers={[n for n, _ in self.headers]}, "
            f"subprotocols={list(self.subprotocols)}, subscribe={self.subscribe is not None}, "
            f"origin_locked={self.origin_locked}, asked_from={self.asked_from})"
        )


def same_origin(a: str, b: str) -> bool:
    """Same scheme, host and port (default ports filled in).

    >>> same_origin("wss://h.example/a", "wss://H.example:443/b"), same_origin("wss://h/a", "wss://g/a")
    (True, False)
    """

    def origin(url: str) -> tuple[str, str, int | None]:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is None:
            port = {"wss": 443, "ws": 80}.get(scheme)
        return scheme, (parts.hostname or "").lower(), port

    return origin(a) == origin(b)


def plan_handshake(
    ws_url: str,
    options: UpstreamOptions,
    *,
    from_seq: int,
    resume_enabled: bool,
    default_resume_param: str,
    secret: str | None = None,
) -> Handshake:
    """The request for one connect (see the module docstring). ``from_seq`` is the first seq
    wanted (checkpoint + 1); ``secret`` the resolved credential value, if the options name one.
    """
    mode = options.resume
    asked = from_seq if resume_enabled and mode is not ResumeMode.NONE else None
    if mode is ResumeMode.QUERY:
        param = options.resume_param or default_resume_param
        url = resume_url(ws_url, param, from_seq, enabled=resume_enabled)
        if not param:
            asked = None
    else:
        url = resume_url(ws_url, "", 0, enabled=False)
    headers = list(options.headers)
    credential = options.credential
    subscribe_secret = None
    if credential is not None and secret is not None:
        if credential.placement is CredentialPlacement.HEADER:
            headers.append((credential.name, credential.render(secret)))
        elif credential.placement is CredentialPlacement.QUERY:
            url = with_query_param(url, credential.name, secret)
        else:
            subscribe_secret = secret
    subscribe = render_subscribe(
        options,
        from_seq=asked if mode is ResumeMode.SUBSCRIBE else None,
        secret=subscribe_secret,
    )
    return Handshake(
        url=url,
        headers=tuple(headers),
        subprotocols=options.subprotocols,
        subscribe=subscribe,
        origin_locked=credential is not None,
        asked_from=asked,
    )
