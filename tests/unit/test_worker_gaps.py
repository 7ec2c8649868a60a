"""The session's resume-gap bookkeeping over the in-memory lease store (no I/O).

What must hold for the gap report to be honest: totals add to the counts the session acquired
with, the newest totals land last, no checkpoint is written past a gap that is not stored, and
the final write waits for pending totals.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_worker_decisions import Store, connect, ended, log_of, make_worker, receive, sync

from wsfleet.exceptions import StoreError
from wsfleet.lease import Lease
from wsfleet.record import connection_pk
from wsfleet.upstream_options import resume_gap
from wsfleet_worker.session_rules import ExitReason


class GapStore(Store):
    """Counts note_gap writes (in order) and fails the first ``gap_failures`` of them."""

    def __init__(self) -> None:
        super().__init__()
        self.gap_failures = 0
        self.gaps: list[tuple[int, int]] = []

    def note_gap(self, lease: Lease, *, resumes: int, frames: int) -> None:
        self.writes.append(("note_gap", lease.pk))
        if self.gap_failures:
            self.gap_failures -= 1
            raise StoreError("throttled")
        self.gaps.append((resumes, frames))
        super().note_gap(lease, resumes=resumes, frames=frames)


async def settled(session: Any) -> None:
    while session._gap_tasks:
        await asyncio.gather(*session._gap_tasks)


@sync
async def test_no_checkpoint_passes_a_gap_that_is_not_stored():
    # GIVEN a session whose first frame after a resume skipped 10 frames, and a table that
    # refuses the gap write twice
    store = GapStore()
    worker = make_worker(store)
    session = connect(worker, store, "g1")
    store.gap_failures = 2
    session._first_frame(10, 21)
    receive(session, 21)
    # WHEN the checkpoint is written
    await session.checkpoint()
    await settled(session)
    # THEN the gap landed first, then the checkpoint past it
    record = store.get(session.pk)
    assert (record.resume_gaps, record.gap_frames, record.last_seq) == (1, 10, 21)
    kinds = [kind for kind, pk in store.writes if pk == session.pk]
    assert kinds.index("checkpoint") > max(i for i, k in enumerate(kinds) if k == "note_gap")
    assert worker.metrics.totals["ResumeGapFrames"] == 10
    assert worker.metrics.totals["GapWriteFailures"] == 2
    session.finish(ExitReason.SHUTDOWN)
    await ended(worker, session)


@sync
async def test_totals_add_to_the_acquired_counts_and_the_newest_lands_last():
    # GIVEN a connection whose earlier holders reported 1 gap of 5 frames
    store = GapStore()
    store.start("g2", "wss://up.example/g2")
    first = store.acquire(connection_pk("g2"), "w0")
    store.note_gap(Lease.of(first), resumes=1, frames=5)
    store.release(Lease.of(first))
    worker = make_worker(store)
    session = connect(worker, store, "g2")
    assert (session.gap_resumes, session.gap_frames) == (1, 5)
    # WHEN two resumes in a row skip frames (the second before the first write lands)
    session._first_frame(100, 104)
    session._first_frame(200, 210)
    session._first_frame(300, 301)  # no gap: not counted
    await settled(session)
    # THEN the stored totals are the sums, written in order, the last one the newest
    record = store.get(session.pk)
    assert (record.resume_gaps, record.gap_frames) == (3, 5 + 3 + 9)
    assert store.gaps[-1] == (3, 17)
    assert store.gaps == sorted(store.gaps)
    session.finish(ExitReason.SHUTDOWN)
    await ended(worker, session)


@sync
async def test_the_final_write_stores_pending_totals_before_the_release():
    # GIVEN a gap counted whose write failed every attempt so far
    store = GapStore()
    worker = make_worker(store)
    session = connect(worker, store, "g3")
    store.gap_failures = 5
    session._first_frame(50, 60)
    await settled(session)
    assert session.gaps_pending
    # WHEN the session hands the connection over
    session.finish(ExitReason.SHUTDOWN)
    await ended(worker, session)
    # THEN the totals were stored before the release
    record = store.get(session.pk)
    assert (record.resume_gaps, record.gap_frames) == (1, 9)
    assert record.lease_owner == ""
    kinds = [kind for kind, pk in store.writes if pk == session.pk]
    assert kinds[-1] == "release" and kinds[-2] == "note_gap"


def test_a_brand_new_stream_has_no_gap():
    store = GapStore()

    async def scenario() -> None:
        worker = make_worker(store)
        session = connect(worker, store, "g4")
        session._first_frame(0, 5000)  # feeds may start anywhere
        assert (session.gap_resumes, session.gap_frames) == (0, 0)
        session.finish(ExitReason.SHUTDOWN)
        await ended(worker, session)

    asyncio.run(scenario())


@sync
async def test_a_gap_is_logged_against_the_highest_seq_it_was_measured_from():
    # Issue #23: the log line said "resumed past the checkpoint", while the baseline is the
    # highest seq received (or, for a live-only takeover, stored), not the checkpoint.
    store = GapStore()
    worker = make_worker(store)
    session = connect(worker, store, "g5")
    session._first_frame(40, 46)
    await settled(session)
    lines = [(m, e) for _, m, e in log_of(worker).lines if "frames lost" in m]
    assert len(lines) == 1
    message, extra = lines[0]
    assert "checkpoint" not in message and "highest seq" in message
    assert (extra["highest_seq"], extra["first_seq"], extra["gap_frames"]) == (40, 46, 5)
    session.finish(ExitReason.SHUTDOWN)
    await ended(worker, session)


def test_the_readme_gives_the_gap_formula_the_worker_uses():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    text = " ".join(readme.split())
    assert "`first seq - checkpoint - 1`" not in text
    assert "`first seq - highest seq - 1`" in text
    assert resume_gap(40, 46) == 46 - 40 - 1
