"""A giver's moves (issue #26, make-before-break): one move of a session at a time.

A session whose rebalancing move is under way (PREPARE sent to its taker, the session held)
may be found by a drain that begins meanwhile. A second PREPARE to another taker would open a
third upstream session of the stream (the giver's, two takers'), which an upstream allowing
two sessions per account refuses or answers by cutting one; the chaos suite's hand-off track
saw it (seed 20240601: w4 PREPAREd chaos-001 to w0-r1 for a rebalance, then to w3-r1 for its
drain 1.1 s later). The move under way ends the session: the drain waits for it.

The rig is the memstore session tests' own (lease store, upstream double, real flusher); the
taker never answers, so the move falls back at its bound.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from test_worker_session_memstore import WORKER, Rig, until
from worker_doubles import sync

from wsfleet.control import HandoffHint, PrepareCommand
from wsfleet_worker.handover import Handover
from wsfleet_worker.parts import WorkerParts
from wsfleet_worker.session_rules import ExitReason

QUEUES = "https://sqs.invalid/000000000000/wsfleet-ctl-"


def handover(rig: Rig, streaming: Any, sent: list[tuple[str, Any]]) -> Handover:
    async def send(queue_url: str, messages: list[Any]) -> set[str]:
        sent.extend((queue_url, message) for message in messages)
        return {message.pk for message in messages}

    async def nothing(*_args: Any) -> None:
        return None

    pk = streaming.record.pk
    parts = WorkerParts(worker_id=WORKER, leases=rig.store, offloader=rig.offloader,
                        metrics=rig.metrics, logger=rig.logger)  # fmt: skip
    return Handover(
        parts, None, SimpleNamespace(add=lambda hint: None),  # type: ignore[arg-type]
        prepare_seconds=0.3, queue_prefix="wsfleet-ctl",
        sessions={pk: streaming.session}, session_tasks={pk: streaming.task},
        prepared={}, prepared_tasks={}, start_prepared=nothing, adopt=nothing,  # type: ignore[arg-type]
        acquiring=set(), acquire=nothing, send=send,
        own_queue_url=lambda: f"{QUEUES}{WORKER}", has_room=lambda: True,
    )  # fmt: skip


@sync
async def test_a_session_under_a_move_gets_no_second_prepare_when_the_drain_begins():
    async with Rig() as rig:
        # GIVEN a giver streaming a connection whose rebalancing move to w2 is under way
        giver = await rig.streaming(1, 2, 3)
        sent: list[tuple[str, Any]] = []
        moves = handover(rig, giver, sent)
        moves.spawn_give(giver.session, "w2", f"{QUEUES}w2", ExitReason.REBALANCED)
        await until(lambda: any(isinstance(m, PrepareCommand) for _, m in sent), "PREPARE")

        # WHEN the worker drains and would hand the same session to w3
        moves.spawn_give(giver.session, "w3", f"{QUEUES}w3", ExitReason.SHUTDOWN, bound_ms=300)
        await moves.close()
        result = await asyncio.wait_for(giver.task, 10)

        # THEN only w2 was PREPAREd, the one move decided (no READY came: a fallback), and
        # the session ended by it, released, with w2 told to acquire
        prepares = [(queue, m.giver) for queue, m in sent if isinstance(m, PrepareCommand)]
        assert prepares == [(f"{QUEUES}w2", WORKER)]
        decided = rig.logger.extras("hand-off decided")
        assert [(d["taker"], d["decision"]) for d in decided] == [("w2", "no_ready")]
        assert (result.reason, result.released) == (ExitReason.REBALANCED, True)
        assert [queue for queue, m in sent if isinstance(m, HandoffHint)] == [f"{QUEUES}w2"]
