"""Frame parsing, resume URLs and URL redaction (pure, no I/O)."""

from __future__ import annotations

import json

import pytest

from wsfleet_worker.frames import Frame, FrameKind, parse_frame, redact_url, resume_url


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


def test_largest_seq_that_fits_twenty_digits_is_valid():
    assert parse_frame('{"seq": 99999999999999999999}').seq == 10**20 - 1


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


# ---------------------------------------------------------------- redact_url
@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("wss://user:pw@feed.example:8443/s?token=secret#x", "wss://feed.example:8443/s"),
        ("ws://127.0.0.1:9000/stream?from_seq=4", "ws://127.0.0.1:9000/stream"),
        ("ws://[::1]:9000/s?k=v", "ws://[::1]:9000/s"),
    ],
)
def test_redacted_urls_carry_no_credentials_or_query(url, safe):
    assert redact_url(url) == safe


def test_unparseable_url_is_not_echoed():
    assert redact_url("ws://h:notaport/s?token=x") == "<unparseable url>"


def test_error_descriptions_redact_urls():
    from wsfleet_worker.upstream import describe_error

    text = describe_error(ValueError("wss://user:pw@feed.example/s?token=abc is not a valid URI"))
    assert text == "ValueError: wss://feed.example/s is not a valid URI"
