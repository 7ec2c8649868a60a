"""A fake upstream: a WebSocket server that streams numbered frames, for tests, demos and chaos.

wsfleet workers are WebSocket *clients*; this module is the server they connect to. It stands in
for a real upstream feed so we can check, from outside, that the fleet kept every stream alive,
resumed without gaps and never had two owners at once.

What a stream looks like
    ``GET /<stream_id>?from_seq=N`` upgrades to WebSocket. Each stream has a live sequence that
    starts when the stream is first seen (first connection or :meth:`UpstreamSimulator.open_stream`)
    and produces seq 1, 2, 3, ... at ``rate`` frames per second *whether or not anyone is
    connected*, like a real feed. Frames are JSON text, ``{"seq": n, "data": "<stream_id>:<n>"}``:
    the content is a function of (stream, seq), so a checker can verify what the fleet stored
    without asking the simulator (see :func:`frame_data`).

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
    change, the end of the stream, the peer going away). Compression is off by default: a
    permessage-deflate context costs far more memory per connection than the frames ever will.

Faults (one-shot, per stream; :class:`Fault`)
    ``drop`` aborts the TCP connection without a close frame, ``close_normal`` closes 1000,
    ``close_error`` closes 1011, ``garbage`` sends one non-JSON text frame, ``noseq`` sends one
    JSON frame without ``seq`` (both then continue), ``reject`` answers the next handshake with
    HTTP 503. A fault applies to a session open on the stream now, else to the next one.

Introspection
    Every accepted session is logged as a :class:`SessionRecord` (bounded log). Checkers use
    :meth:`~UpstreamSimulator.overlaps` (two sessions of one stream open at the same time: a
    split brain) and :meth:`~UpstreamSimulator.first_frame_at` (when streaming resumed after a
    failover). The same data is served over plain HTTP on the WebSocket port, so another
    process can read it with :class:`SimulatorClient`::

        GET  /_sim/streams                    {"streams": {id: {...stream info...}}}
        GET  /_sim/streams/<id>               one stream's info (404 if never seen)
        GET  /_sim/sessions?stream=<id>&open=1 {"sessions": [...session records...]}
        POST /_sim/streams/<id>/fault?kind=drop
        POST /_sim/streams/<id>/end           max_seq = current: the stream ends normally
        POST /_sim/streams/<id>/open?rate=R&max_seq=M

Redirects (for the worker's SSRF guard)
    :meth:`~UpstreamSimulator.redirect_stream` makes every handshake of a stream answer
    ``302 Location: <url>`` instead of upgrading, like a hostile or misconfigured upstream.
    The handshake is still logged in :meth:`~UpstreamSimulator.redirects_served`.

Hostile frames (for the worker's frame parsing, size limits and crash-loop breaker)
    :meth:`~UpstreamSimulator.inject_hostile` arms a one-shot :class:`HostileFrame` (a
    40-digit seq, a 30-digit string seq, seq 2^53, a non-ASCII frame of exactly ``size`` UTF-8
    bytes without a seq) sent like a fault frame: on a session open now, else the next one;
    the stream then continues. :meth:`~UpstreamSimulator.poison_stream` makes *every* session
    of a stream open with a ``size``-byte frame (over the worker's limit: a crash loop). Each
    is listed in the session's ``faults`` as ``hostile:<kind>:<n>:<size>``, from which
    :func:`hostile_frame_data` gives back the data a worker should have stored::

        POST /_sim/streams/<id>/hostile?kind=huge_seq&size=N
        POST /_sim/streams/<id>/poison?size=N            (size 0 turns it off)
        POST /_sim/streams/<id>/redirect?location=<url>  (no location turns it off)
        GET  /_sim/streams/<id>/redirects                {"served": n}

Shapes (per stream, :class:`Shape`; for the worker's handshake options and resume modes)
    ``plain`` (the default) is the above. ``header_auth`` answers a handshake with HTTP 401
    unless it carries the configured header with the configured value (like an API that
    wants ``Authorization: Bearer ...``). ``subscribe`` sends nothing until the client's first
    message, a JSON object; its ``from_seq`` field (number or null) says where to resume, like
    ``?from_seq=`` does for ``plain``. ``live_only`` ignores any ``from_seq``: every session
    starts at the next live frame, so frames produced while nobody listened are gone (the
    fleet must *report* that gap). Every session record keeps the handshake headers, the
    subprotocols offered and the subscribe message received, so a test can check them::

        POST /_sim/streams/<id>/shape?kind=header_auth&header=Authorization&value=Bearer%20x
        GET  /_sim/streams/<id>/auth_rejects                 {"rejected": n}

Example::

    async with UpstreamSimulator(rate=50) as sim:
        async with websockets.connect(sim.url_for("s1") + "?from_seq=1") as ws:
            assert json.loads(await ws.recv()) == {"seq": 1, "data": "s1:1"}

One control API, three places to run it
    Each control operation (open, end, fault, hostile, poison, redirect, shape, the session
    log, ...) is written once, as a free function of the simulator's state, and its route over
    /_sim once, in a table. :class:`SimulatorControl` turns each into a method; its subclasses
    only say how to reach the simulator: :class:`UpstreamSimulator` in this event loop,
    :class:`SimulatorThread` on its own loop in a daemon thread (for synchronous code),
    :class:`SimulatorClient` in another process over HTTP.

``python -m wsfleet_local.simulator --port 0`` runs it in the foreground, the way every local
child serves (:func:`wsfleet_local.procs.serve_until_stopped`): one JSON line ``{"url": ...}``
once listening, a graceful stop on SIGTERM/SIGINT, a forced one on a second signal.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import enum
import functools
import http
import inspect
import itertools
import json
import math
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from wsfleet.exceptions import WsfleetError

from .procs import Service, StopSignals, serve_until_stopped

__all__ = [
    "Fault",
    "HostileFrame",
    "InvalidRequest",
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

    DROP = "drop"
    CLOSE_NORMAL = "close_normal"
    CLOSE_ERROR = "close_error"
    GARBAGE = "garbage"
    NOSEQ = "noseq"
    REJECT = "reject"

    @classmethod
    def parse(cls, kind: str | Fault) -> Fault:
        """``Fault(kind)``, raising :class:`InvalidRequest` with the valid kinds listed."""
        return _enum_member(cls, kind, "fault kind")


_Member = TypeVar("_Member", bound=enum.StrEnum)


def _enum_member(cls: type[_Member], value: str, what: str) -> _Member:
    """``cls(value)``, or :class:`InvalidRequest` listing the valid values."""
    try:
        return cls(value)
    except ValueError:
        valid = ", ".join(member.value for member in cls)
        raise InvalidRequest(f"unknown {what} {value!r} (expected one of: {valid})") from None


class Shape(enum.StrEnum):
    """How a stream talks to its clients (see the module docstring)."""

    PLAIN = "plain"
    HEADER_AUTH = "header_auth"
    SUBSCRIBE = "subscribe"
    LIVE_ONLY = "live_only"

    @classmethod
    def parse(cls, kind: str | Shape) -> Shape:
        return _enum_member(cls, str(kind), "shape")


@dataclasses.dataclass(frozen=True, slots=True)
class _ShapeConfig:
    shape: Shape
    header: str = ""
    value: str = ""
    field: str = RESUME_PARAM  # subscribe: the message field holding the resume position


class HostileFrame(enum.StrEnum):
    """One-shot hostile frames (see the module docstring); none carries a usable seq."""

    HUGE_SEQ = "huge_seq"  # a 40-digit JSON integer
    DIGITS_SEQ = "digits_seq"  # a 30-digit string
    OUT_OF_RANGE_SEQ = "out_of_range_seq"  # 2**53: one past the safe integers
    MAX_SIZE = "max_size"  # exactly ``size`` UTF-8 bytes of mostly non-ASCII, no seq
    OPENING = "opening"  # what poison_stream sends first on every session (no seq)

    @classmethod
    def parse(cls, kind: str | HostileFrame) -> HostileFrame:
        return _enum_member(cls, kind, "hostile frame")


#: Size of a MAX_SIZE frame when none is given: the worker's default WORKER_MAX_FRAME_BYTES.
DEFAULT_HOSTILE_FRAME_BYTES = 393_216
_SEQ_OF = {
    HostileFrame.HUGE_SEQ: 10**40,
    HostileFrame.DIGITS_SEQ: "9" * 30,
    HostileFrame.OUT_OF_RANGE_SEQ: 2**53,
}


def hostile_frame_data(stream_id: str, kind: str | HostileFrame, n: int, size: int) -> str:
    """The ``data`` of hostile frame number ``n``: what a worker must store for it (or a marker
    of it). Sized frames are padded with two-byte characters to exactly ``size`` bytes."""
    kind = HostileFrame.parse(kind)
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
    kind = HostileFrame.parse(kind)
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


def garbage_text(stream_id: str) -> str:
    """The text of a ``garbage`` fault frame: deliberately not JSON."""
    return f"<<garbage for {stream_id}>>"


def noseq_text(stream_id: str) -> str:
    """The text of a ``noseq`` fault frame: valid JSON, no ``seq``."""
    return json.dumps({"data": f"{stream_id}:noseq"})


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
        """JSON-ready dict (the /_sim/sessions wire format)."""
        data = dataclasses.asdict(self)
        data["faults"] = list(self.faults)
        data["subprotocols"] = list(self.subprotocols)
        return data

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


# --------------------------------------------------------------------------------------------
# Request routing (pure): what an HTTP request path asks for


@dataclasses.dataclass(frozen=True, slots=True)
class _StreamTarget:
    stream_id: str
    from_seq: int | None


def _query_value(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _int_param(query: dict[str, list[str]], name: str) -> int | None:
    raw = _query_value(query, name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer, got {raw!r}") from None


def _float_param(query: dict[str, list[str]], name: str) -> float | None:
    raw = _query_value(query, name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a number, got {raw!r}") from None


def _parse_stream_path(raw_path: str, query: dict[str, list[str]]) -> _StreamTarget:
    stream_id = urllib.parse.unquote(raw_path.removeprefix("/"))
    if not stream_id:
        raise InvalidRequest("the path must name a stream: /<stream_id>")
    return _StreamTarget(stream_id, _int_param(query, RESUME_PARAM))


def _is_control_path(raw_path: str) -> bool:
    return raw_path == CONTROL_PREFIX or raw_path.startswith(CONTROL_PREFIX + "/")


def _json_response(status: http.HTTPStatus, payload: Any) -> Response:
    body = json.dumps(payload).encode()
    headers = Headers(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


# --------------------------------------------------------------------------------------------
# Shell: the asyncio server


class _SimConnection(ServerConnection):
    """A websockets server connection that tells the simulator the moment its socket is gone.

    Without this hook a sender asleep until its next frame (a second away at 1 frame/s) would
    notice a dead client only at that send, and the session log would show it open for too
    long, i.e. a false overlap with the client that replaced it.
    """

    target: _StreamTarget | None = None
    on_lost: Callable[[], None] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost()


@dataclasses.dataclass(eq=False, slots=True)
class _LiveSession:
    """An open session: its log record, its socket, and the event that interrupts its sleep."""

    record: SessionRecord
    ws: _SimConnection
    wake: asyncio.Event
    closed: bool = False


def _format_peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


# --------------------------------------------------------------------------------------------
# The control API, written once: each operation is a free function of a simulator's state;
# the facade (SimulatorControl) makes each one a method that runs wherever the simulator is
# (this loop, a thread's loop, another process over /_sim). All run on the simulator's loop.


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


def end_stream(sim: UpstreamSimulator, stream_id: str) -> dict[str, Any]:
    """Freeze the stream at its current seq; sessions send what they still owe, then 1000.
    Returns its info."""
    clock, now = sim._clock(stream_id), sim._now()
    clock.set_max_seq(clock.current(now), now)
    sim._wake(stream_id)
    return stream_info(sim, stream_id)


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
    }


def streams(sim: UpstreamSimulator) -> dict[str, dict[str, Any]]:
    """Info for every stream seen so far, keyed by stream id."""
    return {stream_id: stream_info(sim, stream_id) for stream_id in sim._streams}


def sessions(
    sim: UpstreamSimulator, stream_id: str | None = None, *, open_only: bool = False
) -> list[SessionRecord]:
    """Snapshots of logged sessions (oldest first), optionally of one stream or only open."""
    return [
        dataclasses.replace(r)
        for r in sim._log
        if (stream_id is None or r.stream_id == stream_id) and not (open_only and not r.is_open)
    ]


def inject_fault(sim: UpstreamSimulator, stream_id: str, kind: str | Fault) -> None:
    """Arm a one-shot fault on a session open now, else on the next session (or handshake)."""
    fault = Fault.parse(kind)
    if fault is Fault.REJECT:
        sim._rejects[stream_id] += 1
        return
    sim._faults.setdefault(stream_id, collections.deque()).append(fault)
    sim._wake(stream_id)


def inject_hostile(
    sim: UpstreamSimulator, stream_id: str, kind: str | HostileFrame, *, size: int | None = None
) -> None:
    """Arm a one-shot hostile frame, sent like a fault frame (the stream then continues)."""
    frame = HostileFrame.parse(kind)
    if size is not None and size < 0:
        raise InvalidRequest(f"size must be >= 0, got {size}")
    if frame is not HostileFrame.MAX_SIZE:
        size = 0
    elif size is None:
        size = DEFAULT_HOSTILE_FRAME_BYTES
    sim._hostile.setdefault(stream_id, collections.deque()).append((frame, size))
    sim._wake(stream_id)


def poison_stream(sim: UpstreamSimulator, stream_id: str, size: int) -> None:
    """Every later session of ``stream_id`` first gets a ``size``-byte frame (0: off)."""
    if size < 0:
        raise InvalidRequest(f"size must be >= 0, got {size}")
    if size:
        sim._poisoned[stream_id] = size
    else:
        sim._poisoned.pop(stream_id, None)


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


def redirects_served(sim: UpstreamSimulator, stream_id: str) -> int:
    """How many handshakes for ``stream_id`` were answered with a redirect."""
    return sim._redirects_served[stream_id]


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
    shape = Shape.parse(kind)
    if shape is Shape.HEADER_AUTH and not (header and value is not None):
        raise InvalidRequest("header_auth needs a header and a value")
    if shape is Shape.PLAIN:
        sim._shapes.pop(stream_id, None)
        return
    sim._shapes[stream_id] = _ShapeConfig(shape, header or "", value or "", field or RESUME_PARAM)


def auth_rejects(sim: UpstreamSimulator, stream_id: str) -> int:
    """Handshakes of a ``header_auth`` stream answered 401."""
    return sim._auth_rejects[stream_id]


_P = ParamSpec("_P")
_R = TypeVar("_R")
_OPERATIONS: dict[str, Callable[..., Any]] = {}


def _operation(
    fn: Callable[Concatenate[UpstreamSimulator, _P], _R],
) -> Callable[Concatenate[SimulatorControl, _P], _R]:
    """The facade method of operation ``fn``: ``self._call(name, ...)``, wherever it runs."""
    name = fn.__name__
    _OPERATIONS[name] = fn

    @functools.wraps(fn)
    def method(self: SimulatorControl, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self._call(name, *args, **kwargs)  # type: ignore[no-any-return]

    return method


def _text(query: dict[str, list[str]], name: str) -> str:
    return _query_value(query, name) or ""


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return _query_value(query, name) in ("1", "true")


def _count(query: dict[str, list[str]], name: str) -> int:
    return _int_param(query, name) or 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Endpoint:
    """How one operation travels over /_sim: ``SimulatorClient`` builds the request from it,
    the simulator's server parses it back into the same call."""

    verb: str
    path: str  # below /_sim/; "{id}" is the (quoted) stream id, the operation's first argument
    #: (query parameter, keyword argument, parser of the parameter on the server side)
    params: tuple[tuple[str, str, Callable[[dict[str, list[str]], str], Any]], ...] = ()
    key: str | None = None  # the answer is {key: result}; else the result, or {"ok": true}


_ENDPOINTS: dict[str, _Endpoint] = {
    "streams": _Endpoint("GET", "streams", key="streams"),
    "stream_info": _Endpoint("GET", "streams/{id}"),
    "sessions": _Endpoint(
        "GET",
        "sessions",
        (("stream", "stream_id", _query_value), ("open", "open_only", _flag)),
        key="sessions",
    ),
    "open_stream": _Endpoint(
        "POST",
        "streams/{id}/open",
        (("rate", "rate", _float_param), ("max_seq", "max_seq", _int_param)),
    ),
    "end_stream": _Endpoint("POST", "streams/{id}/end"),
    "inject_fault": _Endpoint("POST", "streams/{id}/fault", (("kind", "kind", _text),)),
    "inject_hostile": _Endpoint(
        "POST", "streams/{id}/hostile", (("kind", "kind", _text), ("size", "size", _int_param))
    ),
    "poison_stream": _Endpoint("POST", "streams/{id}/poison", (("size", "size", _count),)),
    "redirect_stream": _Endpoint(
        "POST", "streams/{id}/redirect", (("location", "location", _query_value),)
    ),
    "redirects_served": _Endpoint("GET", "streams/{id}/redirects", key="served"),
    "set_shape": _Endpoint(
        "POST",
        "streams/{id}/shape",
        (
            ("kind", "kind", _text),
            ("header", "header", _query_value),
            ("value", "value", _query_value),
            ("field", "field", _query_value),
        ),
    ),
    "auth_rejects": _Endpoint("GET", "streams/{id}/auth_rejects", key="rejected"),
}


def _to_wire(endpoint: _Endpoint, result: Any) -> Any:
    if isinstance(result, list):
        result = [r.to_dict() if isinstance(r, SessionRecord) else r for r in result]
    if endpoint.key is not None:
        return {endpoint.key: result}
    return {"ok": True} if result is None else result


def _from_wire(endpoint: _Endpoint, payload: Any) -> Any:
    result = payload if endpoint.key is None else payload[endpoint.key]
    if endpoint.key == "sessions":
        return [SessionRecord.from_dict(item) for item in result]
    return None if result == {"ok": True} else result


def _match_endpoint(method: str, parts: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The operation a /_sim request names, with its stream id (if in the path), or None."""
    for name, endpoint in _ENDPOINTS.items():
        pattern = endpoint.path.split("/")
        if endpoint.verb != method or len(pattern) != len(parts):
            continue
        pairs = list(zip(pattern, parts, strict=True))
        if all(p in ("{id}", part) for p, part in pairs):
            ids = [urllib.parse.unquote(x) for p, x in pairs if p == "{id}"]
            return name, {"stream_id": ids[0]} if ids else {}
    return None


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
        """Run operation ``operation`` (a key of ``_OPERATIONS``) on the simulator."""
        raise NotImplementedError

    open_stream = _operation(open_stream)
    end_stream = _operation(end_stream)
    stream_info = _operation(stream_info)
    streams = _operation(streams)
    sessions = _operation(sessions)
    inject_fault = _operation(inject_fault)
    inject_hostile = _operation(inject_hostile)
    poison_stream = _operation(poison_stream)
    redirect_stream = _operation(redirect_stream)
    redirects_served = _operation(redirects_served)
    set_shape = _operation(set_shape)
    auth_rejects = _operation(auth_rejects)

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


# A new operation needs its route over /_sim too: say so at import, not in a remote call.
if _OPERATIONS.keys() != _ENDPOINTS.keys():
    raise RuntimeError(f"operation or route missing: {_OPERATIONS.keys() ^ _ENDPOINTS.keys()}")


class UpstreamSimulator(SimulatorControl):
    """The WebSocket upstream: streams, faults, session log, HTTP control endpoints.

    Not thread-safe: call it from the event loop it was started on (or use
    :class:`SimulatorThread`); the control API is :class:`SimulatorControl`'s. Settings:

    - ``rate``: default frames/s for new streams (overridable per stream).
    - ``buffer_frames``: replay window per stream; older ``from_seq`` values record a gap.
    - ``max_sessions_logged``: the session log keeps the most recent N records.
    - ``compression``: ``"deflate"`` to negotiate permessage-deflate; off by default (memory).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        rate: float = DEFAULT_RATE,
        buffer_frames: int = DEFAULT_BUFFER_FRAMES,
        max_sessions_logged: int = DEFAULT_MAX_SESSIONS_LOGGED,
        compression: str | None = None,
    ) -> None:
        if buffer_frames < 1:
            raise InvalidRequest(f"buffer_frames must be >= 1, got {buffer_frames}")
        self.host = host
        self.rate = _check_rate(rate)
        self.buffer_frames = buffer_frames
        self._requested_port = port
        self._compression = compression
        self._streams: dict[str, StreamClock] = {}
        self._live: dict[str, set[_LiveSession]] = {}
        self._faults: dict[str, collections.deque[Fault]] = {}
        self._rejects: collections.Counter[str] = collections.Counter()
        self._redirects: dict[str, str] = {}  # stream id -> Location (see redirect_stream)
        self._redirects_served: collections.Counter[str] = collections.Counter()
        self._hostile: dict[str, collections.deque[tuple[HostileFrame, int]]] = {}
        self._poisoned: dict[str, int] = {}  # stream id -> size of every session's first frame
        self._shapes: dict[str, _ShapeConfig] = {}  # absent: plain
        self._auth_rejects: collections.Counter[str] = collections.Counter()
        self._hostile_ids = itertools.count(1)
        self._log: collections.deque[SessionRecord] = collections.deque(maxlen=max_sessions_logged)
        self._session_ids = itertools.count(1)
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
            compression=self._compression,
            # Accept the first subprotocol a client offers (the offer is logged either way).
            select_subprotocol=lambda _connection, offered: offered[0] if offered else None,
        )

    async def stop(self) -> None:
        """Stop accepting, close every open session with 1001, wait for the handlers. Idempotent."""
        server = self._server
        if server is None:
            return
        server.close()
        await server.wait_closed()

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
        """Base URL, ``ws://host:port``."""
        return f"ws://{self.host}:{self.port}"

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        return _OPERATIONS[operation](self, *args, **kwargs)

    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else time.monotonic()

    def _clock(self, stream_id: str) -> StreamClock:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise UnknownStream(stream_id) from None

    def _wake(self, stream_id: str) -> None:
        for session in self._live.get(stream_id, ()):
            session.wake.set()

    # -- HTTP --------------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer /_sim control requests; validate stream requests; apply ``reject`` faults."""
        raw_path, _, raw_query = request.path.partition("?")
        query = urllib.parse.parse_qs(raw_query, keep_blank_values=True)
        if _is_control_path(raw_path):
            return self._control(request.method, raw_path, query)
        if "Upgrade" not in request.headers:
            return None  # plain HTTP to a stream path: websockets answers 426 Upgrade Required
        try:
            target = _parse_stream_path(raw_path, query)
        except InvalidRequest as exc:
            return _json_response(http.HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        if target.stream_id in self._redirects:
            return self._redirect_response(connection, target.stream_id)
        config = self._shapes.get(target.stream_id)
        if (
            config is not None
            and config.shape is Shape.HEADER_AUTH
            and request.headers.get(config.header) != config.value
        ):
            self._auth_rejects[target.stream_id] += 1
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong credential\n")
        if self._rejects.get(target.stream_id, 0) > 0:
            self._rejects[target.stream_id] -= 1
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE, "rejected by an injected fault\n"
            )
        assert isinstance(connection, _SimConnection)
        connection.target = target
        return None

    def _redirect_response(self, connection: ServerConnection, stream_id: str) -> Response:
        self._redirects_served[stream_id] += 1
        response = connection.respond(http.HTTPStatus.FOUND, "redirected\n")
        response.headers["Location"] = self._redirects[stream_id]
        return response

    def _control(self, method: str, raw_path: str, query: dict[str, list[str]]) -> Response:
        """Answer a /_sim request: the operation its path names, its arguments from the query."""
        parts = raw_path.split("/")[2:]
        found = _match_endpoint(method, parts)
        if found is None:
            if method in ("GET", "POST"):
                error = f"no such endpoint: {method} {parts}"
                return _json_response(http.HTTPStatus.NOT_FOUND, {"error": error})
            error = f"method {method} not allowed"
            return _json_response(http.HTTPStatus.METHOD_NOT_ALLOWED, {"error": error})
        name, kwargs = found
        endpoint = _ENDPOINTS[name]
        try:
            kwargs.update({arg: parse(query, wire) for wire, arg, parse in endpoint.params})
            status, payload = http.HTTPStatus.OK, _to_wire(endpoint, self._call(name, **kwargs))
        except UnknownStream as exc:
            status, payload = http.HTTPStatus.NOT_FOUND, {"error": str(exc)}
        except InvalidRequest as exc:
            status, payload = http.HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        return _json_response(status, payload)

    # -- hostile frames ----------------------------------------------------------------------

    async def _send_hostile(self, session: _LiveSession, kind: HostileFrame, size: int) -> None:
        record = session.record
        n = next(self._hostile_ids)
        record.faults = (*record.faults, f"hostile:{kind.value}:{n}:{size}")
        await session.ws.send(hostile_frame_text(record.stream_id, kind, n, size))

    async def _send_pending_hostile(self, session: _LiveSession, opening: bool) -> bool:
        """Send the poisoned opening frame (first call) and any armed hostile frames; True if
        anything was sent."""
        stream_id = session.record.stream_id
        sent = False
        if opening and stream_id in self._poisoned:
            await self._send_hostile(session, HostileFrame.OPENING, self._poisoned[stream_id])
            sent = True
        pending = self._hostile.pop(stream_id, None)
        while pending:
            kind, size = pending.popleft()
            await self._send_hostile(session, kind, size)
            sent = True
        return sent

    # -- WebSocket sessions ------------------------------------------------------------------

    async def _handle_session(self, connection: ServerConnection) -> None:
        """The one task per connection: register the session, stream until it ends."""
        assert isinstance(connection, _SimConnection) and connection.target is not None
        target = connection.target
        opened_here = target.stream_id not in self._streams
        if opened_here:
            self.open_stream(target.stream_id)
        clock = self._streams[target.stream_id]
        config = self._shapes.get(target.stream_id)
        shape = Shape.PLAIN if config is None else config.shape
        from_seq = None if shape is Shape.LIVE_ONLY else target.from_seq
        # A stream this session opened has produced nothing it could have missed: it starts at
        # seq 1 (reading its clock again could already count a frame on a busy machine).
        current = 0 if opened_here else clock.current(self._now())
        next_seq, gap = plan_start(from_seq, current, self.buffer_frames)
        request = connection.request
        headers: dict[str, str] = {}
        if request is not None:
            for name, value in request.headers.raw_items():
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        record = SessionRecord(
            stream_id=target.stream_id,
            session_id=next(self._session_ids),
            peer=_format_peer(connection.remote_address),
            from_seq=target.from_seq,
            opened_at=time.time(),
            gap=gap,
            headers=headers,
            query=request.path.partition("?")[2] if request is not None else "",
            subprotocols=tuple(
                p.strip()
                for p in headers.get("Sec-WebSocket-Protocol", "").split(",")
                if p.strip()
            ),
        )
        self._log.append(record)
        session = _LiveSession(record, connection, asyncio.Event())
        self._live.setdefault(target.stream_id, set()).add(session)
        connection.on_lost = lambda: self._session_lost(session)
        if connection.state is State.CLOSED:  # lost before we could hook it
            self._session_lost(session)
        with contextlib.suppress(ConnectionClosed):  # the peer left: _session_lost logged it
            if shape is Shape.SUBSCRIBE:
                assert config is not None
                subscribed = await self._await_subscribe(session, clock, config.field)
                if subscribed is None:
                    return
                next_seq = subscribed
            await self._stream_frames(session, clock, next_seq)
        await connection.wait_closed()

    async def _await_subscribe(
        self, session: _LiveSession, clock: StreamClock, field: str
    ) -> int | None:
        """``subscribe`` shape: wait for the client's JSON message; the first seq to send, or
        None if the session ended (a message that is not a JSON object closes it, 1008)."""
        ws, record = session.ws, session.record
        message = await ws.recv()
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        record.subscribe = text
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        wanted = payload.get(field) if isinstance(payload, dict) else "invalid"
        if wanted is not None and (not isinstance(wanted, int) or isinstance(wanted, bool)):
            await ws.close(1008, "subscribe: expected a JSON object with a numeric from_seq")
            return None
        record.from_seq = wanted
        next_seq, record.gap = plan_start(wanted, clock.current(self._now()), self.buffer_frames)
        return next_seq

    def _session_lost(self, session: _LiveSession) -> None:
        """Close the log record at the moment the socket went away, and wake the sender."""
        if session.closed:
            return
        session.closed = True
        code = session.ws.close_code
        session.record.closed_at = time.time()
        session.record.close_code = "abort" if code in (None, 1006) else code
        live = self._live.get(session.record.stream_id)
        if live is not None:
            live.discard(session)
            if not live:
                del self._live[session.record.stream_id]
        session.wake.set()

    def _take_fault(self, stream_id: str) -> Fault | None:
        pending = self._faults.get(stream_id)
        if not pending:
            return None
        fault = pending.popleft()
        if not pending:
            del self._faults[stream_id]
        return fault

    async def _apply_fault(self, session: _LiveSession, fault: Fault) -> bool:
        """Carry out ``fault``; True if the session is over."""
        ws, record = session.ws, session.record
        record.faults = (*record.faults, fault.value)
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
                await ws.send(garbage_text(record.stream_id))
            case Fault.NOSEQ:
                await ws.send(noseq_text(record.stream_id))
        return False

    async def _stream_frames(
        self, session: _LiveSession, clock: StreamClock, next_seq: int
    ) -> None:
        """Send due frames, apply faults, sleep until the next frame is due; repeat until closed."""
        ws, record = session.ws, session.record
        stream_id = record.stream_id
        opening = True
        while not session.closed:
            if await self._send_pending_hostile(session, opening):
                opening = False
                continue
            opening = False
            fault = self._take_fault(stream_id)
            if fault is not None:
                if await self._apply_fault(session, fault):
                    return
                continue
            now = self._now()
            current = clock.current(now)
            if next_seq <= current:
                last = min(current, next_seq + SEND_BATCH_FRAMES - 1)
                for seq in range(next_seq, last + 1):
                    await ws.send(frame_text(stream_id, seq))
                    if record.first_seq_sent is None:
                        record.first_seq_sent = seq
                        record.first_frame_at = time.time()
                    record.last_seq_sent = seq
                    record.frames_sent += 1
                next_seq = last + 1
                await asyncio.sleep(0)  # a long replay must not starve other sessions
                continue
            if clock.max_seq is not None and next_seq > clock.max_seq:
                await ws.close(1000, "end of stream")
                return
            delay = clock.due_at(next_seq) - now
            session.wake.clear()
            try:
                async with asyncio.timeout(
                    None if math.isinf(delay) else max(delay, _MIN_SLEEP_SECONDS)
                ):
                    await session.wake.wait()
            except TimeoutError:
                pass


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
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and wait until the server is listening (re-raises start errors)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="upstream-simulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise SimulatorError(f"simulator did not start within {timeout} s")
        if self._error is not None:
            raise self._error

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

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced to start() if it happened before ready
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self.sim.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.sim.stop()

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        loop = self._loop
        if loop is None or self._thread is None:
            raise SimulatorError("the simulator thread is not running")

        async def call() -> Any:
            return self.sim._call(operation, *args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=30)

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self.sim.port

    @property
    def url(self) -> str:
        """Base URL, ``ws://host:port``."""
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
        """Base URL, ``ws://host:port``."""
        return self.ws_url

    def _call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        endpoint = _ENDPOINTS[operation]
        bound = inspect.signature(_OPERATIONS[operation]).bind(None, *args, **kwargs).arguments
        path = endpoint.path.replace(
            "{id}", urllib.parse.quote(str(bound.get("stream_id", "")), safe="")
        )
        params = {wire: bound.get(arg) for wire, arg, _parse in endpoint.params}
        return _from_wire(endpoint, self._request(endpoint.verb, path, params))

    def _request(self, method: str, path: str, params: dict[str, Any]) -> Any:
        # None and False are left out; True is "1" (what the server's flags accept).
        # (Compared by identity: ``0 == False``, and a max_seq of 0 must be sent.)
        sent = {k: "1" if v is True else v for k, v in params.items() if v is not None}
        query = urllib.parse.urlencode({k: v for k, v in sent.items() if v is not False})
        url = f"{self.http_url}{CONTROL_PREFIX}/{path}" + (f"?{query}" if query else "")
        data = b"" if method == "POST" else None
        request = urllib.request.Request(url, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            if exc.code == http.HTTPStatus.NOT_FOUND and path.startswith("streams/"):
                raise UnknownStream(urllib.parse.unquote(path.split("/")[1])) from exc
            if exc.code == http.HTTPStatus.BAD_REQUEST:
                raise InvalidRequest(detail) from exc
            raise SimulatorError(f"{method} {url} -> HTTP {exc.code}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise SimulatorError(f"{method} {url} failed: {exc.reason}") from exc


# --------------------------------------------------------------------------------------------
# Command line: python -m wsfleet_local.simulator


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m wsfleet_local.simulator",
        description="Run the upstream WebSocket simulator in the foreground.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="frames/s per stream")
    parser.add_argument("--buffer-frames", type=int, default=DEFAULT_BUFFER_FRAMES)
    parser.add_argument("--max-sessions-logged", type=int, default=DEFAULT_MAX_SESSIONS_LOGGED)
    parser.add_argument("--compression", action="store_true", help="offer permessage-deflate")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (parent died)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground: one JSON line ``{"url": ...}`` once listening, then until
    SIGTERM/SIGINT (or stdin EOF when asked). Returns 0 after a graceful stop (open sessions
    closed with 1001), 1 when a second signal cut the stop short."""
    args = _parse_args(argv)
    simulator = SimulatorThread(
        args.host,
        args.port,
        rate=args.rate,
        buffer_frames=args.buffer_frames,
        max_sessions_logged=args.max_sessions_logged,
        compression="deflate" if args.compression else None,
    )
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
