"""bench.hop_probe: the SQS hop probe's samples joined, split into windows and summarised."""

from __future__ import annotations

import json

from bench.hop_probe import HOPS, merge_samples, path_floor, window_stats

T0 = 1_800_000_000.0


def sent(n: int, at: float, call: float) -> str:
    return json.dumps({"n": n, "sent": T0 + at, "returned": T0 + at + call})


def received(n: int, at: float) -> str:
    return json.dumps({"n": n, "received": T0 + at})


def test_send_and_receipt_lines_are_joined_per_message_and_broken_lines_skipped():
    # GIVEN the probe's lines in the order its threads wrote them, a receipt before its
    # send's line (the send thread wrote late), a duplicate receipt and a line cut by the kill
    lines = [sent(0, 0.0, 0.010), received(1, 0.150), sent(1, 0.100, 0.020), received(0, 0.040),
             received(0, 0.900), '{"n": 2, "sen', "", json.dumps(["not", "a", "record"])]

    # WHEN they are merged
    samples = merge_samples(lines)

    # THEN each message has its send, its return and its first receipt
    assert samples == {
        0: {"sent": T0, "returned": T0 + 0.010, "received": T0 + 0.040},
        1: {"sent": T0 + 0.100, "returned": T0 + 0.120, "received": T0 + 0.150},
    }


def test_a_window_counts_the_messages_sent_in_it_and_times_each_leg():
    # GIVEN five messages 0.1 s apart: send calls of 10-50 ms, receipts 30-250 ms after the
    # send began, the last one never received
    lines = [sent(0, 0.0, 0.010), received(0, 0.030),
             sent(1, 0.1, 0.020), received(1, 0.160),
             sent(2, 0.2, 0.030), received(2, 0.450),
             sent(3, 0.3, 0.040), received(3, 0.400),
             sent(4, 0.4, 0.050)]  # fmt: skip
    samples = merge_samples(lines)

    # WHEN the window [0.1 s, 0.5 s) is summarised
    window = window_stats(samples, T0 + 0.1, T0 + 0.5)

    # THEN it holds messages 1-4 (0 was sent before it), three of them received
    assert (window["sent"], window["received"]) == (4, 3)
    assert window["window_seconds"] == 0.4
    # AND the send call is each request's own time (20, 30, 40, 50 ms)
    assert (window["send_call"]["p50"], window["send_call"]["max"]) == (0.03, 0.05)
    # AND send -> receive runs from the call's start (60, 250, 100 ms), the hop from its
    # return (40, 220, 60 ms)
    assert window["send_to_receive"] == {"n": 3, "p50": 0.1, "p95": 0.25, "p99": 0.25,
                                         "max": 0.25, "min": 0.06}  # fmt: skip
    assert (window["hop"]["min"], window["hop"]["p50"], window["hop"]["max"]) == (
        0.04, 0.06, 0.22)
    # AND the path floor is the three hand-off hops at the send -> receive p50
    assert HOPS == 3
    assert path_floor(window) == 0.3


def test_a_window_without_receipts_has_no_path_floor():
    # GIVEN one message sent and never received, and a window nothing was sent in
    samples = merge_samples([sent(0, 0.0, 0.010)])

    # WHEN both windows are summarised
    lonely = window_stats(samples, T0, T0 + 1.0)
    empty = window_stats(samples, T0 + 5.0, T0 + 6.0)

    # THEN neither has a hop figure or a floor, and nothing is made up
    assert lonely == {"window_seconds": 1.0, "sent": 1, "received": 0,
                      "send_call": {"n": 1, "p50": 0.01, "p95": 0.01, "p99": 0.01,
                                    "max": 0.01, "min": 0.01}}  # fmt: skip
    assert empty == {"window_seconds": 1.0, "sent": 0, "received": 0}
    assert path_floor(lonely) is None and path_floor(empty) is None
