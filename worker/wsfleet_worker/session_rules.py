"""Per-connection decisions of the worker, as pure functions and small state machines.

The asyncio shell (:mod:`wsfleet_worker.session`, :mod:`wsfleet_worker.worker`) feeds these
with clock readings and outcomes and carries out what they return. Nothing here sleeps, reads
a clock, or talks to the network, so every branch is unit-tested without I/O. The timing of
the worker lease (renew, self-fence) is :class:`wsfleet.lease.WorkerLeaseTimer`.

* :class:`ExitReason` / :func:`exit_plan` - how a session ends: flush or not, which final
  write, how to close the socket, whether to hint a peer.
* :func:`close_action` - an upstream close: reconnect and resume, or (``normal_close: final``)
  end the connection.
* :class:`ReconnectPolicy` - jittered exponential backoff between reconnects, reset only by a
  connection that stayed open.
* :class:`IncompleteMessage` - the progress timeout of a message still arriving.
* :class:`ErrorCategory` / :func:`last_error_text` - the coarse ``last_error`` the API shows.
* :func:`is_poison` / :func:`is_empty_close` - which failures the crash-loop breaker counts.
* :func:`triage_hints` - which hint messages of a receive batch to act on.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum, IntEnum, StrEnum

from wsfleet.backoff import backoff
from wsfleet.bodies import excerpt
from wsfleet.hints import Hint

__all__ = [
    "CREDENTIAL_REFUSAL_STATUSES",
    "MESSAGE_TIMEOUT_CODE",
    "MESSAGE_TIMEOUT_REASON",
    "NORMAL_CLOSE_CODES",
    "POISON_CLOSE_CODES",
    "RECONNECT_CAP_SECONDS",
    "RECONNECT_STABLE_SECONDS",
    "CloseAction",
    "ErrorCategory",
    "ExitPlan",
    "ExitReason",
    "FinalWrite",
    "HintTriage",
    "IncompleteMessage",
    "ReconnectPolicy",
    "SessionState",
    "close_action",
    "exit_plan",
    "is_credential_refusal",
    "is_empty_close",
    "is_poison",
    "last_error_text",
    "supersedes",
    "triage_hints",
]


class SessionState(IntEnum):
    """Where a session is in its life (for status and logs; transitions are in the shell)."""

    CONNECTING = 0
    STREAMING = 1
    BACKING_OFF = 2
    CLOSING = 3
    CLOSED = 4


# ============================================================================ session exits


class ExitReason(StrEnum):
    """Why a session ended; :func:`exit_plan` says what that implies."""

    STOPPED = "stopped"  # a control-channel STOP, or the checkpoint or the sweep saw STOPPED
    FENCED = "fenced"  # lease lost, or the worker lease is over (self-fence, killed)
    UPSTREAM_CLOSED = "upstream_closed"  # a normal close (1000/1001) with normal_close: final
    INVALID_URL = "invalid_ws_url"  # the stored ws_url can never be connected to
    REFUSED = "upstream_refused"  # SSRF guard: a redirect hop or resolved address refused
    SHUTDOWN = "shutdown"  # the worker is draining (SIGTERM/SIGINT)
    REBALANCED = "rebalanced"  # handed to a less loaded peer (the worker hints it)
    CRASHED = "crashed"  # a bug in the session: hand the connection to a peer
    FAILED = "failed"  # the crash-loop breaker tripped: FAILED until a new START
    #: a taker's prepared session (make-before-break) that never came to own the connection:
    #: declined, past its bound, its socket ended, or the giver broke instead
    ABANDONED = "abandoned"


class FinalWrite(Enum):
    NONE = "none"
    RELEASE = "release"  # owner removed, final checkpoint: a peer may take it at once
    MARK_STOPPED = "mark_stopped"  # STOPPED + stop_reason + release, final checkpoint
    MARK_FAILED = "mark_failed"  # FAILED + reason + breaker count + release, final checkpoint


@dataclass(frozen=True)
class ExitPlan:
    """How to end a session.

    ``flush``: wait (bounded) for the session's queued frames to be written so the final
    checkpoint covers them. ``abort``: drop the TCP connection without a closing handshake.
    ``close_code``: otherwise, the close code to send (None: the upstream already closed).
    ``hint``: send a hint so a peer takes the released lease right away.
    """

    final_write: FinalWrite
    flush: bool = True
    close_code: int | None = 1000
    abort: bool = False
    hint: bool = False
    stop_reason: str | None = None


_PLANS: dict[ExitReason, ExitPlan] = {
    ExitReason.STOPPED: ExitPlan(FinalWrite.RELEASE, close_code=1000),
    ExitReason.FENCED: ExitPlan(FinalWrite.NONE, flush=False, close_code=None, abort=True),
    ExitReason.UPSTREAM_CLOSED: ExitPlan(
        FinalWrite.MARK_STOPPED, close_code=None, stop_reason="upstream_closed"
    ),
    ExitReason.INVALID_URL: ExitPlan(
        FinalWrite.MARK_STOPPED, close_code=None, stop_reason="invalid_ws_url"
    ),
    # Terminal, not a backoff: a refusal is a property of where the upstream points, so a
    # retry would only probe the forbidden target again on a schedule (issue #11).
    ExitReason.REFUSED: ExitPlan(
        FinalWrite.MARK_STOPPED, close_code=None, stop_reason="upstream_refused"
    ),
    ExitReason.SHUTDOWN: ExitPlan(FinalWrite.RELEASE, close_code=1001, hint=True),
    # A graceful hand-off like SHUTDOWN's; the worker sends the hint itself, addressed to the
    # peer the plan chose (and a delayed copy for anyone), so no plain hint here.
    ExitReason.REBALANCED: ExitPlan(FinalWrite.RELEASE, close_code=1001),
    ExitReason.CRASHED: ExitPlan(FinalWrite.RELEASE, close_code=1011, hint=True),
    # The socket is already closed (the worker's own protocol close) or about to be closed with
    # 1011; no hint: nobody should take it.
    ExitReason.FAILED: ExitPlan(FinalWrite.MARK_FAILED, close_code=1011, stop_reason="failed"),
    # It never owned the connection: close what it opened, write nothing, hint nobody.
    ExitReason.ABANDONED: ExitPlan(FinalWrite.NONE, flush=False, close_code=1000),
}


def exit_plan(reason: ExitReason) -> ExitPlan:
    """The plan for ``reason``.

    >>> exit_plan(ExitReason.FENCED).final_write
    <FinalWrite.NONE: 'none'>
    """
    return _PLANS[reason]


def supersedes(new: ExitReason, current: ExitReason | None) -> bool:
    """Whether ``new`` replaces the reason a session is already ending for.

    The first reason wins, except FENCED, which wins over everything: once the lease is known
    to be lost, no final write may be attempted whatever the session was doing.
    """
    if current is None:
        return True
    return new is ExitReason.FENCED and current is not ExitReason.FENCED


# ============================================================================ upstream


NORMAL_CLOSE_CODES = frozenset({1000, 1001})

#: Reconnect backoff: full jitter, the ceiling doubling from 0.1 s to this cap.
RECONNECT_CAP_SECONDS = 10.0
#: A connection open at least this long was healthy: the next trouble starts from the
#: smallest delay again. Shorter ones (whatever they received) keep the backoff growing.
RECONNECT_STABLE_SECONDS = 10.0


class CloseAction(Enum):
    END = "end"  # the stream is over: mark the connection STOPPED (upstream_closed)
    RECONNECT = "reconnect"  # back off and resume as the connection's resume mode says


def close_action(received_code: int | None, *, final_normal_close: bool = False) -> CloseAction:
    """Decide from the close code the upstream sent (None: no close frame, the TCP link died).

    Any close reconnects: servers close routinely (1001 on their deploys, 1000 at session
    limits or to force re-authentication) and the stream goes on. Only a connection whose
    options say ``normal_close: final`` ends on a normal close (1000/1001).

    >>> [close_action(code).value for code in (1000, 1001, 1011, None)]
    ['reconnect', 'reconnect', 'reconnect', 'reconnect']
    >>> [close_action(code, final_normal_close=True).value for code in (1000, 1001, 1011, None)]
    ['end', 'end', 'reconnect', 'reconnect']
    """
    if final_normal_close and received_code in NORMAL_CLOSE_CODES:
        return CloseAction.END
    return CloseAction.RECONNECT


def is_empty_close(received_code: int | None, frames_received: int) -> bool:
    """Does an upstream close count towards the crash-loop breaker? Only a *normal* close
    (1000/1001) before the session received a single frame: the upstream deliberately sends
    nothing (a refused subscription, a stream it considers over). Error closes and dropped
    links are outages, retried with capped backoff however long they last.

    >>> is_empty_close(1000, 0), is_empty_close(1000, 1), is_empty_close(1011, 0)
    (True, False, False)
    """
    return received_code in NORMAL_CLOSE_CODES and frames_received == 0


#: Handshake statuses that say the credential was not accepted (the secret may be rotated).
CREDENTIAL_REFUSAL_STATUSES = frozenset({401, 403})


def is_credential_refusal(status: int) -> bool:
    """Should a refused handshake make the worker read its credential again?

    >>> is_credential_refusal(401), is_credential_refusal(403), is_credential_refusal(503)
    (True, True, False)
    """
    return status in CREDENTIAL_REFUSAL_STATUSES


@dataclass
class ReconnectPolicy:
    """Full-jitter exponential delays between reconnect attempts.

    The delay resets only after a connection stayed open ``stable_seconds``
    (:meth:`connection_ended`), never because frames arrived: an upstream that sends one frame
    and then something that ends the session (an oversize frame, a close) on every connect
    would otherwise reconnect at full speed forever.
    """

    initial: float = 0.1
    factor: float = 2.0
    cap: float = RECONNECT_CAP_SECONDS
    stable_seconds: float = RECONNECT_STABLE_SECONDS
    rng: random.Random | None = None
    attempts: int = 0
    _delays: Iterator[float] | None = field(default=None, repr=False)

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt (the ceiling doubles each time)."""
        if self._delays is None:
            self._delays = backoff(
                initial=self.initial, factor=self.factor, cap=self.cap, rng=self.rng
            )
        self.attempts += 1
        return next(self._delays)

    def connection_ended(self, open_seconds: float) -> None:
        """A connection ended after ``open_seconds``: a stable one resets the backoff."""
        if open_seconds >= self.stable_seconds:
            self.reset()

    def reset(self) -> None:
        """The next trouble starts from the smallest delay."""
        self.attempts = 0
        self._delays = None


#: The close the worker sends when a message is still incomplete ``WORKER_MESSAGE_TIMEOUT_SECONDS``
#: after its first byte (policy violation: the upstream breaks no framing rule, it is too slow).
MESSAGE_TIMEOUT_CODE = 1008
MESSAGE_TIMEOUT_REASON = "message timeout"


@dataclass
class IncompleteMessage:
    """When the message being received started, for its progress timeout.

    The connection feeds :meth:`observe` after every read: ``incomplete`` while a fragmented
    message or a partly read frame is pending. A message (or frame) trickled a byte at a time
    is not progress: the clock runs from its first byte until it completes.

    >>> m = IncompleteMessage(timeout=30.0)
    >>> m.observe(100.0, True); m.observe(125.0, True); m.deadline, m.overdue(129.9)
    (130.0, False)
    >>> m.overdue(130.0)
    True
    >>> m.observe(131.0, False); m.deadline
    """

    timeout: float | None
    since: float | None = None

    def observe(self, now: float, incomplete: bool) -> None:
        if not incomplete:
            self.since = None
        elif self.since is None:
            self.since = now

    @property
    def deadline(self) -> float | None:
        """When the pending message must be complete (None: nothing pending, or no bound)."""
        if self.since is None or self.timeout is None:
            return None
        return self.since + self.timeout

    def overdue(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now >= deadline


# ============================================================================ hints


@dataclass
class HintTriage:
    """A receive batch sorted by what to do with each message (values are receipt handles).

    ``acquire``: try these hints (at most the free capacity, one per connection).
    ``drop``: delete without acting (duplicates, connections already running, unparseable).
    ``release``: over capacity - make visible again at once so a peer can take them.
    """

    acquire: list[tuple[Hint, str]] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    #: Why each unusable body was refused, with a short excerpt (never the whole body).
    invalid: list[str] = field(default_factory=list)


def triage_hints(
    messages: Iterable[tuple[str, str]], running: set[str] | frozenset[str], free_slots: int
) -> HintTriage:
    """Sort ``(receipt_handle, body)`` pairs; see :class:`HintTriage`."""
    triage = HintTriage()
    seen: set[str] = set()
    for receipt, body in messages:
        try:
            hint = Hint.parse(body)  # raises ValueError only, whatever the body
        except ValueError as exc:
            triage.invalid.append(f"{exc}: {excerpt(body)}")
            triage.drop.append(receipt)
            continue
        if hint.pk in running or hint.pk in seen:
            triage.drop.append(receipt)
        elif len(triage.acquire) >= free_slots:
            triage.release.append(receipt)
        else:
            seen.add(hint.pk)
            triage.acquire.append((hint, receipt))
    return triage


# ============================================================================ errors & breaker


#: Close codes the *worker* sends because of what the upstream sent: a protocol error, an
#: invalid payload, a message that did not complete in time, a message too big. The same input
#: tends to come back on every resume, so these count towards the crash-loop breaker.
POISON_CLOSE_CODES = frozenset({1002, 1007, MESSAGE_TIMEOUT_CODE, 1009})

_CLOSE_CODE_NAMES = {
    1002: "protocol error",
    1007: "invalid payload",
    1008: "policy violation",
    1009: "message too big",
    1011: "internal error",
}


class ErrorCategory(StrEnum):
    """What ``last_error`` may say, the one place it is defined.

    Coarse on purpose: the API must not tell "connection refused" from "HTTP 400" or a DNS
    failure (with the router, that would make a port scanner). Details stay in worker logs.
    """

    CONNECT_FAILED = "connect_failed"  # DNS, TCP, TLS or timeout: anything before a response
    HANDSHAKE_REJECTED = "handshake_rejected"  # the upstream answered, but not with a 101
    REFUSED_BY_POLICY = "refused_by_policy"  # the worker's upstream policy refused the target
    UPSTREAM_CLOSED = "upstream_closed"  # the upstream sent a close frame (the code follows)
    CONNECTION_LOST = "connection_lost"  # the link died without a close frame
    CLOSED_BY_WORKER = "closed_by_worker"  # the worker closed for a protocol reason
    CRASHED = "crashed"  # a bug in the session while handling this connection
    #: The secret the connection names could not be read or used (the worker log names the
    #: reference and the AWS error code; the value never appears anywhere).
    CREDENTIAL_UNAVAILABLE = "credential_unavailable"


def last_error_text(category: ErrorCategory, code: int | None = None, reason: str = "") -> str:
    """The ``last_error`` stored for ``category``; close codes (and the worker's own close
    reason, never the upstream's) are the only detail.

    >>> last_error_text(ErrorCategory.CONNECT_FAILED)
    'connect_failed'
    >>> last_error_text(ErrorCategory.UPSTREAM_CLOSED, 1011)
    'upstream_closed (code 1011)'
    >>> last_error_text(ErrorCategory.CLOSED_BY_WORKER, 1009)
    'closed_by_worker (code 1009: message too big)'
    """
    if code is None:
        return category.value
    detail = ""
    if category is ErrorCategory.CLOSED_BY_WORKER:
        detail = reason or _CLOSE_CODE_NAMES.get(code, "")
    return f"{category.value} (code {code}{': ' + detail if detail else ''})"


def is_poison(crashed: bool, sent_code: int | None, *, worker_initiated: bool) -> bool:
    """Does this failure count towards the crash-loop breaker?

    A session crash does, and so does a close the worker itself started with a protocol code
    (:data:`POISON_CLOSE_CODES`). Connect failures, error closes and outages do not: an
    upstream down for an hour must keep being retried with capped backoff (a normal close
    before any frame does count: :func:`is_empty_close`).

    >>> is_poison(False, 1009, worker_initiated=True)
    True
    >>> is_poison(False, 1009, worker_initiated=False)
    False
    """
    if crashed:
        return True
    return worker_initiated and sent_code in POISON_CLOSE_CODES
