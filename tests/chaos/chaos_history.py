"""What a chaos run recorded, and the invariants checked on it afterwards (pure, no I/O).

Three independent witnesses:

* the **simulator's session log** (wall-clock open/close of every upstream socket, what each
  sent): overlaps, replay gaps, sockets left open;
* **samples of the connections table** taken every ~0.2 s during the run: when each lease
  epoch was first seen (an *upper bound* of its acquire time), and whether a checkpoint or an
  epoch ever went backwards;
* the **final tables**: every stored message (``seq``, content, ``lease_epoch``,
  ``received_at_ms``) and every record.

Invariants (each violation names the stream and the evidence):

``converged``
    A STARTED stream ends with exactly one owner, a live worker process (any incarnation of it:
    ``w1+2`` is ``w1`` started over after a lost lease) whose worker lease is live (not expired,
    not killed), and exactly one open upstream session; a STOPPED stream
    ends with none.
``lost`` / ``duplicated``
    Every seq from 1 to the record's checkpoint is stored, with its own content
    (``"<id>:<seq>"``), under the sort key of its seq (so it cannot be stored twice). On an
    at-least-once sink (a Kinesis stream: ``windows`` given) a seq may be stored more than
    once, but every copy after the first must lie inside a replay window a connection view
    reported (``replayed.from_seq..to_seq``, sampled with the table): a duplicate outside
    every reported window is ``duplicated``.
``fenced``
    No message stored under epoch *e* was received after epoch *e' > e* was seen in the table
    (the sample time is after the real acquire, so this never accuses an innocent write); no
    seq is stored under an older epoch than a lower seq (an old owner overwrote a newer one's
    frame); checkpoints and epochs never go backwards.
``attributed``
    Every upstream session is attributed to the worker that opened it: the simulator logs each
    session's client address (``peer``), and a worker logs its end of every upstream socket
    (``local``, with its ``worker_id``, the ``connection_id``, the ``epoch`` and whether it is
    a taker's ``prepared`` session) *before* it sends the handshake, so a session without
    such a line is a broken promise of the worker's logging, and makes its overlaps
    unexplainable.
``overlap``
    Two upstream sessions of one stream are never open together, except:

    * a paused owner: the older session's own worker was SIGSTOPped before the newer one
      opened (the kernel keeps a stopped process's socket open), and the older closed by
      shortly after that worker resumed (it self-fences on its first tick);
    * a planned hand-off's pair (:class:`PlannedHandoff`: make-before-break, issue #26): the
      older session is the giver's under the hand-off's epoch, the newer is the *prepared*
      session of the taker the PREPARE named, opened after the PREPARE, and the two were
      open together no later than the hand-off's end (the transfer and the giver's close, or
      the fallback) plus a close; after a decided transfer, whose write throttling can
      stretch, until the taker's own bound (``handoff_grace_seconds`` after its session
      opened: it closes by then unless the COMMIT came, sent once the transfer landed, the
      giver closing right after); with no end logged (the giver was killed), until the
      taker's bound after the PREPARE; either side SIGSTOPped before its own bound, until
      shortly after it resumed;
    * a taker's prepared session (of a hand-off naming that taker) and a later owner's
      session (of a later epoch than the hand-off's), while the prepared one was still only
      prepared: it owns nothing and writes nothing
      until its worker logs the adoption, and is closed by its bound
      (``handoff_grace_seconds`` after it opened), or, if its worker was SIGSTOPped within
      that bound, by shortly after that worker resumed. (The next owner of a stream whose
      giver died or fell back may connect while it waits for a COMMIT that cannot come.)

    Every rule is checked against the workers that opened the two sessions: another
    worker's pause, or another worker's hand-off, explains nothing. There is no
    fencing-window allowance: a worker fences every session at its deadline, before the lease
    can expire, and a break-mode hand-off closes the socket before it releases, so any other
    overlap, however short, is a violation.
``owner``
    Every stored message was written by the owner of its epoch: the ``worker_id`` on the item
    is the ``lease_owner`` the table showed under its ``lease_epoch`` (0 writes by a
    non-owner: a prepared taker writes nothing before the transfer names it, a giver nothing
    under the taker's epoch). Items of an epoch no sample saw are counted as unverified.
``gap``
    No resume asked for frames the upstream no longer had.

Poison-message track (:func:`check_poison`):

``survived``
    No worker process ended that the runner did not SIGKILL or SIGTERM (a pause is not an
    end): whatever a queue delivered, nothing in it may kill a worker.
``drained``
    Every poisoned queue a live worker consumes is empty at the end (no message visible or in
    flight), and no poison body sits in the hint dead-letter queue: unusable bodies are
    deleted, not redelivered until SQS gives up on them.
``forged_stop``
    A forged, well-formed STOP (the stream's current epoch, the owner's own queue, but a
    STARTED record) is never applied, and at least one was seen refused (else the check
    proved nothing).

Hostile-upstream track (:func:`check_hostile`):

``hostile_lost``
    Every hostile frame (bad seqs, a maximum-size non-ASCII frame) the upstream sent to a
    session that lived to the end is stored: its data under a local key, or a marker with
    its digest. (A session whose worker was killed may lose frames without a seq: they sit
    above no checkpoint and cannot be replayed.) At least one must have been checked.
``refused``
    A stream redirected to a loopback host outside the allowed list ends STOPPED with
    ``stop_reason`` ``upstream_refused``; the upstream served the redirect, and the redirect
    target never received a connection.
``breaker``
    A stream whose every session opens with a frame over the worker's limit ends FAILED after
    a bounded number of sessions: the breaker's failures plus one per worker disruption (each
    may cost a session the breaker does not count). So do the looping streams: one whose every
    session delivers one new frame and then one over the limit (the checkpoint moves each
    time: the breaker's window must still count it), and one whose every session trickles a
    message that never completes (the worker's message timeout closes it, 1008).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from wsfleet.lease import is_worker_alive
from wsfleet.record import WorkerRecord, worker_base_id
from wsfleet_local.simulator import hostile_frame_data

__all__ = [
    "Adoption",
    "ForgedStop",
    "Pause",
    "PlannedHandoff",
    "Sample",
    "SocketOpen",
    "StopOutcome",
    "Verdict",
    "Violation",
    "WorkerExit",
    "check_history",
    "check_hostile",
    "check_poison",
    "replay_windows",
]


@dataclass(frozen=True)
class Sample:
    """One connection record as seen at ``t`` (wall-clock seconds)."""

    t: float
    stream_id: str
    epoch: int
    owner: str
    last_seq: int
    desired_state: str
    #: The last replay window the record reported (at-least-once sinks), if any.
    replayed: tuple[int, int] | None = None


@dataclass(frozen=True)
class Pause:
    """A worker process was SIGSTOPped from ``stopped_at`` until ``resumed_at`` (wall clock)."""

    worker_id: str
    stopped_at: float
    resumed_at: float


@dataclass(frozen=True)
class PlannedHandoff:
    """A make-before-break hand-off of ``stream_id`` from its owner under ``epoch``, announced
    (PREPARE sent) at ``prepared_at`` and over at ``ended_at`` (wall clock): the transfer
    landed and the giver closed, or it fell back to break. ``ended_at`` None: unknown (the
    giver died mid-hand-off), bounded by the prepare bound. ``decision``: what the giver
    logged it decided (``transfer``, or the fallback's reason); None: nothing logged.
    ``taker``: the worker the PREPARE named (None: not logged)."""

    stream_id: str
    epoch: int
    prepared_at: float
    ended_at: float | None = None
    decision: str | None = None
    taker: str | None = None
    #: The worker that logged the PREPARE (None: not logged).
    giver: str | None = None


@dataclass(frozen=True)
class SocketOpen:
    """One "upstream socket opened" line a worker logged (before the handshake went out):
    ``worker_id`` (its incarnation) opened ``local`` (the client address the upstream sees)
    for ``stream_id`` under ``epoch`` at ``at``; ``prepared``: a taker's prepared session
    (the epoch is then the giver's)."""

    worker_id: str
    stream_id: str
    epoch: int
    local: str
    at: float
    prepared: bool = False


@dataclass(frozen=True)
class Adoption:
    """A taker's "prepared session adopted" line: from ``at`` its prepared session of
    ``stream_id`` is an owner's, under ``epoch`` (the transfer's)."""

    worker_id: str
    stream_id: str
    epoch: int
    at: float


@dataclass(frozen=True)
class WorkerExit:
    """How one worker process ended (``returncode`` None: still running at the end)."""

    worker_id: str
    returncode: int | None
    signals_sent: tuple[int, ...]


#: Log timestamps have millisecond resolution; the runner's clock and the workers' are the same.
_LOG_CLOCK_SLACK = 0.01
#: How long after a logged hand-off end its two sessions may still be open together: the
#: giver's close (websockets' close_timeout, 2 s) and the log line's own lateness.
HANDOFF_CLOSE_SECONDS = 2.5


@dataclass(frozen=True)
class ForgedStop:
    """A forged STOP of ``stream_id`` under ``epoch`` sent to ``worker_id``'s control queue
    at ``sent_at`` (epoch seconds; 0: unknown)."""

    stream_id: str
    worker_id: str
    epoch: int
    sent_at: float = 0.0


@dataclass(frozen=True)
class StopOutcome:
    """One "STOP command received" a worker logged: the command's epoch, whether it was
    applied, and when it was logged (epoch seconds; None: unknown)."""

    epoch: int | None
    applied: bool
    logged_at: float | None = None

    def answers(self, forged: ForgedStop) -> bool:
        """Whether this is the worker's answer to ``forged``: the same epoch, logged after it
        was sent. A legitimate STOP of the same stream at an earlier epoch (a STOP, then a
        re-START that a worker took under a new epoch, then the forgery) is not."""
        if self.epoch != forged.epoch:
            return False
        return self.logged_at is None or self.logged_at >= forged.sent_at - _LOG_CLOCK_SLACK


@dataclass(frozen=True)
class Violation:
    invariant: str
    stream_id: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.stream_id}: {self.detail}"


@dataclass
class Verdict:
    """All violations plus the figures the summary prints."""

    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, invariant: str, stream_id: str, detail: str) -> None:
        self.violations.append(Violation(invariant, stream_id, detail))


def _first_seen(samples: Iterable[Sample]) -> dict[str, dict[int, float]]:
    seen: dict[str, dict[int, float]] = defaultdict(dict)
    for sample in samples:
        epochs = seen[sample.stream_id]
        if sample.epoch not in epochs or sample.t < epochs[sample.epoch]:
            epochs[sample.epoch] = sample.t
    return seen


def _check_monotonic(samples: Sequence[Sample], verdict: Verdict) -> None:
    by_stream: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_stream[sample.stream_id].append(sample)
    for stream_id, series in by_stream.items():
        series.sort(key=lambda s: s.t)
        for before, after in pairwise(series):
            if after.epoch < before.epoch:
                verdict.add("fenced", stream_id,
                            f"epoch went back from {before.epoch} to {after.epoch}")  # fmt: skip
            if after.last_seq < before.last_seq:
                verdict.add(
                    "fenced",
                    stream_id,
                    f"checkpoint went back from {before.last_seq} (epoch {before.epoch}) to "
                    f"{after.last_seq} (epoch {after.epoch}) at t={after.t:.2f}",
                )


def _check_messages(
    stream_id: str,
    items: Sequence[Mapping[str, Any]],
    checkpoint: int,
    first_seen: Mapping[int, float],
    verdict: Verdict,
    *,
    overwrites: bool = True,
) -> int:
    """Loss, content, sort keys and fencing of one stream's stored frames; returns #checked.
    ``overwrites``: a write lands on its seq's key (the table), so an older epoch's frame above
    a newer epoch's is an old owner overwriting; a stream keeps every copy instead."""
    by_seq: dict[int, Mapping[str, Any]] = {}
    for item in items:
        if item.get("seq") is None:
            continue
        seq = int(item["seq"])
        if item.get("sk") != f"{seq:020d}":
            verdict.add("duplicated", stream_id, f"seq {seq} stored under sk {item.get('sk')}")
        by_seq[seq] = item
    missing = [seq for seq in range(1, checkpoint + 1) if seq not in by_seq]
    if missing:
        verdict.add("lost", stream_id,
                    f"{len(missing)} seq(s) missing up to checkpoint {checkpoint}: "
                    f"{missing[:10]}")  # fmt: skip
    wrong = [s for s, item in by_seq.items() if item.get("message_data") != f"{stream_id}:{s}"]
    if wrong:
        verdict.add("duplicated", stream_id, f"seq(s) with foreign content: {sorted(wrong)[:10]}")
    # Fencing by time: the earliest sighting of any *later* epoch bounds every older write.
    newest = 0
    for seq in sorted(by_seq):
        item = by_seq[seq]
        epoch = int(item.get("lease_epoch") or 0)
        received = int(item.get("received_at_ms") or 0) / 1000
        limit = min((t for e, t in first_seen.items() if e > epoch), default=float("inf"))
        if received > limit:
            verdict.add(
                "fenced",
                stream_id,
                f"seq {seq} stored under epoch {epoch} was received {received - limit:.3f} s "
                f"after a later epoch was already in the table",
            )
        if overwrites and seq <= checkpoint and epoch < newest:
            seen = first_seen.get(newest)
            late = f", {received - seen:+.2f} s vs epoch {newest} first seen" if seen else ""
            verdict.add("fenced", stream_id,
                        f"seq {seq} stored under epoch {epoch} (by {item.get('worker_id')}, "
                        f"received at {received:.2f}{late}) after a lower seq under epoch "
                        f"{newest}")  # fmt: skip
        newest = max(newest, epoch)
    return len(by_seq)


def _check_duplicates(
    stream_id: str,
    items: Sequence[Mapping[str, Any]],
    windows: set[tuple[int, int]],
    verdict: Verdict,
) -> int:
    """At-least-once sinks: every copy of a seq after the first lies inside a reported replay
    window. Returns the copies re-sent."""
    copies: dict[int, int] = defaultdict(int)
    for item in items:
        if item.get("seq") is not None:
            copies[int(item["seq"])] += 1
    outside = sorted(
        seq for seq, n in copies.items()
        if n > 1 and not any(low <= seq <= high for low, high in windows)
    )  # fmt: skip
    if outside:
        verdict.add("duplicated", stream_id,
                    f"{len(outside)} seq(s) stored twice outside every reported replay window "
                    f"{sorted(windows)[:5]}: {outside[:10]}")  # fmt: skip
    return sum(n - 1 for n in copies.values())


def _attribute(
    sessions: Sequence[Any], opens: Sequence[SocketOpen]
) -> dict[int, SocketOpen]:
    """Which worker opened each upstream session: the session's client address (``peer`` at
    the upstream) joined with the ``local`` address of the worker's "upstream socket opened"
    line for the same stream, the latest one logged before the session opened (a worker logs
    it before it sends the handshake, so the line always comes first; a port used again later
    is told apart by time)."""
    by_key: dict[tuple[str, str], list[SocketOpen]] = defaultdict(list)
    for opened in opens:
        by_key[(opened.stream_id, _address(opened.local))].append(opened)
    for found in by_key.values():
        found.sort(key=lambda o: o.at)
    attribution: dict[int, SocketOpen] = {}
    for session in sessions:
        candidates = by_key.get((session.stream_id, _address(getattr(session, "peer", ""))), [])
        before = [o for o in candidates if o.at <= session.opened_at + _LOG_CLOCK_SLACK]
        if before:
            attribution[session.session_id] = before[-1]
    return attribution


def _address(text: str) -> str:
    """``ip:port`` with any IPv6 brackets dropped (the upstream's log and the worker's may
    spell an IPv6 address differently)."""
    host, _, port = str(text).rpartition(":")
    return f"{host.strip('[]')}:{port}"


def _handoff_pair(
    handoffs: Sequence[PlannedHandoff], giver: SocketOpen, taker: SocketOpen, newer_opened: float
) -> PlannedHandoff | None:
    """The planned hand-off whose giver and taker these two sessions are, if any: the older
    session is the giver's under the hand-off's epoch, the newer the named taker's *prepared*
    session, opened after the PREPARE (the latest such PREPARE is this hand-off)."""
    if not taker.prepared or giver.prepared:
        return None
    matching = [
        h for h in handoffs
        if h.giver == giver.worker_id and h.taker == taker.worker_id
        and h.epoch == giver.epoch == taker.epoch
        and h.prepared_at - _LOG_CLOCK_SLACK <= newer_opened
    ]  # fmt: skip
    return max(matching, key=lambda h: h.prepared_at, default=None)


def _pair_limit(
    handoff: PlannedHandoff,
    giver: SocketOpen,
    taker: SocketOpen,
    newer_opened: float,
    pauses: Sequence[Pause],
    bound_seconds: float,
    resume_grace_seconds: float,
) -> float:
    """Until when a hand-off's giver and taker sessions may be open together: a close after
    the giver's decision (end unknown, the giver died: ``bound_seconds`` after the PREPARE).
    A giver that decided a transfer keeps its session through the transfer write (throttling
    retries can stretch it past the taker's wait): the taker closes its prepared session by
    its own bound unless a COMMIT came (sent once the transfer landed; the giver closes
    right after, within a close), so that pair may stay open together until
    ``bound_seconds`` after the taker's session opened. Either side
    SIGSTOPped before its own bound runs no timer: its bound is then shortly after it resumed
    (it self-fences on its first tick)."""
    if handoff.ended_at is None:
        giver_until = handoff.prepared_at + bound_seconds
    else:
        giver_until = handoff.ended_at + HANDOFF_CLOSE_SECONDS
    limit = _paused_past(giver.worker_id, giver_until, pauses, resume_grace_seconds)
    if handoff.decision in (None, "transfer"):  # (a fallback closes the giver's at once)
        taker_until = _paused_past(taker.worker_id, newer_opened + bound_seconds, pauses,
                                   resume_grace_seconds)  # fmt: skip
        limit = max(limit, taker_until)
    return limit


def _paused_past(
    worker_id: str, until: float, pauses: Sequence[Pause], resume_grace_seconds: float
) -> float:
    """``until``, a bound of something ``worker_id`` does by its own timer, or, if that worker
    was SIGSTOPped before it (it runs no timer meanwhile), shortly after it resumed."""
    base = worker_base_id(worker_id)
    for pause in sorted(pauses, key=lambda p: p.stopped_at):
        if pause.worker_id == base and pause.stopped_at <= until:
            until = max(until, pause.resumed_at + resume_grace_seconds)
    return until


def _adoption_of(
    session: Any, opened: SocketOpen, adoptions: Sequence[Adoption], end_time: float
) -> Adoption | None:
    """The adoption of ``session`` (a prepared one) its worker logged while it was open."""
    if not opened.prepared:
        return None
    closed = session.closed_at if session.closed_at is not None else end_time
    found = [
        a for a in adoptions
        if a.worker_id == opened.worker_id and session.opened_at <= a.at <= closed
    ]  # fmt: skip
    return min(found, key=lambda a: a.at, default=None)


def _as_of(opened: SocketOpen, adopted: Adoption | None, at: float) -> SocketOpen:
    """Who held the session at ``at``: once adopted, the taker as an owner of the new epoch."""
    if adopted is None or adopted.at > at + _LOG_CLOCK_SLACK:
        return opened
    return replace(opened, epoch=adopted.epoch, prepared=False)


def _prepared_until(
    session: Any,
    opened: SocketOpen,
    adopted: Adoption | None,
    handoffs: Sequence[PlannedHandoff],
    pauses: Sequence[Pause],
    bound_seconds: float,
    resume_grace_seconds: float,
) -> float:
    """Until when ``session``, a taker's prepared session, was still only that: it owns
    nothing and writes nothing (adopting needs the record to show the transfer to it) until
    its worker logged the adoption; else it is closed by its own bound (``bound_seconds``
    after it opened: no COMMIT came) or, if its worker was SIGSTOPped within that bound,
    until that worker resumed and self-fenced (a paused taker runs no timer). -inf: not a
    prepared session of a hand-off that named its worker as the taker."""
    if not opened.prepared:
        return -math.inf
    if not any(
        h.taker == opened.worker_id and h.epoch == opened.epoch
        and h.prepared_at - _LOG_CLOCK_SLACK <= session.opened_at
        for h in handoffs
    ):  # fmt: skip
        return -math.inf
    if adopted is not None:
        return adopted.at + _LOG_CLOCK_SLACK
    return _paused_past(opened.worker_id, session.opened_at + bound_seconds, pauses,
                        resume_grace_seconds)  # fmt: skip


def _paused_zombie(
    opened: SocketOpen, older_end: float, newer_opened: float, pauses: Sequence[Pause],
    resume_grace_seconds: float,
) -> bool:  # fmt: skip
    """The older session's own worker was SIGSTOPped before the newer session opened (the
    kernel keeps a stopped process's socket open) and the session closed by shortly after
    that worker resumed (it self-fences on its first tick)."""
    base = worker_base_id(opened.worker_id)
    return any(
        p.worker_id == base and p.stopped_at <= newer_opened
        and older_end <= p.resumed_at + resume_grace_seconds
        for p in pauses
    )  # fmt: skip


@dataclass
class _OverlapCounts:
    found: int = 0
    paused: int = 0  # the older session's worker was paused (a zombie owner)
    planned: int = 0  # a planned hand-off's giver + taker pair
    prepared: int = 0  # a taker's prepared session within its bound, with another session
    unattributed: int = 0  # a session no worker's log line names (a violation)


def _check_overlaps(
    stream_id: str,
    sessions: Sequence[Any],
    pauses: Sequence[Pause],
    *,
    attribution: Mapping[int, SocketOpen],
    resume_grace_seconds: float,
    end_time: float,
    verdict: Verdict,
    handoffs: Sequence[PlannedHandoff] = (),
    adoptions: Sequence[Adoption] = (),
    handoff_grace_seconds: float = 0.0,
) -> _OverlapCounts:
    """Every pair of the stream's sessions open together, judged against the workers that
    opened them (see ``overlap`` in the module docstring); an unexplained pair is a
    violation."""
    counts = _OverlapCounts()
    adopted = {
        s.session_id: found
        for s in sessions
        if s.session_id in attribution
        and (found := _adoption_of(s, attribution[s.session_id], adoptions, end_time))
    }  # fmt: skip
    ordered = sorted(sessions, key=lambda s: (s.opened_at, s.session_id))
    active: list[Any] = []
    for session in ordered:
        active = [a for a in active if a.closed_at is None or a.closed_at > session.opened_at]
        for older in active:
            older_end = older.closed_at if older.closed_at is not None else end_time
            newer_end = session.closed_at if session.closed_at is not None else end_time
            together_until = min(older_end, newer_end)
            counts.found += 1
            first, second = attribution.get(older.session_id), attribution.get(session.session_id)
            if first is None or second is None:
                counts.unattributed += 1
                why = "a session no worker logged opening"
            elif _paused_zombie(first, older_end, session.opened_at, pauses,
                                resume_grace_seconds):  # fmt: skip
                counts.paused += 1
                continue
            elif (pair := _handoff_pair(
                handoffs, giver := _as_of(first, adopted.get(older.session_id),
                                          session.opened_at),
                second, session.opened_at,
            )) is not None:  # fmt: skip
                # (the pair's own bound only: a giver lingering after its fallback is no
                # prepared session's excuse)
                limit = _pair_limit(pair, giver, second, session.opened_at, pauses,
                                    handoff_grace_seconds, resume_grace_seconds)  # fmt: skip
                if together_until <= limit:
                    counts.planned += 1
                    continue
                why = (f"the pair of hand-off e{pair.epoch} {pair.giver}->{pair.taker}, past "
                       f"its end + close at {_clock_text(limit)}")  # fmt: skip
            elif any(
                # (a later owner's: the giver's is the pair's)
                _as_of(other, adopted.get(o.session_id), session.opened_at).epoch > mine.epoch
                and together_until <= _prepared_until(
                    s, mine, adopted.get(s.session_id), handoffs, pauses,
                    handoff_grace_seconds, resume_grace_seconds,
                )
                for s, mine, o, other in ((older, first, session, second),
                                          (session, second, older, first))
            ):  # fmt: skip
                counts.prepared += 1
                continue
            else:
                why = "no paused owner, planned hand-off or prepared session explains it"
            length = together_until - session.opened_at
            verdict.add(
                "overlap",
                stream_id,
                f"sessions {older.session_id} and {session.session_id} streamed together for "
                f"{length:.3f} s ({why}); "
                + _overlap_context(older, session, attribution, handoffs, pauses),
            )
        active.append(session)
    return counts


def _clock_text(at: float | None) -> str:
    """Wall-clock seconds as the workers' log timestamps show them (UTC, milliseconds)."""
    if at is None:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _overlap_context(
    older: Any,
    newer: Any,
    attribution: Mapping[int, SocketOpen],
    handoffs: Sequence[PlannedHandoff],
    pauses: Sequence[Pause],
) -> str:
    """What an unexplained overlap needs to be read against the workers' logs once the run's
    directory is gone: both sessions' times (UTC, as in the logs), close codes, client
    addresses and the workers that opened them (epoch, prepared or not), every planned
    hand-off of the stream near them (epoch, giver -> taker, PREPARE, logged end, decision),
    and the pauses that began before the newer session opened."""

    def describe(s: Any) -> str:
        times = f"{_clock_text(s.opened_at)}-{_clock_text(s.closed_at)}"
        opened = attribution.get(s.session_id)
        by = "by ?" if opened is None else (
            f"by {opened.worker_id} e{opened.epoch}{' prepared' if opened.prepared else ''}"
        )  # fmt: skip
        return (f"#{s.session_id} {times} close={getattr(s, 'close_code', None)} "
                f"peer={getattr(s, 'peer', '?')} {by}")  # fmt: skip

    near = [
        h for h in handoffs
        if h.prepared_at <= (newer.closed_at or h.prepared_at) + HANDOFF_CLOSE_SECONDS
        and (h.ended_at or h.prepared_at) >= older.opened_at - HANDOFF_CLOSE_SECONDS
    ]  # fmt: skip
    planned = ", ".join(
        f"e{h.epoch} {h.giver or '?'}->{h.taker or '?'} PREPARE {_clock_text(h.prepared_at)} "
        f"end {_clock_text(h.ended_at)} {h.decision or '-'}"
        for h in near
    ) or "none"
    paused = ", ".join(
        f"{p.worker_id} {_clock_text(p.stopped_at)}-{_clock_text(p.resumed_at)}"
        for p in pauses
        if p.stopped_at <= newer.opened_at and p.resumed_at >= older.opened_at
    ) or "none"
    return (f"sessions {describe(older)} / {describe(newer)}; planned hand-offs near: "
            f"{planned}; pauses: {paused}")  # fmt: skip


def _owners_by_epoch(samples: Iterable[Sample]) -> dict[tuple[str, int], set[str]]:
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for sample in samples:
        if sample.owner:
            owners[(sample.stream_id, sample.epoch)].add(sample.owner)
    return owners


def _check_writers(
    stream_id: str,
    items: Sequence[Mapping[str, Any]],
    owners: Mapping[tuple[str, int], set[str]],
    verdict: Verdict,
) -> tuple[int, int, int]:
    """(writes checked, writes by a non-owner, writes of an epoch no sample saw)."""
    checked = foreign = unseen = 0
    for item in items:
        writer = item.get("worker_id")
        if not writer:
            continue
        epoch = int(item.get("lease_epoch") or 0)
        holders = owners.get((stream_id, epoch))
        if not holders:
            unseen += 1
            continue
        checked += 1
        if writer not in holders:
            foreign += 1
            verdict.add("owner", stream_id,
                        f"seq {item.get('seq')} (sk {item.get('sk')}) written by {writer} under "
                        f"epoch {epoch}, owned by {', '.join(sorted(holders))}")  # fmt: skip
    return checked, foreign, unseen


def check_history(
    *,
    expected_states: Mapping[str, str],
    final_records: Mapping[str, Any],
    live_workers: set[str],
    worker_records: Mapping[str, WorkerRecord],
    sessions: Sequence[Any],
    items: Mapping[str, Sequence[Mapping[str, Any]]],
    samples: Sequence[Sample],
    pauses: Sequence[Pause],
    resume_grace_seconds: float,
    end_time: float,
    opens: Sequence[SocketOpen],
    handoffs: Sequence[PlannedHandoff] = (),
    adoptions: Sequence[Adoption] = (),
    handoff_grace_seconds: float = 0.0,
    windows: Mapping[str, set[tuple[int, int]]] | None = None,
) -> Verdict:
    """Check every invariant of the module docstring over one run's history.

    ``opens``: every upstream socket the workers logged opening (who opened each session);
    ``handoffs``: the planned (make-before-break) hand-offs the workers announced;
    ``adoptions``: the prepared sessions their takers adopted; ``handoff_grace_seconds``: a
    taker's bound (its wait for COMMIT plus a close), which also bounds a hand-off whose end
    was not logged (its giver died). ``windows``: the replay windows each stream's view
    reported (an at-least-once sink; None: the table)."""
    verdict = Verdict()
    attribution = _attribute(sessions, opens)
    adopted_by_stream: dict[str, list[Adoption]] = defaultdict(list)
    for adoption in adoptions:
        adopted_by_stream[adoption.stream_id].append(adoption)
    owners = _owners_by_epoch(samples)
    planned_by_stream: dict[str, list[PlannedHandoff]] = defaultdict(list)
    for handoff in handoffs:
        planned_by_stream[handoff.stream_id].append(handoff)
    writes = [0, 0, 0]
    by_stream: dict[str, list[Any]] = defaultdict(list)
    for session in sessions:
        by_stream[session.stream_id].append(session)
    first_seen = _first_seen(samples)
    _check_monotonic(samples, verdict)
    checked = re_sent = 0
    overlaps = _OverlapCounts()
    now_ms = int(end_time * 1000)
    for stream_id, desired in sorted(expected_states.items()):
        record = final_records.get(stream_id)
        stream_sessions = by_stream.get(stream_id, [])
        open_sessions = [s for s in stream_sessions if s.closed_at is None]
        if record is None:
            verdict.add("converged", stream_id, "no record")
            continue
        if record.desired_state.value != desired:
            verdict.add("converged", stream_id,
                        f"desired_state {record.desired_state.value}, "
                        f"expected {desired}")  # fmt: skip
        if desired == "STARTED":
            if worker_base_id(record.lease_owner) not in live_workers:
                verdict.add("converged", stream_id,
                            f"owner {record.lease_owner!r} is not a live worker")  # fmt: skip
            elif not is_worker_alive(worker_records.get(record.lease_owner), now_ms):
                verdict.add("converged", stream_id, "its owner's worker lease is not live")
            if len(open_sessions) != 1:
                verdict.add("converged", stream_id,
                            f"{len(open_sessions)} open upstream sessions, expected 1")  # fmt: skip
        elif open_sessions:
            verdict.add("converged", stream_id,
                        f"STOPPED but {len(open_sessions)} upstream session(s) "
                        "still open")  # fmt: skip
        stored = items.get(stream_id, ())
        if windows is not None:
            re_sent += _check_duplicates(stream_id, stored, windows.get(stream_id, set()), verdict)
            stored = _first_copies(stored)
        checked += _check_messages(
            stream_id, stored, record.last_seq, first_seen.get(stream_id, {}), verdict,
            overwrites=windows is None,
        )  # fmt: skip
        for session in stream_sessions:
            if session.session_id not in attribution:
                verdict.add("attributed", stream_id,
                            f"session {session.session_id} from {getattr(session, 'peer', '?')} "
                            f"at {_clock_text(session.opened_at)}: no worker logged opening "
                            "it")  # fmt: skip
        counts = _check_overlaps(
            stream_id, stream_sessions, pauses, attribution=attribution,
            resume_grace_seconds=resume_grace_seconds, end_time=end_time, verdict=verdict,
            handoffs=planned_by_stream.get(stream_id, ()),
            adoptions=adopted_by_stream.get(stream_id, ()),
            handoff_grace_seconds=handoff_grace_seconds,
        )  # fmt: skip
        for name in ("found", "paused", "planned", "prepared", "unattributed"):
            setattr(overlaps, name, getattr(overlaps, name) + getattr(counts, name))
        for i, n in enumerate(_check_writers(stream_id, items.get(stream_id, ()), owners,
                                             verdict)):  # fmt: skip
            writes[i] += n
        for session in stream_sessions:
            if session.gap:
                verdict.add("gap", stream_id,
                            f"session {session.session_id} skipped "
                            f"{session.gap} frames")  # fmt: skip
    epochs = [max(e) for e in first_seen.values() if e]
    verdict.figures.update(
        {
            "streams": len(expected_states),
            "started_at_end": sum(1 for s in expected_states.values() if s == "STARTED"),
            "stopped_at_end": sum(1 for s in expected_states.values() if s == "STOPPED"),
            "upstream_sessions": len(sessions),
            "lease_epochs_seen": sum(len(e) for e in first_seen.values()),
            "max_epoch": max(epochs, default=0),
            "messages_checked": checked,
            "checkpointed_total": sum(r.last_seq for r in final_records.values()),
            "sessions_attributed": sum(1 for s in sessions if s.session_id in attribution),
            "overlaps": overlaps.found,
            "overlaps_of_paused_owners": overlaps.paused,
            "planned_handoffs_announced": len(handoffs),
            "overlaps_of_planned_handoffs": overlaps.planned,
            "overlaps_of_prepared_sessions": overlaps.prepared,
            "overlaps_unattributed": overlaps.unattributed,
            "writes_owner_checked": writes[0],
            "writes_by_non_owner": writes[1],
            "writes_of_unsampled_epochs": writes[2],
            "table_samples": len(samples),
        }
    )
    if windows is not None:
        verdict.figures["re_sent"] = re_sent
        verdict.figures["replay_windows"] = sum(len(w) for w in windows.values())
    return verdict


def _first_copies(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One copy per seq (the lowest epoch's, the first sent; frames without a seq all kept):
    the table's checks then apply to what an at-least-once sink stored."""
    first: dict[int, Mapping[str, Any]] = {}
    rest: list[Mapping[str, Any]] = []
    for item in items:
        if item.get("seq") is None:
            rest.append(item)
            continue
        seq = int(item["seq"])
        kept = first.get(seq)
        if kept is None or int(item.get("lease_epoch") or 0) < int(kept.get("lease_epoch") or 0):
            first[seq] = item
    return [*first.values(), *rest]


def replay_windows(
    samples: Iterable[Sample], final_records: Mapping[str, Any]
) -> dict[str, set[tuple[int, int]]]:
    """Every replay window each stream's record reported: seen in a sample, or at the end."""
    windows: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for sample in samples:
        if sample.replayed is not None:
            windows[sample.stream_id].add(sample.replayed)
    for stream_id, record in final_records.items():
        low, high = record.replayed_from_seq, record.replayed_to_seq
        if low is not None and high is not None:
            windows[stream_id].add((low, high))
    return dict(windows)


#: Signals with which the runner ends a worker on purpose (SIGKILL 9, SIGTERM 15).
_DELIBERATE_ENDS = frozenset({9, 15})


def check_poison(
    verdict: Verdict,
    *,
    exits: Sequence[WorkerExit],
    queue_depths: Mapping[str, int],
    dead_lettered: int,
    forged: Sequence[ForgedStop],
    stop_outcomes: Mapping[str, Sequence[StopOutcome]],
) -> None:
    """The poison-message invariants of the module docstring, added to ``verdict``.

    ``queue_depths``: messages left (visible + in flight) per poisoned queue still consumed at
    the end; ``dead_lettered``: poison bodies found in the hint DLQ; ``stop_outcomes``: per
    stream, every STOP command the workers logged (only those answering a forged STOP, by epoch
    and time, count for it). A worker that lost
    its lease does not end (it starts over under a new id), so any unprompted end counts.
    """
    for end in exits:
        if end.returncode is not None and not _DELIBERATE_ENDS & set(end.signals_sent):
            verdict.add("survived", end.worker_id,
                        f"exited with {end.returncode} though never killed or "
                        "drained")  # fmt: skip
    for queue, depth in sorted(queue_depths.items()):
        if depth:
            verdict.add("drained", queue, f"{depth} message(s) still in the queue")
    if dead_lettered:
        verdict.add("drained", "hint-dlq", f"{dead_lettered} poison body(ies) dead-lettered")
    refused = 0
    for stop in forged:
        outcomes = [o for o in stop_outcomes.get(stop.stream_id, ()) if o.answers(stop)]
        if any(o.applied for o in outcomes):
            verdict.add("forged_stop", stop.stream_id,
                        f"a STOP was applied (forged under epoch {stop.epoch} to "
                        f"{stop.worker_id})")  # fmt: skip
        elif outcomes:
            refused += 1
    if forged and not refused:
        verdict.add("forged_stop", "*", f"none of {len(forged)} forged STOP(s) was seen refused")
    verdict.figures.update(
        {
            "worker_processes": len(exits),
            "poisoned_queues_checked": len(queue_depths),
            "forged_stops": len(forged),
            "forged_stops_refused": refused,
        }
    )


def _hostile_labels(session: Any) -> list[tuple[str, int, int]]:
    """(kind, n, size) of every hostile frame a session was sent ("hostile:<kind>:<n>:<size>")."""
    labels = []
    for fault in session.faults:
        parts = str(fault).split(":")
        if len(parts) == 4 and parts[0] == "hostile":
            labels.append((parts[1], int(parts[2]), int(parts[3])))
    return labels


def check_hostile(
    verdict: Verdict,
    *,
    frames_stream: str,
    sessions: Sequence[Any],
    items: Sequence[Mapping[str, Any]],
    redirect_stream: str,
    redirect_record: Any,
    redirects_served: int,
    trap_connections: int,
    breaker_stream: str,
    breaker_record: Any,
    breaker_sessions: int,
    max_failures: int,
    disruptions: int,
    looping: Mapping[str, tuple[Any, int]] | None = None,
    verified_open: int = 0,
) -> None:
    """The hostile-upstream invariants of the module docstring, added to ``verdict``.

    ``looping``: the other streams that must end FAILED within the breaker's bound, as
    ``stream id -> (record, sessions)``. ``verified_open``: hostile frames the runner already
    found stored while their session was open (a hand-off after that check, rebalancing the
    replaced workers, leaves none open at the end: that is not evidence of a loss)."""
    stored_data = {item.get("message_data") for item in items if item.get("message_data")}
    stored_digests = {item.get("data_sha256") for item in items if item.get("data_sha256")}
    sent = checked = 0
    for session in sessions:
        for kind, n, size in _hostile_labels(session):
            sent += 1
            if session.closed_at is not None:
                continue
            checked += 1
            data = hostile_frame_data(frames_stream, kind, n, size)
            digest = hashlib.sha256(data.encode()).hexdigest()
            if data not in stored_data and digest not in stored_digests:
                verdict.add("hostile_lost", frames_stream,
                            f"{kind} frame #{n} ({size or len(data)} bytes) sent to session "
                            f"{session.session_id} is stored nowhere")  # fmt: skip
    if not checked and not verified_open:
        verdict.add(
            "hostile_lost", frames_stream,
            f"none of {sent} hostile frame(s) reached a session open at the end",
        )  # fmt: skip
    reason = getattr(redirect_record, "stop_reason", None)
    if reason != "upstream_refused":
        verdict.add("refused", redirect_stream, f"stop_reason {reason!r}, not upstream_refused")
    if not redirects_served:
        verdict.add("refused", redirect_stream, "the upstream never served the redirect")
    if trap_connections:
        verdict.add(
            "refused", redirect_stream,
            f"the refused redirect target got {trap_connections} connection(s)",
        )  # fmt: skip
    bound = max_failures + disruptions
    breakers = {breaker_stream: (breaker_record, breaker_sessions), **(looping or {})}
    for stream, (record, stream_sessions) in breakers.items():
        state = getattr(getattr(record, "desired_state", None), "value", None)
        if state != "FAILED":
            verdict.add("breaker", stream, f"ended {state}, not FAILED")
        if stream_sessions > bound:
            verdict.add("breaker", stream,
                        f"{stream_sessions} sessions before FAILED, more than {max_failures} "
                        f"failures + {disruptions} disruptions")  # fmt: skip
        verdict.figures[f"sessions_{stream}"] = stream_sessions
    verdict.figures.update(
        {
            "hostile_frames_sent": sent,
            "hostile_frames_checked": checked,
            "redirects_served": redirects_served,
            "breaker_sessions": breaker_sessions,
        }
    )
