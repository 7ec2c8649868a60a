"""OwnershipSweep: what gsi_owner says a worker owns, held against the sessions it runs.

With lease model v2 nothing expires under a live worker: a connection it owns stays owned
until it releases it. So the worker looks at its own connections every WORKER_SWEEP_SECONDS
(one Query of gsi_owner, about one read unit per 1,000 connections) and repairs three things
the event paths can miss: a STOP whose control message was lost, a connection it owns without
a session (a release that never landed), and a session whose connection is someone else's.
Every action rests on a consistent read of the item; the index only says where to look.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from wsfleet.exceptions import LeaseError
from wsfleet.hints import Hint
from wsfleet.lease import Lease, is_ours
from wsfleet.record import DesiredState
from wsfleet.store import IndexEntry

from .liveness import WorkerLiveness
from .outbox import HintOutbox
from .parts import WorkerParts, WorkerRole
from .session import Session
from .session_rules import ExitReason
from .taking import LeaseTaker

__all__ = ["OwnershipSweep"]


class OwnershipSweep(WorkerRole):
    """One worker's sweep of its own connections (see the module docstring).

    :param sessions: the worker's live map of sessions by pk (read, never changed here).
    :param sweep_ms: the sweep interval: a session younger than two of them may not be in
        the (eventually consistent) index yet.
    :param stopping: whether the worker is draining (a sweep then stops where it is).
    """

    def __init__(
        self,
        parts: WorkerParts,
        liveness: WorkerLiveness,
        taker: LeaseTaker,
        outbox: HintOutbox,
        *,
        sessions: Mapping[str, Session],
        sweep_ms: int,
        stopping: Callable[[], bool],
    ) -> None:
        super().__init__(parts)
        self._liveness = liveness
        self._taker = taker
        self._outbox = outbox
        self._sessions = sessions
        self._sweep_ms = sweep_ms
        self._stopping = stopping

    async def run_once(self) -> None:
        """Compare what gsi_owner says this worker owns with the sessions it runs.

        * A STOPPED entry whose session runs: the STOP's fallback path (its control message
          was lost, or there is no control channel). Confirmed by a consistent read, then
          the session ends STOPPED (``via="sweep"``).
        * An entry with no session (and none being acquired or ending): a stranded
          connection, e.g. a release that never landed. Confirmed by a consistent read,
          released and, if STARTED, hinted: a live worker must never keep a connection it
          does not stream, since nothing else would free it while this worker lives.
        * A session running for more than two sweeps that the index does not show: read
          consistently; if the connection is not ours any more, the session is fenced.

        The index is eventually consistent; every action rests on the consistent read.
        """
        entries = await self._offloader.io(lambda: list(self._leases.owned_by(self.worker_id)))
        now = self._clock()
        indexed = {entry.pk for entry in entries}
        for entry in entries:
            if self._liveness.fenced or self._stopping():
                return
            session = self._sessions.get(entry.pk)
            if session is not None:
                if (
                    session.reason is None
                    and entry.desired_state is not DesiredState.STARTED
                    and entry.epoch == session.epoch
                ):
                    await self._sweep_stop(session)
            elif entry.pk not in self._taker.acquiring:
                await self._sweep_stranded(entry)
        old_enough = now - 2 * self._sweep_ms
        for session in list(self._sessions.values()):
            if self._liveness.fenced or self._stopping():
                return
            if (
                session.reason is None
                and session.pk not in indexed
                and session.started_at_ms < old_enough
            ):
                await self._sweep_unlisted(session)

    async def _sweep_stop(self, session: Session) -> None:
        record = await self._offloader.io(self._leases.get, session.pk)
        if (
            record is not None
            and record.desired_state is not DesiredState.STARTED
            and is_ours(record, session.lease)
            and session.reason is None
        ):
            self._metrics.count("SweepStops")
            self._logger.info(
                "STOP found by the sweep",
                extra={"connection_id": session.connection_id, "epoch": session.epoch},
            )
            session.finish(ExitReason.STOPPED, via="sweep")

    async def _sweep_stranded(self, entry: IndexEntry) -> None:
        record = await self._offloader.io(self._leases.get, entry.pk)
        if (
            record is None
            or record.lease_owner != self.worker_id
            or record.lease_epoch != entry.epoch
            or entry.pk in self._sessions
            or entry.pk in self._taker.acquiring
            or not self._liveness.may_write(self._clock())
        ):
            return
        started = record.desired_state is DesiredState.STARTED
        lease = Lease(entry.pk, self.worker_id, entry.epoch)
        try:
            await self._offloader.io(self._leases.release, lease, stopped=not started)
        except LeaseError:
            return  # someone else's now, or not ours to release any more
        self._metrics.count("SweepReleases")
        self._logger.warning(
            "stranded connection released by the sweep",
            extra={"connection_id": record.connection_id, "epoch": entry.epoch,
                   "desired_state": record.desired_state.value},
        )
        if started:
            self._outbox.add(Hint(entry.pk, epoch=entry.epoch))

    async def _sweep_unlisted(self, session: Session) -> None:
        record = await self._offloader.io(self._leases.get, session.pk)
        if session.reason is None and (record is None or not is_ours(record, session.lease)):
            self._metrics.count("SweepFenced")
            self._logger.warning(
                "the sweep found a running session's connection owned elsewhere; fencing it",
                extra={"connection_id": session.connection_id, "epoch": session.epoch,
                       "holder": record.lease_owner if record else None},
            )
            session.fence("sweep")
