"""A fake upstream: a WebSocket server that streams numbered frames, for tests, demos and chaos.

wsfleet workers are WebSocket *clients*; this module is the server they connect to. It stands in
for a real upstream feed so we can check, from outside, that the fleet kept every stream alive,
resumed without gaps and never had two owners at once.

What a stream looks like
    ``GET /<stream_id>?from_seq=N`` upgrades to WebSocket. Each stream has a live sequence that
    starts when the stream is first seen (first connection or ``open_stream``) and produces
    seq 1, 2, 3, ... at ``rate`` frames per second *whether or not anyone is connected*, like a
    real feed. Frames are JSON text, ``{"seq": n, "data": "<stream_id>:<n>"}``: the content is a
    function of (stream, seq), so a checker can verify what the fleet stored without asking the
    simulator (see :func:`frame_data`).

    With ``from_seq=N`` a session replays N..current from a bounded replay window (default
    10,000 frames; older requests start at the oldest frame still available and the session
    records the ``gap``), then sends live frames as they become due. Without ``from_seq`` it
    starts at the next live frame; a ``from_seq`` in the future waits for it. An optional
    ``max_seq`` ends the stream: after sending it the session closes with 1000.

Why it is cheap per stream
    Nothing is stored per frame and nothing runs per idle stream. A stream is a
    :class:`StreamClock` (an anchor time, an anchor seq, a rate): the current seq is computed from
    elapsed time when someone asks, and replayed frames are recomputed, so the "replay buffer"
    is only a window rule. Each connection is served by the one handler task websockets starts
    for it, which sleeps until its next frame is due or something wakes it (a fault, a rate
    change, the end of the stream, the peer going away). Compression is off: a
    permessage-deflate context costs far more memory per connection than the frames ever will.

What a test can do to a stream
    Arm a one-shot :class:`Fault` or :class:`HostileFrame` (for the worker's frame parsing and
    size limits): it hits a session open now, else the next one, and is listed in that
    session's ``faults`` (a hostile frame as ``hostile:<kind>:<n>:<size>``, from which
    :func:`hostile_frame_data` gives back the data a worker should have stored). A hostile
    frame is stream content: every session open when it is armed gets the same frame (same
    ``n``), as every subscriber of a real feed would (two at once during a make-before-break
    hand-off); with none open, the next session gets it.
    ``poison_stream`` opens *every* session with a ``size``-byte frame (a crash loop for a
    worker whose limit is lower); ``creep_stream`` sends every session the one frame it owes
    next and then such a frame (the client's position moves on every session: a loop a breaker
    counting at one position never stops); ``trickle_stream`` starts a fragmented message on
    every session and adds a byte at a time, forever; ``redirect_stream`` answers every
    handshake ``302`` (for the worker's SSRF guard); a :class:`Shape` says how a stream talks
    to its clients. A :class:`SessionLimit` (``limit_sessions``) says how many sessions of
    one account (by default the stream itself) the upstream tolerates at once: any number,
    ``one`` (a second handshake is refused with HTTP 409 while a session is open: exchanges
    and meeting APIs that allow one socket per credential), or ``cut_first`` (a second
    session is accepted and the open one is closed, 1008). Shapes and limits combine: a
    ``live_only`` stream with a ``one`` limit is an upstream make-before-break cannot overlap.
    ``mute_stream`` makes the sessions that open while it is on send nothing until it is
    turned off (they are listed with the fault ``muted``; the sessions already open stream
    on): a hand-off's taker that gets no frame while its giver's session keeps flowing.

Introspection
    Every accepted session is logged as a :class:`SessionRecord` (bounded log), with the
    handshake's headers and subprotocols and the subscribe message received. Checkers use
    ``overlaps`` (two sessions of one stream open at the same time: a split brain) and
    ``first_frame_at`` (when streaming resumed after a failover). Beside the records, the
    upstream keeps an ordered event log (:class:`SessionEvent`: ``open``, ``close``,
    ``refused``, ``cut``, numbered in the order its event loop saw them): whether two
    sessions were ever open together is read from that order, how long from
    :func:`overlap_seconds` over the records.

One control API, three places to run it
    Each control operation is written once, as a free function of the simulator's state, with
    its route over /_sim beside it (:func:`_route`). :class:`SimulatorControl` turns each into a
    method; its subclasses only say how to reach the simulator: :class:`UpstreamSimulator` in
    this event loop, :class:`SimulatorThread` on its own loop in a daemon thread (for
    synchronous code), :class:`SimulatorClient` in another process over plain HTTP on the
    WebSocket port. A route's ``{id}`` is the quoted stream id and its query parameters are the
    operation's keyword arguments; the answer is JSON (``{"ok": true}`` for a command), 404 for
    an unknown stream, 400 for a bad argument. For example
    ``POST /_sim/streams/s1/fault?kind=drop`` is ``inject_fault("s1", "drop")`` and
    ``GET /_sim/sessions?stream=s1&open=1`` answers ``{"sessions": [...]}``.

Example::

    async with UpstreamSimulator(rate=50) as sim:
        async with websockets.connect(sim.url_for("s1") + "?from_seq=1") as ws:
            assert json.loads(await ws.recv()) == {"seq": 1, "data": "s1:1"}

``python -m wsfleet_local.simulator --port 0`` runs it in the foreground, the way every local
child serves (:func:`wsfleet_local.procs.serve_until_stopped`): one JSON line ``{"url": ...}``
once listening, a graceful stop on SIGTERM/SIGINT, a forced one on a second signal.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import enum
import functools
import http
import inspect
import itertools
import json
import math
import re
import sys
import threading
import time
import urllib.parse
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from wsfleet.exceptions import WsfleetError

from .procs import Service, StopSignals, serve_until_stopped
from .serving import call_json

__all__ = [
    "Fault",
    "HostileFrame",
    "InvalidRequest",
    "SessionEvent",
    "SessionLimit",
    "SessionRecord",
    "Shape",
    "SimulatorClient",
    "SimulatorControl",
    "SimulatorError",
    "SimulatorThread",
    "StreamClock",
    "UnknownStream",
    "UpstreamSimulator",
    "find_overlaps",
    "first_frame_after",
    "frame_data",
    "frame_text",
    "hostile_frame_data",
    "hostile_frame_text",
    "main",
    "open_together",
    "overlap_seconds",
    "plan_start",
]

CONTROL_PREFIX = "/_sim"
RESUME_PARAM = "from_seq"
DEFAULT_RATE = 10.0
DEFAULT_BUFFER_FRAMES = 10_000
DEFAULT_MAX_SESSIONS_LOGGED = 100_000
#: Frames sent back to back before the sender yields and looks for faults again. Bounds how long
#: a 10,000-frame replay can hold the event loop.
SEND_BATCH_FRAMES = 256
#: Floats are not exact: (due_time - anchor) * rate may land a hair below an integer.
_SEQ_EPSILON = 1e-9
#: Never sleep less than this when a frame is not yet due (guards against a zero-delay spin).
_MIN_SLEEP_SECONDS = 0.0005
#: Size of a MAX_SIZE hostile frame when none is given: the worker's default WORKER_MAX_FRAME_BYTES.
DEFAULT_HOSTILE_FRAME_BYTES = 393_216
#: The largest hostile or poison frame a control request may ask for: the frame is built in
#: memory, so a size from a /_sim request must not be able to exhaust it.
MAX_HOSTILE_FRAME_BYTES = 64 * 1024 * 1024


# --------------------------------------------------------------------------------------------
# Errors


class SimulatorError(WsfleetError):
    """Root of the simulator's own errors (under the wsfleet root)."""


class UnknownStream(SimulatorError):
    """The simulator has never seen this stream (no connection, no ``open_stream``)."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"unknown stream {stream_id!r}")
        self.stream_id = stream_id


class InvalidRequest(SimulatorError, ValueError):
    """An argument is out of range: unknown fault kind, negative rate, bad query parameter."""


# --------------------------------------------------------------------------------------------
# Core: pure rules, no I/O, no clock reads (``now`` is always passed in)


class Fault(enum.StrEnum):
    """One-shot faults a test can inject into a stream."""

    DROP = "drop"  # abort the TCP connection without a close frame
    CLOSE_NORMAL = "close_normal"  # close 1000
    CLOSE_ERROR = "close_error"  # close 1011
    GARBAGE = "garbage"  # send one non-JSON text frame, then continue
    NOSEQ = "noseq"  # send one JSON frame without ``seq``, then continue
    REJECT = "reject"  # answer the next handshake with HTTP 503


class Shape(enum.StrEnum):
    """How a stream talks to its clients (applies from the next handshake)."""

    PLAIN = "plain"  # the default: ``?from_seq=N`` says where to resume
    #: HTTP 401 unless the handshake carries the configured header with the configured value
    #: (like an API that wants ``Authorization: Bearer ...``)
    HEADER_AUTH = "header_auth"
    #: Nothing is sent until the client's first message, a JSON object; its ``from_seq`` field
    #: (number or null) says where to resume
    SUBSCRIBE = "subscribe"
    #: ``from_seq`` is ignored: every session starts at the next live frame, so frames produced
    #: while nobody listened are gone (the fleet must *report* that gap)
    LIVE_ONLY = "live_only"


class SessionLimit(enum.StrEnum):
    """How many sessions of one account the upstream tolerates at once (a session counts from
    its accepted handshake until its TCP connection is gone, closing handshake included)."""

    MANY = "many"  # the default: any number
    #: A handshake is answered HTTP 409 while another session of the account is open
    ONE = "one"
    #: A new session is accepted and every open one of the account is closed with 1008
    CUT_FIRST = "cut_first"


#: Close code and reason of a session cut by a newer one (``cut_first``).
CUT_CODE = 1008
CUT_REASON = "replaced by a newer session of this account"


class HostileFrame(enum.StrEnum):
    """One-shot hostile frames, sent like a fault frame; none carries a usable seq."""

    HUGE_SEQ = "huge_seq"  # a 40-digit JSON integer
    DIGITS_SEQ = "digits_seq"  # a 30-digit string
    OUT_OF_RANGE_SEQ = "out_of_range_seq"  # 2**53: one past the safe integers
    MAX_SIZE = "max_size"  # exactly ``size`` UTF-8 bytes of mostly non-ASCII, no seq
    OPENING = "opening"  # what poison_stream sends first on every session (no seq)


# Keyed as str: StrEnum members hash and compare as their value, so hostile_frame_text's
# ``kind`` finds its seq whether it came as a member or as its name.
_SEQ_OF: dict[str, int | str] = {
    HostileFrame.HUGE_SEQ: 10**40,
    HostileFrame.DIGITS_SEQ: "9" * 30,
    HostileFrame.OUT_OF_RANGE_SEQ: 2**53,
}
_Member = TypeVar("_Member", bound=enum.StrEnum)
_V = TypeVar("_V", int, float)


def _parse_enum(cls: type[_Member], value: str, what: str) -> _Member:
    """``cls(value)``, or :class:`InvalidRequest` listing the valid values."""
    try:
        return cls(value)
    except ValueError:
        valid = ", ".join(member.value for member in cls)
        raise InvalidRequest(f"unknown {what} {value!r} (expected one of: {valid})") from None


@dataclasses.dataclass(frozen=True, slots=True)
class _LimitConfig:
    limit: SessionLimit
    account: str  # streams that share an account share the limit


@dataclasses.dataclass(frozen=True, slots=True)
class _ShapeConfig:
    shape: Shape
    header: str = ""
    value: str = ""
    field: str = RESUME_PARAM  # subscribe: the message field holding the resume position


def hostile_frame_data(stream_id: str, kind: str | HostileFrame, n: int, size: int) -> str:
    """The ``data`` of hostile frame number ``n``: what a worker must store for it (or a marker
    of it). Sized frames are padded with two-byte characters to exactly ``size`` bytes."""
    kind = _parse_enum(HostileFrame, kind, "hostile frame")
    tag = f"hostile:{stream_id}:{kind.value}:{n}"
    if kind not in (HostileFrame.MAX_SIZE, HostileFrame.OPENING):
        return tag
    extra = max(0, size - len(json.dumps({"data": tag}, separators=(",", ":")).encode()))
    return tag + "\u00e9" * (extra // 2) + "x" * (extra % 2)


def hostile_frame_text(stream_id: str, kind: str | HostileFrame, n: int, size: int) -> str:
    """The exact text frame sent (compact, non-ASCII unescaped, so ``size`` is its byte size).

    >>> len(hostile_frame_text("s", "max_size", 1, 1000).encode())
    1000
    >>> hostile_frame_text("s", "out_of_range_seq", 2, 0)
    '{"seq":9007199254740992,"data":"hostile:s:out_of_range_seq:2"}'
    """
    data = hostile_frame_data(stream_id, kind, n, size)
    payload: dict[str, Any] = {"seq": _SEQ_OF[kind]} if kind in _SEQ_OF else {}
    payload["data"] = data
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def frame_data(stream_id: str, seq: int) -> str:
    """The ``data`` field of frame ``seq`` on ``stream_id``: what a checker expects stored."""
    return f"{stream_id}:{seq}"


def frame_text(stream_id: str, seq: int) -> str:
    """The exact text frame the simulator sends for ``seq`` on ``stream_id``."""
    return json.dumps({"seq": seq, "data": frame_data(stream_id, seq)})


def _check_size(size: int | None) -> None:
    if size is not None and not 0 <= size <= MAX_HOSTILE_FRAME_BYTES:
        raise InvalidRequest(f"size must be 0..{MAX_HOSTILE_FRAME_BYTES} bytes, got {size}")


def _check_rate(rate: float) -> float:
    if not (math.isfinite(rate) and rate >= 0):
        raise InvalidRequest(f"rate must be a finite number >= 0 frames/s, got {rate!r}")
    return float(rate)


@dataclasses.dataclass(slots=True)
class StreamClock:
    """When each seq of one stream exists, computed from elapsed time (no per-frame state).

    ``anchor_seq`` was the latest seq at monotonic time ``anchor_time``; seq ``anchor_seq + k``
    becomes current at ``anchor_time + k / rate``. A rate change re-anchors at "now" so the
    frames already produced stay produced. ``rate == 0`` pauses the stream. ``max_seq`` (if
    set) is the last seq the stream will ever produce.
    """

    rate: float
    anchor_time: float
    anchor_seq: int = 0
    max_seq: int | None = None

    def current(self, now: float) -> int:
        """The latest seq produced at ``now`` (0 before the first frame)."""
        produced = self.anchor_seq
        if self.rate > 0 and now > self.anchor_time:
            produced += int((now - self.anchor_time) * self.rate + _SEQ_EPSILON)
        return produced if self.max_seq is None else min(produced, self.max_seq)

    def due_at(self, seq: int) -> float:
        """Monotonic time at which ``seq`` is produced (``inf``: never, paused or past the end)."""
        if seq <= self.anchor_seq:
            return -math.inf
        if self.rate <= 0 or (self.max_seq is not None and seq > self.max_seq):
            return math.inf
        return self.anchor_time + (seq - self.anchor_seq) / self.rate

    def ended(self, now: float) -> bool:
        """True once ``max_seq`` has been produced: no frame will follow."""
        return self.max_seq is not None and self.current(now) >= self.max_seq

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate from ``now`` on, keeping what was already produced."""
        self.anchor_seq = self.current(now)
        self.anchor_time = now
        self.rate = _check_rate(rate)

    def set_max_seq(self, max_seq: int, now: float) -> None:
        """End the stream at ``max_seq`` (never below what was already produced)."""
        self.max_seq = max(max_seq, self.current(now))


def plan_start(from_seq: int | None, current: int, buffer_frames: int) -> tuple[int, int]:
    """First seq a new session sends, and the gap forced by the replay window.

    Without ``from_seq`` a session starts live (``current + 1``). With it, it starts at
    ``from_seq`` unless that is older than the window of the last ``buffer_frames`` frames, in
    which case it starts at the oldest one kept and reports how many frames it skipped.
    Seqs start at 1, so ``from_seq <= 1`` means "everything" and is never a gap.

    >>> [plan_start(None, 41, 100), plan_start(5, 41, 100), plan_start(5, 41, 10)]
    [(42, 0), (5, 0), (32, 27)]
    >>> plan_start(50, 41, 10)  # in the future: wait for it
    (50, 0)
    """
    if from_seq is None:
        return current + 1, 0
    wanted = max(from_seq, 1)
    oldest = max(1, current - buffer_frames + 1)
    if wanted < oldest:
        return oldest, oldest - wanted
    return wanted, 0


@dataclasses.dataclass(slots=True)
class SessionRecord:
    """What one accepted WebSocket session did. Times are wall clock (``time.time()``).

    ``close_code`` is the code of the closing handshake, ``"abort"`` when the TCP connection
    ended without one (a ``drop`` fault, a killed client), ``None`` while open. ``frames_sent``
    counts sequence frames only; fault frames are listed in ``faults``.
    """

    stream_id: str
    session_id: int
    peer: str
    from_seq: int | None
    opened_at: float
    gap: int = 0
    first_seq_sent: int | None = None
    last_seq_sent: int | None = None
    frames_sent: int = 0
    first_frame_at: float | None = None
    closed_at: float | None = None
    close_code: int | str | None = None
    faults: tuple[str, ...] = ()
    #: The opening handshake's headers (name -> value; repeated names joined with ", ").
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    subprotocols: tuple[str, ...] = ()
    #: The first message received (``subscribe`` shape), as received.
    subscribe: str | None = None
    #: The handshake's raw query string (``from_seq`` and anything a client added).
    query: str = ""

    @property
    def is_open(self) -> bool:
        """True until the TCP connection is gone."""
        return self.closed_at is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the /_sim/sessions wire format; tuples go out as lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionRecord:
        """Inverse of :meth:`to_dict`; unknown keys are ignored so old clients keep working."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["faults"] = tuple(kwargs.get("faults", ()))
        kwargs["subprotocols"] = tuple(kwargs.get("subprotocols", ()))
        return cls(**kwargs)


def find_overlaps(records: Iterable[SessionRecord]) -> list[tuple[SessionRecord, SessionRecord]]:
    """Pairs of sessions whose open intervals intersect, earlier-opened first.

    A session is open on ``[opened_at, closed_at)``; one still open extends to infinity. Pass
    the sessions of one stream: an overlap there means two clients streamed it at once.
    """
    pairs: list[tuple[SessionRecord, SessionRecord]] = []
    active: list[SessionRecord] = []
    for record in sorted(records, key=lambda r: (r.opened_at, r.session_id)):
        active = [a for a in active if a.closed_at is None or a.closed_at > record.opened_at]
        pairs.extend((earlier, record) for earlier in active)
        active.append(record)
    return pairs


def first_frame_after(records: Iterable[SessionRecord], after: float) -> float | None:
    """Earliest first-frame wall time among sessions opened strictly after ``after``.

    With ``after`` = the moment a worker was killed, this is when the stream was flowing
    again somewhere else; ``None`` if no such session has sent a frame yet.
    """
    times = [
        r.first_frame_at for r in records if r.opened_at > after and r.first_frame_at is not None
    ]
    return min(times, default=None)


@dataclasses.dataclass(frozen=True, slots=True)
class SessionEvent:
    """One entry of the upstream's ordered event log.

    ``n`` numbers the events in the order the simulator's event loop saw them (wall-clock
    times may tie or step back; ``n`` never does). ``event`` is ``open`` (a session accepted),
    ``close`` (its TCP connection gone), ``refused`` (a handshake answered 409 by a ``one``
    limit; ``session_id`` 0) or ``cut`` (a ``cut_first`` limit began closing the session)."""

    n: int
    at: float
    stream_id: str
    session_id: int
    event: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def open_together(events: Iterable[SessionEvent]) -> list[tuple[int, int]]:
    """``(open, opening)`` session pairs where a session opened while another of the same
    stream was still open, in the log's own order (no clock involved).

    >>> log = [SessionEvent(1, 0, "s", 1, "open"), SessionEvent(2, 0, "s", 2, "open"),
    ...        SessionEvent(3, 0, "s", 1, "close"), SessionEvent(4, 0, "s", 2, "close"),
    ...        SessionEvent(5, 0, "s", 3, "open")]
    >>> open_together(log)
    [(1, 2)]
    """
    open_now: dict[str, set[int]] = defaultdict(set)
    pairs: list[tuple[int, int]] = []
    for event in sorted(events, key=lambda e: e.n):
        if event.event == "open":
            pairs.extend((other, event.session_id) for other in sorted(open_now[event.stream_id]))
            open_now[event.stream_id].add(event.session_id)
        elif event.event == "close":
            open_now[event.stream_id].discard(event.session_id)
    return pairs


def overlap_seconds(
    records: Iterable[SessionRecord], end: float | None = None
) -> list[tuple[SessionRecord, SessionRecord, float]]:
    """Each overlapping pair of :func:`find_overlaps` with how long both were open (seconds,
    wall clock). A session still open counts as open until ``end`` (default: now).

    >>> a = SessionRecord("s", 1, "p", None, opened_at=10.0, closed_at=12.5)
    >>> b = SessionRecord("s", 2, "p", None, opened_at=12.0, closed_at=20.0)
    >>> [(x.session_id, y.session_id, t) for x, y, t in overlap_seconds([a, b])]
    [(1, 2, 0.5)]
    """
    until = time.time() if end is None else end
    found = []
    for older, newer in find_overlaps(records):
        older_end = until if older.closed_at is None else older.closed_at
        newer_end = until if newer.closed_at is None else newer.closed_at
        found.append((older, newer, max(0.0, min(older_end, newer_end) - newer.opened_at)))
    return found


# --------------------------------------------------------------------------------------------
# The control API, written once: each operation is a free function of a simulator's state,
# registered with its route over /_sim; the facade (SimulatorControl) makes each one a method
# that runs wherever the simulator is (this loop, a thread's loop, another process over /_sim).
# All run on the simulator's loop.

_Query = dict[str, list[str]]


def _param(query: _Query, name: str, kind: type) -> Any:
    """Query parameter ``name`` as a ``kind`` (str, int, float or bool): absent is None (a flag
    is off), a blank number is None, anything else that is not a number a 400."""
    values = query.get(name)
    raw = values[-1] if values else None
    if kind is bool:
        return raw in ("1", "true")
    if kind is str:
        return raw
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"{name} must be {what}, got {raw!r}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class _Route:
    """How one operation travels over /_sim: :class:`SimulatorClient` builds the request from
    it, the simulator's server parses the request back into the same call."""

    operation: Callable[..., Any]
    verb: str
    path: str  # below /_sim/; "{id}" is the (quoted) stream id, the operation's first argument
    #: (query parameter, keyword argument, its type: see _param)
    params: tuple[tuple[str, str, type], ...]
    key: str | None  # the answer is {key: result}; else the result, or {"ok": true}


_ROUTES: dict[str, _Route] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


def _route(
    verb: str, path: str, *params: tuple[str, str, type], key: str | None = None
) -> Callable[[_F], _F]:
    """Register a control operation with its route over /_sim."""

    def register(operation: _F) -> _F:
        _ROUTES[operation.__name__] = _Route(operation, verb, path, params, key)
        return operation

    return register


@_route("POST", "streams/{id}/open", ("rate", "rate", float), ("max_seq", "max_seq", int))
def open_stream(
    sim: UpstreamSimulator, stream_id: str, *, rate: float | None = None, max_seq: int | None = None
) -> dict[str, Any]:
    """Start a stream now (if new), or change its rate / end seq (if known); returns its info."""
    if max_seq is not None and max_seq < 0:
        raise InvalidRequest(f"max_seq must be >= 0, got {max_seq}")
    now = sim._now()
    clock = sim._streams.get(stream_id)
    if clock is None:
        sim._streams[stream_id] = StreamClock(
            rate=_check_rate(sim.rate if rate is None else rate), anchor_time=now, max_seq=max_seq
        )
    else:
        if rate is not None:
            clock.set_rate(rate, now)
        if max_seq is not None:
            clock.set_max_seq(max_seq, now)
        sim._wake(stream_id)
    return stream_info(sim, stream_id)


@_route("POST", "streams/{id}/end")
def end_stream(sim: UpstreamSimulator, stream_id: str) -> dict[str, Any]:
    """Freeze the stream at its current seq; sessions send what they still owe, then 1000.
    Returns its info."""
    clock, now = sim._clock(stream_id), sim._now()
    clock.set_max_seq(clock.current(now), now)
    sim._wake(stream_id)
    return stream_info(sim, stream_id)


@_route("GET", "streams/{id}")
def stream_info(sim: UpstreamSimulator, stream_id: str) -> dict[str, Any]:
    """JSON-ready state of one stream (raises :class:`UnknownStream`)."""
    clock, now = sim._clock(stream_id), sim._now()
    config = sim._shapes.get(stream_id)
    return {
        "stream_id": stream_id,
        "current_seq": clock.current(now),
        "rate": clock.rate,
        "max_seq": clock.max_seq,
        "ended": clock.ended(now),
        "open_sessions": len(sim._live.get(stream_id, ())),
        "pending_faults": [f.value for f in sim._faults.get(stream_id, ())],
        "pending_rejects": sim._rejects.get(stream_id, 0),
        "shape": (Shape.PLAIN if config is None else config.shape).value,
        "session_limit": sim._session_limit(stream_id).limit.value,
        "refused_handshakes": sim._limit_refusals[stream_id],
        "muted": stream_id in sim._muted,
    }


@_route("GET", "streams", key="streams")
def streams(sim: UpstreamSimulator) -> dict[str, dict[str, Any]]:
    """Info for every stream seen so far, keyed by stream id."""
    return {stream_id: stream_info(sim, stream_id) for stream_id in sim._streams}


@_route(
    "GET",
    "sessions",
    ("stream", "stream_id", str),
    ("open", "open_only", bool),
    key="sessions",
)
def sessions(
    sim: UpstreamSimulator, stream_id: str | None = None, *, open_only: bool = False
) -> list[SessionRecord]:
    """Snapshots of logged sessions (oldest first), optionally of one stream or only open."""
    return [
        dataclasses.replace(r)
        for r in sim._log
        if (stream_id is None or r.stream_id == stream_id) and not (open_only and not r.is_open)
    ]


@_route("POST", "streams/{id}/fault", ("kind", "kind", str))
def inject_fault(sim: UpstreamSimulator, stream_id: str, kind: str | Fault) -> None:
    """Arm a one-shot fault on a session open now, else on the next session (or handshake)."""
    fault = _parse_enum(Fault, kind, "fault kind")
    if fault is Fault.REJECT:
        sim._rejects[stream_id] += 1
        return
    sim._faults[stream_id].append(fault)
    sim._wake(stream_id)


@_route("POST", "streams/{id}/hostile", ("kind", "kind", str), ("size", "size", int))
def inject_hostile(
    sim: UpstreamSimulator, stream_id: str, kind: str | HostileFrame, *, size: int | None = None
) -> None:
    """Arm a one-shot hostile frame, sent like a fault frame (the stream then continues)."""
    frame = _parse_enum(HostileFrame, kind, "hostile frame")
    _check_size(size)
    if frame is not HostileFrame.MAX_SIZE:
        size = 0
    elif size is None:
        size = DEFAULT_HOSTILE_FRAME_BYTES
    armed = (frame, size, next(sim._hostile_ids))
    open_now = sim._live.get(stream_id)
    if open_now:
        for ws in open_now:
            ws.hostile.append(armed)
    else:
        sim._hostile[stream_id].append(armed)
    sim._wake(stream_id)


@_route("POST", "streams/{id}/poison", ("size", "size", int))
def poison_stream(sim: UpstreamSimulator, stream_id: str, size: int | None) -> None:
    """Every later session of ``stream_id`` first gets a ``size``-byte frame (0 or None: off)."""
    _check_size(size)
    _arm(sim._poisoned, stream_id, size)


@_route("POST", "streams/{id}/creep", ("size", "size", int))
def creep_stream(sim: UpstreamSimulator, stream_id: str, size: int | None) -> None:
    """Every later session of ``stream_id`` sends the one frame it owes next, then a
    ``size``-byte frame, then nothing (0 or None: off). A client whose limit is lower closes
    on the big frame, yet its checkpoint moved on every session: a crash loop that a breaker
    counting at one position never stops (issue #23)."""
    _check_size(size)
    _arm(sim._creeping, stream_id, size)


@_route("POST", "streams/{id}/trickle", ("interval", "interval", float))
def trickle_stream(sim: UpstreamSimulator, stream_id: str, interval: float | None) -> None:
    """Every later session of ``stream_id`` starts a fragmented message and adds one byte
    every ``interval`` seconds, forever, answering pings meanwhile (0 or None: off): a message
    that never completes."""
    if interval is not None and not (math.isfinite(interval) and interval >= 0):
        raise InvalidRequest(f"interval must be a finite number >= 0 s, got {interval!r}")
    _arm(sim._trickling, stream_id, interval)


def _arm(armed: dict[str, _V], stream_id: str, value: _V | None) -> None:
    """Arm a per-stream behaviour with ``value``; 0 or None turns it off."""
    if value:
        armed[stream_id] = value
    else:
        armed.pop(stream_id, None)


@_route("POST", "streams/{id}/redirect", ("location", "location", str))
def redirect_stream(sim: UpstreamSimulator, stream_id: str, location: str | None) -> None:
    """Answer every handshake for ``stream_id`` with ``302 Location: location``.

    ``None`` turns the redirect off. The location is sent as given (absolute or relative),
    so a test can point it anywhere, including at a host the fleet must refuse::

        sim.redirect_stream("s1", "ws://127.0.0.2:9/s1")
    """
    if location is None:
        sim._redirects.pop(stream_id, None)
    else:
        sim._redirects[stream_id] = location


@_route("GET", "streams/{id}/redirects", key="served")
def redirects_served(sim: UpstreamSimulator, stream_id: str) -> int:
    """How many handshakes for ``stream_id`` were answered with a redirect."""
    return sim._redirects_served[stream_id]


@_route(
    "POST",
    "streams/{id}/shape",
    ("kind", "kind", str),
    ("header", "header", str),
    ("value", "value", str),
    ("field", "field", str),
)
def set_shape(
    sim: UpstreamSimulator,
    stream_id: str,
    kind: str | Shape,
    *,
    header: str | None = None,
    value: str | None = None,
    field: str | None = None,
) -> None:
    """Give ``stream_id`` a :class:`Shape` (applies from the next handshake).

    ``header_auth`` needs ``header`` and ``value``; ``subscribe`` reads the resume position
    from the message field ``field`` (default ``from_seq``)::

        sim.set_shape("s1", "header_auth", header="Authorization", value="Bearer t0k3n")
    """
    shape = _parse_enum(Shape, kind, "shape")
    if shape is Shape.HEADER_AUTH and not (header and value is not None):
        raise InvalidRequest("header_auth needs a header and a value")
    if shape is Shape.PLAIN:
        sim._shapes.pop(stream_id, None)
        return
    sim._shapes[stream_id] = _ShapeConfig(shape, header or "", value or "", field or RESUME_PARAM)


@_route("GET", "streams/{id}/auth_rejects", key="rejected")
def auth_rejects(sim: UpstreamSimulator, stream_id: str) -> int:
    """Handshakes of a ``header_auth`` stream answered 401."""
    return sim._auth_rejects[stream_id]


@_route("POST", "streams/{id}/limit", ("kind", "kind", str), ("account", "account", str))
def limit_sessions(
    sim: UpstreamSimulator, stream_id: str, kind: str | SessionLimit, *, account: str | None = None
) -> None:
    """Give ``stream_id`` a :class:`SessionLimit` (applies from the next handshake). Streams
    given the same ``account`` share it (default: the stream is its own account)::

        sim.limit_sessions("s1", "one")        # a second session is refused (409)
        sim.limit_sessions("s2", "cut_first")  # a second session cuts the first (1008)
    """
    limit = _parse_enum(SessionLimit, kind, "session limit")
    if limit is SessionLimit.MANY:
        sim._limits.pop(stream_id, None)
        return
    sim._limits[stream_id] = _LimitConfig(limit, account or stream_id)


@_route("POST", "streams/{id}/mute", ("on", "on", bool))
def mute_stream(sim: UpstreamSimulator, stream_id: str, on: bool) -> None:
    """While ``on``, sessions of ``stream_id`` that open send nothing (not even what they owe)
    until it is turned off; then they send from where they would have started. Sessions
    already open are not affected."""
    if on:
        sim._muted.add(stream_id)
    else:
        sim._muted.discard(stream_id)
        sim._wake(stream_id)


@_route("GET", "streams/{id}/refusals", key="refused")
def limit_refusals(sim: UpstreamSimulator, stream_id: str) -> int:
    """Handshakes of ``stream_id`` refused (409) because its account had a session open."""
    return sim._limit_refusals[stream_id]


@_route("GET", "events", ("stream", "stream_id", str), key="events")
def events(sim: UpstreamSimulator, stream_id: str | None = None) -> list[SessionEvent]:
    """The ordered event log (oldest first), optionally of one stream."""
    return [e for e in sim._events if stream_id is None or e.stream_id == stream_id]


def _to_wire(route: _Route, result: Any) -> Any:
    if isinstance(result, list):
        result = [r.to_dict() if isinstance(r, SessionRecord | SessionEvent) else r for r in result]
    if route.key is not None:
        return {route.key: result}
    return {"ok": True} if result is None else result


def _from_wire(route: _Route, payload: Any) -> Any:
    result = payload if route.key is None else payload[route.key]
    if route.key == "sessions":
        return [SessionRecord.from_dict(item) for item in result]
    if route.key == "events":
        return [SessionEvent(**item) for item in result]
    return None if result == {"ok": True} else result


def _match_route(method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    """The operation a /_sim request names, with its stream id (if in the path), or None."""
    for name, route in _ROUTES.items():
        match = re.fullmatch(route.path.replace("{id}", "([^/]+)"), path)
        if match and route.verb == method:
            return name, {"stream_id": urllib.parse.unquote(match[1])} if match.groups() else {}
    return None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _method(
    operation: Callable[Concatenate[UpstreamSimulator, _P], _R],
) -> Callable[Concatenate[SimulatorControl, _P], _R]:
    """The facade method of ``operation``: ``self._call(name, ...)``, wherever it runs."""
    name = operation.__name__

    @functools.wraps(operation)
    def method(self: SimulatorControl, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self._call(name, *args, **kwargs)  # type: ignore[no-any-return]

    return method


class SimulatorControl:
    """The simulator's control API, wherever it runs: in this loop (:class:`UpstreamSimulator`),
    on a thread's loop (:class:`SimulatorThread`), in another process (:class:`SimulatorClient`).

    Each operation is one free function of the simulator's state (above); a subclass says only
    how to reach it, by :meth:`_call`. The checks (overlaps, failover time) are computed here
    from the session log, so they are the same everywhere.
    """

    @property
    def url(self) -> str:
        """Base URL, ``ws://host:port``."""
        raise NotImplementedError

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        """Run operation ``operation`` (a key of ``_ROUTES``) on the simulator."""
        raise NotImplementedError

    open_stream = _method(open_stream)
    end_stream = _method(end_stream)
    stream_info = _method(stream_info)
    streams = _method(streams)
    sessions = _method(sessions)
    inject_fault = _method(inject_fault)
    inject_hostile = _method(inject_hostile)
    poison_stream = _method(poison_stream)
    creep_stream = _method(creep_stream)
    trickle_stream = _method(trickle_stream)
    redirect_stream = _method(redirect_stream)
    redirects_served = _method(redirects_served)
    set_shape = _method(set_shape)
    auth_rejects = _method(auth_rejects)
    limit_sessions = _method(limit_sessions)
    limit_refusals = _method(limit_refusals)
    mute_stream = _method(mute_stream)
    events = _method(events)

    def url_for(self, stream_id: str) -> str:
        """WebSocket URL of one stream (append ``?from_seq=N`` to resume)."""
        return f"{self.url}/{urllib.parse.quote(stream_id, safe='')}"

    def current_seq(self, stream_id: str) -> int:
        """Latest seq produced on ``stream_id`` (0 if nothing yet or the stream is unknown)."""
        try:
            return int(self.stream_info(stream_id)["current_seq"])
        except UnknownStream:
            return 0

    def open_sessions(self, stream_id: str | None = None) -> list[SessionRecord]:
        """Snapshots of the sessions still open, optionally for one stream."""
        return self.sessions(stream_id, open_only=True)

    def overlaps(self, stream_id: str) -> list[tuple[SessionRecord, SessionRecord]]:
        """Pairs of sessions on ``stream_id`` that were open at the same time."""
        return find_overlaps(self.sessions(stream_id))

    def first_frame_at(self, stream_id: str, after: float) -> float | None:
        """Wall time of the first frame sent by a session opened after ``after`` (or None)."""
        return first_frame_after(self.sessions(stream_id), after)

    def open_together(self, stream_id: str) -> list[tuple[int, int]]:
        """Session pairs of ``stream_id`` open at once, in the upstream's own event order."""
        return open_together(self.events(stream_id))


# --------------------------------------------------------------------------------------------
# Shell: the asyncio server


class _SimConnection(ServerConnection):
    """A websockets server connection that is also its session: the stream it asked for, its
    log record, the event that interrupts the sender's sleep.

    ``connection_lost`` tells the simulator the moment the socket is gone. Without it a sender
    asleep until its next frame (a second away at 1 frame/s) would notice a dead client only at
    that send, and the session log would show it open for too long, i.e. a false overlap with
    the client that replaced it.
    """

    target: tuple[str, int | None] | None = None  # (stream id, from_seq), set by the handshake
    record: SessionRecord
    wake: asyncio.Event
    on_lost: Callable[[], None] | None = None
    account: str | None = None  # set when its stream has a session limit
    #: hostile frames armed while this session was open, still to send (kind, size, n)
    hostile: deque[tuple[HostileFrame, int, int]]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost()


def _json_response(connection: ServerConnection, status: int, payload: Any) -> Response:
    response = connection.respond(status, json.dumps(payload))
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


def _format_peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


class UpstreamSimulator(SimulatorControl):
    """The WebSocket upstream: streams, faults, session log, HTTP control endpoints.

    Not thread-safe: call it from the event loop it was started on (or use
    :class:`SimulatorThread`); the control API is :class:`SimulatorControl`'s. Settings:

    - ``rate``: default frames/s for new streams (overridable per stream).
    - ``buffer_frames``: replay window per stream; older ``from_seq`` values record a gap.
    - ``max_sessions_logged``: the session log keeps the most recent N records.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        rate: float = DEFAULT_RATE,
        buffer_frames: int = DEFAULT_BUFFER_FRAMES,
        max_sessions_logged: int = DEFAULT_MAX_SESSIONS_LOGGED,
    ) -> None:
        if buffer_frames < 1:
            raise InvalidRequest(f"buffer_frames must be >= 1, got {buffer_frames}")
        self.host = host
        self.rate = _check_rate(rate)
        self.buffer_frames = buffer_frames
        self._requested_port = port
        # Per stream id. Faults, redirects and shapes may be armed before the stream is seen.
        self._streams: dict[str, StreamClock] = {}
        self._live: defaultdict[str, set[_SimConnection]] = defaultdict(set)
        self._faults: defaultdict[str, deque[Fault]] = defaultdict(deque)
        self._rejects: Counter[str] = Counter()
        self._redirects: dict[str, str] = {}  # -> Location (see redirect_stream)
        self._redirects_served: Counter[str] = Counter()
        # armed while no session was open: for the next one (kind, size, n)
        self._hostile: defaultdict[str, deque[tuple[HostileFrame, int, int]]] = defaultdict(deque)
        self._poisoned: dict[str, int] = {}  # -> size of every session's first frame
        self._creeping: dict[str, int] = {}  # -> size of the frame after each session's one
        self._trickling: dict[str, float] = {}  # -> seconds between the trickled bytes
        self._shapes: dict[str, _ShapeConfig] = {}  # absent: plain
        self._auth_rejects: Counter[str] = Counter()
        self._limits: dict[str, _LimitConfig] = {}  # absent: many
        self._muted: set[str] = set()  # streams whose new sessions send nothing for now
        self._limit_refusals: Counter[str] = Counter()
        # account -> its sessions from the accepted handshake until the TCP connection is gone
        self._accounts: defaultdict[str, set[_SimConnection]] = defaultdict(set)
        self._events: deque[SessionEvent] = deque(maxlen=2 * max_sessions_logged)
        self._event_ids = itertools.count(1)
        self._hostile_ids = itertools.count(1)
        self._log: deque[SessionRecord] = deque(maxlen=max_sessions_logged)
        self._session_ids = itertools.count(1)
        self._cutting: set[asyncio.Task[None]] = set()
        self._server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start serving. ``port`` is known once this returns."""
        if self._server is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._server = await serve(
            self._handle_session,
            self.host,
            self._requested_port,
            process_request=self._process_request,
            create_connection=_SimConnection,
            compression=None,
            # Accept the first subprotocol a client offers (the offer is logged either way).
            select_subprotocol=lambda _connection, offered: offered[0] if offered else None,
        )

    async def stop(self) -> None:
        """Stop accepting, close every open session with 1001, wait for the handlers. Idempotent."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful with ``port=0``)."""
        if self._server is None:
            raise SimulatorError("the simulator is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        return _ROUTES[operation].operation(self, *args, **kwargs)

    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else time.monotonic()

    def _clock(self, stream_id: str) -> StreamClock:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise UnknownStream(stream_id) from None

    def _wake(self, stream_id: str) -> None:
        for ws in self._live.get(stream_id, ()):
            ws.wake.set()

    def _session_limit(self, stream_id: str) -> _LimitConfig:
        return self._limits.get(stream_id) or _LimitConfig(SessionLimit.MANY, stream_id)

    def _log_event(self, stream_id: str, session_id: int, event: str) -> None:
        self._events.append(
            SessionEvent(next(self._event_ids), time.time(), stream_id, session_id, event)
        )

    def _admit(self, connection: _SimConnection, stream_id: str) -> bool:
        """Apply the stream's session limit to a handshake about to be accepted: False if it
        must be refused (``one``: another session of its account is open)."""
        config = self._limits.get(stream_id)
        if config is None:
            return True
        if config.limit is SessionLimit.ONE and self._accounts[config.account]:
            self._limit_refusals[stream_id] += 1
            self._log_event(stream_id, 0, "refused")
            return False
        connection.account = config.account
        self._accounts[config.account].add(connection)
        connection.on_lost = functools.partial(self._connection_lost, connection)
        return True

    def _connection_lost(self, ws: _SimConnection) -> None:
        if ws.account is not None:
            self._accounts[ws.account].discard(ws)
        if hasattr(ws, "record"):
            self._session_lost(ws)

    def _cut_others(self, ws: _SimConnection) -> None:
        """``cut_first``: begin closing every other open session of ``ws``'s account."""
        config = self._limits.get(ws.record.stream_id)
        if config is None or config.limit is not SessionLimit.CUT_FIRST or ws.account is None:
            return
        for other in list(self._accounts[ws.account]):
            if other is ws or not hasattr(other, "record") or not other.record.is_open:
                continue
            other.record.faults = (*other.record.faults, "cut")
            self._log_event(other.record.stream_id, other.record.session_id, "cut")
            task = asyncio.get_running_loop().create_task(other.close(CUT_CODE, CUT_REASON))
            self._cutting.add(task)
            task.add_done_callback(self._cutting.discard)

    # -- HTTP --------------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer /_sim control requests; validate stream requests; apply redirects, header
        auth and ``reject`` faults."""
        raw_path, _, raw_query = request.path.partition("?")
        query = urllib.parse.parse_qs(raw_query, keep_blank_values=True)
        if raw_path == CONTROL_PREFIX or raw_path.startswith(CONTROL_PREFIX + "/"):
            return self._control(connection, request.method, raw_path, query)
        if "Upgrade" not in request.headers:
            return None  # plain HTTP to a stream path: websockets answers 426 Upgrade Required
        stream_id = urllib.parse.unquote(raw_path.removeprefix("/"))
        try:
            if not stream_id:
                raise InvalidRequest("the path must name a stream: /<stream_id>")
            from_seq = _param(query, RESUME_PARAM, int)
        except InvalidRequest as exc:
            return _json_response(connection, http.HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        if stream_id in self._redirects:
            self._redirects_served[stream_id] += 1
            response = connection.respond(http.HTTPStatus.FOUND, "redirected\n")
            response.headers["Location"] = self._redirects[stream_id]
            return response
        config = self._shapes.get(stream_id)
        if (
            config is not None
            and config.shape is Shape.HEADER_AUTH
            and request.headers.get(config.header) != config.value
        ):
            self._auth_rejects[stream_id] += 1
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong credential\n")
        if self._rejects.get(stream_id, 0) > 0:
            self._rejects[stream_id] -= 1
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE, "rejected by an injected fault\n"
            )
        assert isinstance(connection, _SimConnection)
        if not self._admit(connection, stream_id):
            return connection.respond(
                http.HTTPStatus.CONFLICT, "another session of this account is open\n"
            )
        connection.target = (stream_id, from_seq)
        return None

    def _control(
        self, connection: ServerConnection, method: str, raw_path: str, query: _Query
    ) -> Response:
        """Answer a /_sim request: the operation its path names, its arguments from the query."""
        found = _match_route(method, raw_path.removeprefix(CONTROL_PREFIX + "/"))
        if found is None:
            if method in ("GET", "POST"):
                status, error = http.HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {raw_path}"
            else:
                status, error = http.HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} not allowed"
            return _json_response(connection, status, {"error": error})
        name, kwargs = found
        route = _ROUTES[name]
        try:
            kwargs.update({arg: _param(query, wire, kind) for wire, arg, kind in route.params})
            status, payload = http.HTTPStatus.OK, _to_wire(route, self._call(name, **kwargs))
        except UnknownStream as exc:
            status, payload = http.HTTPStatus.NOT_FOUND, {"error": str(exc)}
        except InvalidRequest as exc:
            status, payload = http.HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        return _json_response(connection, status, payload)

    # -- WebSocket sessions ------------------------------------------------------------------

    async def _handle_session(self, connection: ServerConnection) -> None:
        """The one task per connection: register the session, stream until it ends."""
        assert isinstance(connection, _SimConnection) and connection.target is not None
        assert connection.request is not None
        stream_id, requested_from = connection.target
        opened_here = stream_id not in self._streams
        if opened_here:
            self.open_stream(stream_id)
        clock = self._streams[stream_id]
        config = self._shapes.get(stream_id)
        shape = Shape.PLAIN if config is None else config.shape
        # A stream this session opened has produced nothing it could have missed: it starts at
        # seq 1 (reading its clock again could already count a frame on a busy machine).
        current = 0 if opened_here else clock.current(self._now())
        from_seq = None if shape is Shape.LIVE_ONLY else requested_from
        next_seq, gap = plan_start(from_seq, current, self.buffer_frames)
        headers: dict[str, str] = {}
        for name, value in connection.request.headers.raw_items():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        offered = headers.get("Sec-WebSocket-Protocol", "").split(",")
        connection.record = record = SessionRecord(
            stream_id=stream_id,
            session_id=next(self._session_ids),
            peer=_format_peer(connection.remote_address),
            from_seq=requested_from,
            opened_at=time.time(),
            gap=gap,
            headers=headers,
            query=connection.request.path.partition("?")[2],
            subprotocols=tuple(p.strip() for p in offered if p.strip()),
        )
        self._log.append(record)
        self._log_event(stream_id, record.session_id, "open")
        connection.wake = asyncio.Event()
        connection.hostile = deque()
        self._live[stream_id].add(connection)
        connection.on_lost = functools.partial(self._connection_lost, connection)
        if connection.state is State.CLOSED:  # lost before we could hook it
            self._connection_lost(connection)
        self._cut_others(connection)
        with contextlib.suppress(ConnectionClosed):  # the peer left: _session_lost logged it
            if stream_id in self._muted:
                record.faults = (*record.faults, "muted")
                while stream_id in self._muted and record.is_open:
                    connection.wake.clear()
                    await connection.wake.wait()
                if not record.is_open:
                    return
            if shape is Shape.SUBSCRIBE:
                assert config is not None
                subscribed = await self._await_subscribe(connection, clock, config.field)
                if subscribed is None:
                    return
                next_seq = subscribed
            await self._stream_frames(connection, clock, next_seq)
        await connection.wait_closed()

    async def _await_subscribe(
        self, ws: _SimConnection, clock: StreamClock, field: str
    ) -> int | None:
        """``subscribe`` shape: wait for the client's JSON message; the first seq to send, or
        None if the session ended (a message that is not a JSON object closes it, 1008)."""
        message = await ws.recv()
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        ws.record.subscribe = text
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        wanted = payload.get(field) if isinstance(payload, dict) else "invalid"
        if wanted is not None and (not isinstance(wanted, int) or isinstance(wanted, bool)):
            await ws.close(1008, "subscribe: expected a JSON object with a numeric from_seq")
            return None
        ws.record.from_seq = wanted
        next_seq, ws.record.gap = plan_start(wanted, clock.current(self._now()), self.buffer_frames)
        return next_seq

    def _session_lost(self, ws: _SimConnection) -> None:
        """Close the log record at the moment the socket went away, and wake the sender."""
        record = ws.record
        if not record.is_open:
            return
        record.closed_at = time.time()
        record.close_code = "abort" if ws.close_code in (None, 1006) else ws.close_code
        self._log_event(record.stream_id, record.session_id, "close")
        self._live[record.stream_id].discard(ws)
        ws.wake.set()

    async def _send_frame(self, ws: _SimConnection, seq: int) -> None:
        record = ws.record
        await ws.send(frame_text(record.stream_id, seq))
        if record.first_seq_sent is None:
            record.first_seq_sent = seq
            record.first_frame_at = time.time()
        record.last_seq_sent = seq
        record.frames_sent += 1

    async def _trickle(self, ws: _SimConnection, interval: float) -> None:
        """A fragmented text message, one byte per ``interval``, until the peer leaves."""
        ws.record.faults = (*ws.record.faults, "trickle")

        async def fragments() -> Any:
            yield '{"seq": 0, "data": "'
            while True:
                await asyncio.sleep(interval)
                yield "x"

        await ws.send(fragments())

    async def _send_hostile(
        self, ws: _SimConnection, kind: HostileFrame, size: int, n: int | None = None
    ) -> None:
        n = next(self._hostile_ids) if n is None else n
        ws.record.faults = (*ws.record.faults, f"hostile:{kind.value}:{n}:{size}")
        await ws.send(hostile_frame_text(ws.record.stream_id, kind, n, size))

    async def _apply_fault(self, ws: _SimConnection, fault: Fault) -> bool:
        """Carry out ``fault``; True if the session is over."""
        stream_id = ws.record.stream_id
        ws.record.faults = (*ws.record.faults, fault.value)
        match fault:
            case Fault.DROP:
                ws.transport.abort()
                return True
            case Fault.CLOSE_NORMAL:
                await ws.close(1000, "fault: close_normal")
                return True
            case Fault.CLOSE_ERROR:
                await ws.close(1011, "fault: close_error")
                return True
            case Fault.GARBAGE:
                await ws.send(f"<<garbage for {stream_id}>>")  # deliberately not JSON
            case Fault.NOSEQ:
                await ws.send(json.dumps({"data": f"{stream_id}:noseq"}))
        return False

    async def _stream_frames(self, ws: _SimConnection, clock: StreamClock, next_seq: int) -> None:
        """Send due frames, apply faults, sleep until the next frame is due; repeat until closed.

        A poisoned stream's opening frame goes first; armed hostile frames go out as soon as
        they are armed, faults one at a time (each may end the session)."""
        record, stream_id = ws.record, ws.record.stream_id
        if stream_id in self._trickling:
            await self._trickle(ws, self._trickling[stream_id])
            return
        if stream_id in self._poisoned:
            await self._send_hostile(ws, HostileFrame.OPENING, self._poisoned[stream_id])
        if stream_id in self._creeping:
            delay = clock.due_at(next_seq) - self._now()
            if not math.isinf(delay):  # a frozen stream owes nothing new: the big frame only
                await asyncio.sleep(max(0.0, delay))
                await self._send_frame(ws, next_seq)
            await self._send_hostile(ws, HostileFrame.OPENING, self._creeping[stream_id])
            return
        while record.is_open:
            if self._hostile.get(stream_id):  # armed before this session: it is the next one
                ws.hostile.extend(self._hostile.pop(stream_id))
            if ws.hostile:
                while ws.hostile:
                    kind, size, n = ws.hostile.popleft()
                    await self._send_hostile(ws, kind, size, n)
                continue
            if self._faults.get(stream_id):
                if await self._apply_fault(ws, self._faults[stream_id].popleft()):
                    return
                continue
            now = self._now()
            current = clock.current(now)
            if next_seq <= current:
                last = min(current, next_seq + SEND_BATCH_FRAMES - 1)
                for seq in range(next_seq, last + 1):
                    await self._send_frame(ws, seq)
                next_seq = last + 1
                await asyncio.sleep(0)  # a long replay must not starve other sessions
                continue
            if clock.max_seq is not None and next_seq > clock.max_seq:
                await ws.close(1000, "end of stream")
                return
            delay = clock.due_at(next_seq) - now
            ws.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(
                    None if math.isinf(delay) else max(delay, _MIN_SLEEP_SECONDS)
                ):
                    await ws.wake.wait()


# --------------------------------------------------------------------------------------------
# The simulator on its own loop in a daemon thread, for synchronous tests and tools


class SimulatorThread(SimulatorControl, Service):
    """Run an :class:`UpstreamSimulator` in a daemon thread, for synchronous tests and tools.

    Every operation runs on the simulator's loop and waits for the result, so it is safe to
    call from any thread::

        with SimulatorThread(rate=100) as sim:
            with websockets.sync.client.connect(sim.url_for("s1")) as ws:
                ws.recv()
            assert sim.sessions("s1")[0].frames_sent == 1
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **settings: Any) -> None:
        self.sim = UpstreamSimulator(host, port, **settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and wait until the server is listening (re-raises start errors)."""
        if self._thread is not None:
            return
        listening: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(listening,), name="upstream-simulator", daemon=True
        )
        self._thread.start()
        listening.result(timeout)

    def stop(
        self,
        timeout: float = 30.0,
        *,
        join: Callable[[threading.Thread, float], None] = threading.Thread.join,
    ) -> None:
        """Stop the simulator (sessions close with 1001) and join the thread. Idempotent.

        ``join`` waits for the thread (:meth:`StopSignals.join` gives up on a second signal)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        join(thread, timeout)
        self._thread = None

    def _run(self, listening: concurrent.futures.Future[None]) -> None:
        async def serve_until_stop() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await self.sim.start()
            listening.set_result(None)
            try:
                await self._stop.wait()
            finally:
                await self.sim.stop()

        try:
            asyncio.run(serve_until_stop())
        except BaseException as exc:
            if listening.done():
                raise  # after start: the thread's excepthook reports it
            listening.set_exception(exc)  # start() raises it

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop
        if loop is None or self._thread is None:
            raise SimulatorError("the simulator thread is not running")

        async def call() -> Any:
            return self.sim._call(operation, *args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=30)

    @property
    def port(self) -> int:
        return self.sim.port

    @property
    def url(self) -> str:
        return self.sim.url


# --------------------------------------------------------------------------------------------
# A simulator in another process, over /_sim (stdlib only)


class SimulatorClient(SimulatorControl):
    """Drive and inspect a simulator running in another process, over its /_sim endpoints.

    ``base_url`` may be the ws:// URL the simulator printed; it is turned into http://::

        client = SimulatorClient("ws://127.0.0.1:8765")
        client.inject_fault("s1", "drop")
        assert not client.overlaps("s1")
    """

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        self.ws_url = urllib.parse.urlunsplit(
            ({"http": "ws", "https": "wss"}[scheme], parts.netloc, "", "", "")
        )
        self.http_url = urllib.parse.urlunsplit((scheme, parts.netloc, "", "", ""))
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.ws_url

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        route = _ROUTES[operation]
        bound = inspect.signature(route.operation).bind(None, *args, **kwargs).arguments
        path = route.path.replace(
            "{id}", urllib.parse.quote(str(bound.get("stream_id", "")), safe="")
        )
        # None and False are left out; True is "1" (what the server's flags accept).
        # (Compared by identity: ``0 == False``, and a max_seq of 0 must be sent.)
        params = {wire: bound.get(arg) for wire, arg, _kind in route.params}
        sent = {k: "1" if v is True else v for k, v in params.items() if v is not None}
        query = urllib.parse.urlencode({k: v for k, v in sent.items() if v is not False})
        return _from_wire(route, self._request(route.verb, path, query))

    def _request(self, method: str, path: str, query: str) -> Any:
        url = f"{self.http_url}{CONTROL_PREFIX}/{path}" + (f"?{query}" if query else "")

        def failed(status: int | None, reason: str, body: bytes) -> SimulatorError:
            detail = body.decode(errors="replace")
            if status is None:
                return SimulatorError(f"{method} {url} failed: {reason}")
            if status == http.HTTPStatus.NOT_FOUND and path.startswith("streams/"):
                return UnknownStream(urllib.parse.unquote(path.split("/")[1]))
            if status == http.HTTPStatus.BAD_REQUEST:
                return InvalidRequest(detail)
            return SimulatorError(f"{method} {url} -> HTTP {status}: {detail}")

        return call_json(method, url, timeout=self.timeout, failed=failed)


# --------------------------------------------------------------------------------------------
# Command line: python -m wsfleet_local.simulator


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground: one JSON line ``{"url": ...}`` once listening, then until
    SIGTERM/SIGINT (or stdin EOF when asked). Returns 0 after a graceful stop (open sessions
    closed with 1001), 1 when a second signal cut the stop short."""
    parser = argparse.ArgumentParser(
        prog="python -m wsfleet_local.simulator",
        description="Run the upstream WebSocket simulator in the foreground.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="frames/s per stream")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (parent died)"
    )
    args = parser.parse_args(argv)
    simulator = SimulatorThread(args.host, args.port, rate=args.rate)
    with StopSignals() as stop:
        simulator.start()
        try:
            serve_until_stopped(
                {"url": simulator.url}, stop, exit_on_stdin_eof=args.exit_on_stdin_eof
            )
        finally:
            simulator.stop(join=stop.join)
    if stop.force_exit:
        print("simulator: forced stop", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
