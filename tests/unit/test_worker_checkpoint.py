"""The checkpoint rule: durable = highest seq such that every received seq up to it is written."""

from __future__ import annotations

import random

from wsfleet_worker.checkpoint import CheckpointTracker


def test_starts_at_the_records_checkpoint_and_resumes_after_it():
    tracker = CheckpointTracker(durable=41)
    assert (tracker.durable, tracker.resume_from(), tracker.outstanding) == (41, 42, 0)


def test_in_order_writes_advance_the_checkpoint():
    tracker = CheckpointTracker()
    assert tracker.accept(1) and tracker.accept(2)
    assert tracker.written(1) is True
    assert tracker.durable == 1
    assert tracker.written(2) is True
    assert tracker.durable == 2


def test_checkpoint_never_passes_an_unwritten_frame():
    tracker = CheckpointTracker()
    for seq in (1, 2, 3):
        tracker.accept(seq)
    assert tracker.written(3) is False
    assert tracker.written(2) is False
    assert tracker.durable == 0
    assert tracker.written(1) is True
    assert tracker.durable == 3
    assert tracker.outstanding == 0


def test_frames_at_or_below_the_checkpoint_are_duplicates():
    tracker = CheckpointTracker(durable=10)
    assert tracker.accept(10) is False
    assert tracker.accept(3) is False
    assert tracker.outstanding == 0


def test_replayed_frames_still_in_flight_or_acknowledged_are_duplicates():
    tracker = CheckpointTracker()
    tracker.accept(1)
    tracker.accept(2)
    tracker.written(2)  # acknowledged, but 1 is still pending: durable stays 0
    assert tracker.resume_from() == 1
    # A reconnect resumes from 1: the upstream sends 1 and 2 again.
    assert tracker.accept(1) is False  # already queued
    assert tracker.accept(2) is False  # already written
    assert tracker.accept(3) is True
    tracker.written(1)
    assert tracker.durable == 2
    tracker.written(3)
    assert tracker.durable == 3


def test_gaps_in_upstream_numbering_do_not_block_the_checkpoint():
    tracker = CheckpointTracker()
    tracker.accept(5)
    tracker.accept(9)
    tracker.written(9)
    assert tracker.durable == 0
    tracker.written(5)
    assert tracker.durable == 9


def test_out_of_order_arrival_below_a_written_frame_holds_the_checkpoint():
    tracker = CheckpointTracker()
    tracker.accept(10)
    tracker.written(10)
    assert tracker.durable == 10
    tracker.accept(12)
    tracker.accept(11)
    tracker.written(12)
    assert tracker.durable == 10
    tracker.written(11)
    assert tracker.durable == 12


def test_unknown_or_repeated_acknowledgements_change_nothing():
    tracker = CheckpointTracker()
    tracker.accept(1)
    assert tracker.written(7) is False
    assert tracker.written(1) is True
    assert tracker.written(1) is False
    assert tracker.durable == 1


def test_highest_received_tracks_accepted_frames():
    tracker = CheckpointTracker(durable=3)
    tracker.accept(8)
    tracker.accept(5)
    assert tracker.highest_received == 8


def test_random_completion_order_matches_the_definition():
    rng = random.Random(7)
    for _ in range(200):
        tracker = CheckpointTracker()
        seqs = list(range(1, 40))
        for seq in seqs:
            tracker.accept(seq)
        order = seqs[:]
        rng.shuffle(order)
        written: set[int] = set()
        for seq in order:
            tracker.written(seq)
            written.add(seq)
            expected = 0
            while expected + 1 in written:
                expected += 1
            assert tracker.durable == expected
        assert tracker.outstanding == 0
        # memory is released once everything is written
        assert not tracker._acked and not tracker._acked_heap and not tracker._pending_heap
