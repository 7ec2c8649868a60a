"""LeaseTaker: how a worker takes connections on (the Kinesis Client Library's ``LeaseTaker``).

The hint poller (:mod:`~wsfleet_worker.poller`) knows queues, not leases; it asks the taker
how many hints it may receive (:meth:`LeaseTaker.free_slots`), how many of a batch fit
(:meth:`LeaseTaker.capacity_left`), which connections already run here
(:meth:`LeaseTaker.running`), and hands it each hint (:meth:`LeaseTaker.acquire`). The taker:

* refuses room while the worker drains, is fenced, or its worker lease renewal runs late
  (more than a quarter of a heartbeat): the connections it holds come before new ones;
* acquires through :meth:`wsfleet.store.LeaseStore.acquire`, the real decision: a STARTED
  connection that is free or whose owner's worker lease is over. An **early hint** (the owner
  lapses within ``EARLY_HINT_MAX_WAIT_MS``: the store says so with
  :attr:`~wsfleet.exceptions.LeaseConflict.retry_in_ms`) waits for the lapse inside its round
  and tries once more;
* never acquires past the self-fence deadline (after a pause its coroutine may run before the
  liveness task has noticed): a connection taken then would die with the worker;
* **hands back** a connection won while draining (released at once and hinted to a peer);
* keeps the pks being acquired (:attr:`LeaseTaker.acquiring`), which count against capacity
  and which the sweep leaves alone.

A won connection is started by the worker (``start_session``); the taker holds no sessions,
it reads the worker's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from enum import Enum

from wsfleet.exceptions import (
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseError,
    WsfleetError,
)
from wsfleet.hints import Hint
from wsfleet.lease import Lease
from wsfleet.record import ConnectionRecord, connection_id_from_pk

from .connector import describe_error
from .liveness import WorkerLiveness
from .outbox import HintOutbox
from .parts import WorkerParts, WorkerRole
from .session import Session, SessionResult

__all__ = ["HintOutcome", "LeaseTaker"]


class HintOutcome(Enum):
    """What to do with a hint message after trying to act on it."""

    DONE = "done"  # started, or refused for good (conflict, STOPPED, gone): delete it
    GIVE_BACK = "give_back"  # no room after all: visible again now, for a peer
    RETRY_LATER = "retry_later"  # store trouble: let the visibility timeout bring it back


class LeaseTaker(WorkerRole):
    """Takes connections on for one worker; see the module docstring.

    :param sessions: the worker's sessions by pk (read only here).
    :param session_tasks: their tasks (a hint for a session still ending waits for it).
    :param start_session: starts a session for a connection just won.
    """

    def __init__(
        self,
        parts: WorkerParts,
        liveness: WorkerLiveness,
        outbox: HintOutbox,
        *,
        max_connections: int,
        heartbeat_seconds: float,
        sessions: Mapping[str, Session],
        session_tasks: Mapping[str, asyncio.Task[SessionResult]],
        start_session: Callable[[ConnectionRecord], None],
    ) -> None:
        super().__init__(parts)
        self._liveness = liveness
        self._outbox = outbox
        self._max_connections = max_connections
        self._heartbeat_seconds = heartbeat_seconds
        self._sessions = sessions
        self._session_tasks = session_tasks
        self._start_session = start_session
        #: Connections being acquired now: they count against capacity, and the sweep
        #: leaves them alone (the index may show them ours before a session runs).
        self.acquiring: set[str] = set()
        self._stopping = False

    def stop(self) -> None:
        """The worker drains: no room from now on; a lease won meanwhile is handed back."""
        self._stopping = True

    # ------------------------------------------------------------------ capacity
    def free_slots(self) -> int:
        """Connections this worker may take on now.

        Zero while draining or fenced, and while the worker lease renewal runs late (more
        than a quarter of the heartbeat): the connections already held come before new ones.
        """
        liveness = self._liveness
        if (
            self._stopping
            or liveness.fenced
            or liveness.behind_ms(self._clock()) > int(self._heartbeat_seconds * 1000) // 4
        ):
            return 0
        return self.capacity_left()

    def capacity_left(self) -> int:
        """Connections that fit at all (sessions and acquires in flight count)."""
        return self._max_connections - len(self._sessions) - len(self.acquiring)

    def running(self) -> set[str]:
        """Connections streaming here now (sessions already ending do not count)."""
        return {pk for pk, session in self._sessions.items() if session.reason is None}

    # ------------------------------------------------------------------ acquiring
    async def acquire(self, hint: Hint) -> HintOutcome:
        """Acquire the hinted connection and start it; see :class:`HintOutcome`."""
        pk = hint.pk
        if pk in self.acquiring:
            return HintOutcome.DONE
        ending = self._sessions.get(pk)
        if ending is not None:
            if ending.reason is None:
                return HintOutcome.DONE  # streaming here already: a duplicate hint
            # A session of ours is still winding down (e.g. it self-fenced): let it finish,
            # then compete for the lease like anyone else.
            task = self._session_tasks.get(pk)
            if task is not None:
                await asyncio.wait({task}, timeout=self._heartbeat_seconds * 2)
            if pk in self._sessions:
                return HintOutcome.GIVE_BACK
        # may_write, not only fenced: after a pause this coroutine may run before the liveness
        # task has noticed the deadline passed, and a connection taken now would die with us.
        if (
            self._stopping
            or not self._liveness.may_write(self._clock())
            or self.capacity_left() <= 0
        ):
            return HintOutcome.GIVE_BACK
        self.acquiring.add(pk)
        began = self._clock()
        try:
            record = await self._acquire_lease(pk)
            if record is None:  # began to drain while waiting for the lease to lapse
                return HintOutcome.GIVE_BACK
        except (LeaseConflict, ConnectionStopped, ConnectionNotFound) as exc:
            self._metrics.count("AcquireConflicts")
            current = exc.current if isinstance(exc, LeaseError) else None
            self._logger.debug(
                "hint dropped",
                extra={
                    "connection_id": connection_id_from_pk(pk),
                    "reason": type(exc).__name__,
                    "holder": current.lease_owner if current else None,
                },
            )
            return HintOutcome.DONE
        except WsfleetError as exc:
            self._logger.warning(
                "acquire failed; hint left for redelivery",
                extra={"connection_id": connection_id_from_pk(pk), "error": describe_error(exc)},
            )
            return HintOutcome.RETRY_LATER
        finally:
            self.acquiring.discard(pk)
        self._metrics.count("Acquired")
        self._logger.debug(
            "lease acquired",
            extra={"connection_id": record.connection_id, "acquire_ms": self._clock() - began},
        )
        if self._liveness.fenced:
            # Won under a lease that is over: write nothing more; it lapses with the worker's.
            return HintOutcome.DONE
        if self._stopping:  # won a lease while draining: give it straight back
            await self._hand_back(record)
            return HintOutcome.DONE
        self._start_session(record)
        return HintOutcome.DONE

    async def _acquire_lease(self, pk: str) -> ConnectionRecord | None:
        """Acquire, waiting once for an owner's lease that is about to lapse (an early hint:
        the store says so with ``LeaseConflict.retry_in_ms``).

        The wait happens inside the hint's round; the poller keeps receiving meanwhile.
        """
        try:
            return await self._offloader.io(self._leases.acquire, pk, self.worker_id)
        except LeaseConflict as conflict:
            wait_ms = conflict.retry_in_ms
            if wait_ms is None:
                raise
        self._metrics.count("EarlyHintWaits")
        await asyncio.sleep(wait_ms / 1000)
        if self._stopping or self._liveness.fenced:
            return None
        return await self._offloader.io(self._leases.acquire, pk, self.worker_id)

    async def _hand_back(self, record: ConnectionRecord) -> None:
        """Release a connection won while draining (if this fails, the sweep or the worker's
        expiry frees it)."""
        lease = Lease.of(record)
        if not self._liveness.may_write(self._clock()):
            return
        try:
            await self._offloader.io(self._leases.release, lease)
        except WsfleetError:
            return
        self._outbox.add(Hint(record.pk, epoch=lease.epoch))
