"""Frame parsing and resume URLs (pure, no I/O)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from wsfleet_worker.frames import (
    MAX_SAFE_SEQ,
    Frame,
    FrameKind,
    parse_frame,
    resume_url,
)


# ---------------------------------------------------------------- parse_frame
def test_simulator_frame_is_sequenced_and_stores_its_data_field():
    frame = parse_frame(json.dumps({"seq": 12, "data": "s1:12"}))
    assert frame == Frame(FrameKind.SEQUENCED, "s1:12", 12)


def test_frame_without_data_field_stores_the_whole_frame():
    raw = '{"seq": 3, "price": 10.5}'
    assert parse_frame(raw) == Frame(FrameKind.SEQUENCED, raw, 3)


def test_non_string_data_is_stored_as_compact_json():
    assert parse_frame('{"seq": 1, "data": {"a": [1, 2]}}').data == '{"a":[1,2]}'


def test_seq_field_is_configurable():
    frame = parse_frame('{"n": 5, "seq": "ignored", "data": "x"}', seq_field="n")
    assert (frame.kind, frame.seq) == (FrameKind.SEQUENCED, 5)


def test_digit_string_seq_is_accepted():
    assert parse_frame('{"seq": "42"}').seq == 42


def test_frame_without_seq_is_noseq_and_keeps_its_data():
    assert parse_frame('{"data": "s1:noseq"}') == Frame(FrameKind.NOSEQ, "s1:noseq")


@pytest.mark.parametrize(
    "raw",
    [
        "<<garbage>>",
        "",
        "[1, 2, 3]",
        "42",
        '{"seq": 0}',
        '{"seq": -1}',
        '{"seq": true}',
        '{"seq": 1.5}',
        '{"seq": "abc"}',
        '{"seq": null}',
        '{"seq": 100000000000000000000}',  # 21 digits: does not fit the sort key
        "[" * 100_000,  # deeply nested: RecursionError inside json
    ],
)
def test_malformed_frames_are_invalid_never_raise(raw):
    frame = parse_frame(raw)
    assert frame.kind is FrameKind.INVALID
    assert frame.seq is None
    assert frame.data == raw  # stored exactly as received: never dropped


def test_binary_utf8_frame_is_parsed_like_text():
    assert parse_frame(b'{"seq": 2, "data": "x"}') == Frame(FrameKind.SEQUENCED, "x", 2)


def test_binary_non_utf8_frame_is_kept_as_bytes():
    frame = parse_frame(b"\xff\xfe\x00")
    assert frame == Frame(FrameKind.INVALID, b"\xff\xfe\x00")


def test_invalid_seq_keeps_the_data_field():
    assert parse_frame('{"seq": "x", "data": "d"}') == Frame(FrameKind.INVALID, "d")


# ---------------------------------------------------------------- resume_url
def test_resume_param_is_appended():
    assert resume_url("ws://h:1/s1", "from_seq", 7) == "ws://h:1/s1?from_seq=7"


def test_existing_params_keep_their_exact_encoding():
    url = "wss://feed.example/x?token=a%2Bb%3D&list=1,2&flag"
    assert resume_url(url, "from_seq", 9) == url + "&from_seq=9"


def test_an_older_resume_value_is_replaced_not_duplicated():
    url = "ws://h/s?from_seq=3&a=1&from_seq=4"
    assert resume_url(url, "from_seq", 10) == "ws://h/s?a=1&from_seq=10"


def test_resume_param_name_is_configurable_and_quoted():
    assert resume_url("ws://h/s?a=1", "since id", 5) == "ws://h/s?a=1&since%20id=5"


def test_fragment_is_dropped():
    assert resume_url("ws://h/s?a=1#frag", "from_seq", 2) == "ws://h/s?a=1&from_seq=2"


def test_resume_disabled_by_the_record_leaves_the_url_alone():
    assert resume_url("ws://h/s?a=1&from_seq=3", "from_seq", 9, enabled=False) == (
        "ws://h/s?a=1&from_seq=3"
    )


def test_empty_param_name_disables_resume():
    assert resume_url("ws://h/s", "", 9) == "ws://h/s"


# ---------------------------------------------------------------- describe_error
def test_error_descriptions_redact_urls():
    from wsfleet_worker.connector import describe_error

    text = describe_error(ValueError("wss://user:pw@feed.example/s?token=abc is not a valid URI"))
    assert text == "ValueError: wss://feed.example/s?token=*** is not a valid URI"


# ---------------------------------------------------------------- hostile frames (issue #11)
def test_a_seq_of_5000_digits_is_an_invalid_frame_not_a_crash():
    # GIVEN a seq past Python's int() digit limit, as a string and as a bare JSON number
    for raw in ('{"seq": "' + "9" * 5000 + '", "data": "x"}', '{"seq": ' + "9" * 5000 + "}"):
        # WHEN it is parsed THEN it is stored as an invalid frame (local key, counted)
        frame = parse_frame(raw)
        assert frame.kind is FrameKind.INVALID and frame.seq is None


@pytest.mark.parametrize("seq", [10**20 - 1, MAX_SAFE_SEQ + 1, "9007199254740992", 0, -1, 1.5])
def test_a_seq_outside_1_to_2_pow_53_minus_1_is_invalid(seq):
    frame = parse_frame(json.dumps({"seq": seq, "data": "x"}))
    assert (frame.kind, frame.seq, frame.reason) == (FrameKind.INVALID, None, "bad-seq")


def test_the_largest_safe_seq_is_accepted():
    frame = parse_frame(json.dumps({"seq": str(MAX_SAFE_SEQ), "data": "x"}))
    assert (frame.kind, frame.seq) == (FrameKind.SEQUENCED, MAX_SAFE_SEQ)


def test_a_seq_jumping_past_the_window_is_invalid_and_within_it_accepted():
    raw = json.dumps({"seq": 1_000_011, "data": "x"})
    assert parse_frame(raw, highest_seq=10, max_seq_jump=1_000_000).reason == "seq-jump"
    assert parse_frame(raw, highest_seq=11, max_seq_jump=1_000_000).seq == 1_000_011
    # off (None or 0), and a brand-new stream (nothing seen yet) takes any safe seq
    assert parse_frame(raw, highest_seq=10, max_seq_jump=None).seq == 1_000_011
    assert parse_frame(raw, highest_seq=10, max_seq_jump=0).seq == 1_000_011
    assert parse_frame(raw, highest_seq=0, max_seq_jump=5).seq == 1_000_011


def test_non_ascii_data_is_stored_unescaped():
    # \u escapes made CJK data twice (and astral characters 3x) its UTF-8 size: items over 400 KB
    frame = parse_frame(json.dumps({"seq": 1, "data": {"t": "\u8a9e\U0001F600"}}))
    assert frame.data == '{"t":"\u8a9e\U0001F600"}'


def test_data_with_a_lone_surrogate_falls_back_to_the_raw_frame():
    raw = '{"seq": 1, "data": "\\ud800"}'
    assert parse_frame(raw).data == raw


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
frame_objects = st.fixed_dictionaries(
    {},
    optional={
        "seq": json_values | st.integers(min_value=-(10**30), max_value=10**30)
        | st.from_regex(r"\A[0-9]{1,40}\Z"),
        "data": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.text()
    | st.binary()
    | json_values.map(json.dumps)
    | frame_objects.map(lambda o: json.dumps(o, ensure_ascii=False)).map(str)
    | frame_objects.map(lambda o: json.dumps(o).encode()),
    highest=st.integers(min_value=0, max_value=MAX_SAFE_SEQ),
    jump=st.none() | st.integers(min_value=0, max_value=10**12),
)
def test_parse_frame_never_raises_and_keeps_its_promises(raw, highest, jump):
    frame = parse_frame(raw, highest_seq=highest, max_seq_jump=jump)
    # a seq is accepted only in range and, with a jump window, within it
    if frame.kind is FrameKind.SEQUENCED:
        assert frame.seq is not None and 1 <= frame.seq <= MAX_SAFE_SEQ
        assert not (jump and highest and frame.seq > highest + jump)
    else:
        assert frame.seq is None
    # whatever is stored can be stored: bytes, or a string that encodes as UTF-8
    if isinstance(frame.data, str):
        frame.data.encode("utf-8")
    else:
        assert isinstance(frame.data, bytes)


def test_deeply_nested_frames_are_invalid_not_a_crash():
    assert parse_frame("[" * 100_000).kind is FrameKind.INVALID
    nested = '{"seq": 1, "data": ' + "[" * 900 + "]" * 900 + "}"
    assert parse_frame(nested).kind is FrameKind.SEQUENCED


def test_module_examples_hold():
    import doctest

    from wsfleet_worker import frames

    assert doctest.testmod(frames).failed == 0
