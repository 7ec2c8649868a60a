"""SendWindow: the bound on what a failover of an at-least-once sink re-sends (issue #27).

The property that matters: whatever a holder sent, the limit stored on the item covers it, so
the next owner's window ``(last_seq, sent_limit]`` holds every frame it can re-send.
"""

from __future__ import annotations

import random

from wsfleet_worker.checkpoint import CheckpointTracker, SendWindow


def test_a_fresh_connection_has_no_window_and_may_send_nothing_before_a_write():
    window = SendWindow(last_seq=0, sent_limit=None, frames=100)
    assert window.replay is None and window.takeovers == 0
    assert not window.allows(1)
    assert window.next_limit(durable=0) == 100


def test_a_takeover_inherits_the_window_above_the_checkpoint_and_counts_re_sends_in_it():
    window = SendWindow(last_seq=100, sent_limit=140, frames=1000, takeovers=2, replayed_frames=5)
    assert window.replay == (101, 140)
    assert window.allows(140) and not window.allows(141)
    for seq in (100, 101, 140, 141):
        window.written(seq)
    assert (window.takeovers, window.replayed_frames) == (3, 7)
    assert window.fields(1140) == {
        "sent_limit": 1140, "replayed_takeovers": 3, "replayed_frames": 7,
        "replayed_from_seq": 101, "replayed_to_seq": 140,
    }


def test_a_clean_hand_off_leaves_no_window():
    # the releasing holder stored sent_limit == last_seq (nothing in flight)
    window = SendWindow(last_seq=70, sent_limit=70, frames=10)
    assert window.replay is None and window.fields(80) == {"sent_limit": 80}
    assert window.final_limit(durable=75, outstanding=0) == 75
    window.stored(80)
    assert window.final_limit(durable=75, outstanding=3) == 80


def test_the_limit_is_raised_before_the_allowance_runs_out_and_never_lowered():
    window = SendWindow(last_seq=0, sent_limit=None, frames=100)
    window.stored(window.next_limit(durable=0))
    assert not window.running_low(74) and window.running_low(75)
    window.stored(50)  # a stale write's limit
    assert window.limit == 100
    # a seq jump past the window: let through once nothing is in flight, else wait for acks
    assert window.next_limit(durable=10, outstanding=0, waiting=500) == 500
    assert window.next_limit(durable=10, outstanding=2, waiting=500) == 110


def test_every_frame_sent_is_covered_by_the_limit_the_next_owner_reads():
    # A holder sends frames only up to its stored limit and raises it with checkpoints that
    # land at random moments; a crash at any point leaves a stored (last_seq, sent_limit)
    # window that holds every frame sent above the stored checkpoint, at most `frames` wide.
    rng = random.Random(27)
    for _ in range(200):
        frames = rng.randint(1, 50)
        stored_last, stored_limit = 0, None
        window = SendWindow(last_seq=0, sent_limit=None, frames=frames)
        tracker = CheckpointTracker()
        sent: list[int] = []
        seq = 0
        for _step in range(300):
            action = rng.random()
            if action < 0.6:  # the next frame arrives
                if window.allows(seq + 1):
                    seq += 1
                    tracker.accept(seq)
                    sent.append(seq)
                else:  # it waits for a checkpoint that raises the limit
                    limit = window.next_limit(tracker.durable, tracker.outstanding, seq + 1)
                    stored_last, stored_limit = max(stored_last, tracker.durable), limit
                    window.stored(limit)
            elif action < 0.9 and tracker.outstanding:  # a write is acknowledged
                pending = [s for s in sent if s > tracker.durable]
                tracker.written(rng.choice(pending))
            elif window.running_low(tracker.highest_received):
                limit = window.next_limit(tracker.durable)
                stored_last, stored_limit = max(stored_last, tracker.durable), limit
                window.stored(limit)
        inherited = SendWindow(last_seq=stored_last, sent_limit=stored_limit, frames=frames)
        above = [s for s in sent if s > stored_last]
        if above:
            assert inherited.replay is not None
            low, high = inherited.replay
            assert low <= min(above) and max(above) <= high
            assert high - stored_last <= frames
