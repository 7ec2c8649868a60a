"""The per-connection upstream options: strict parsing (each refusal names its field), the
item round trip, and the pure helpers the worker uses (seq pointer, subscribe rendering,
resume gap)."""

from __future__ import annotations

import json

import pytest

from wsfleet.exceptions import InvalidUpstreamOptions
from wsfleet.record import ConnectionRecord
from wsfleet.upstream_options import (
    DEFAULT_OPTIONS,
    MAX_SUBSCRIBE_BYTES,
    CredentialPlacement,
    ResumeMode,
    UpstreamOptions,
    parse_upstream_options,
    render_subscribe,
    resume_gap,
    seq_at,
)

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/upstream/feed-AbCdEf"
PARAM_ARN = "arn:aws:ssm:us-east-1:123456789012:parameter/wsfleet/upstream/feed"
PREFIXES = (
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/upstream/",
    "arn:aws:ssm:us-east-1:123456789012:parameter/wsfleet/upstream/",
)


def parse(raw: object, prefixes: tuple[str, ...] = PREFIXES) -> UpstreamOptions:
    return parse_upstream_options(raw, secret_prefixes=prefixes)


def test_absent_or_empty_is_todays_dialogue() -> None:
    assert parse(None) is DEFAULT_OPTIONS
    assert parse({}) == DEFAULT_OPTIONS
    assert DEFAULT_OPTIONS.pointer("seq") == "/seq"
    assert DEFAULT_OPTIONS.pointer("a/b") == "/a~1b"


def test_full_options_round_trip_through_the_item() -> None:
    options = parse(
        {
            "headers": {"X-Client": "acme", "Origin": "https://acme.example"},
            "subprotocols": ["feed.v2", "feed.v1"],
            "credential": {"ref": SECRET_ARN, "header": "Authorization",
                           "format": "Bearer {{secret}}", "json_key": "token"},
            "subscribe": {"op": "sub", "from": "{{from_seq}}", "tags": ["a", 1.5]},
            "seq_pointer": "/meta/seq",
            "resume": "subscribe",
            "normal_close": "final",
        }
    )
    assert options.final_normal_close
    assert options.credential is not None
    assert options.credential.placement is CredentialPlacement.HEADER
    assert options.credential.service == "secretsmanager"
    assert options.credential.render("s3cr3t") == "Bearer s3cr3t"
    record = ConnectionRecord.new("c1", "wss://feed.example/x", 1).with_changes(upstream=options)
    item = json.loads(json.dumps(record.to_item()))  # plain JSON types only (no tuples)
    assert ConnectionRecord.from_item(item).upstream == options
    view = options.to_view()
    assert view["headers"] == {"X-Client": "***", "Origin": "***"}
    assert view["subscribe"] == {"op": "sub", "from": "{{from_seq}}", "tags": ["a", 1.5]}
    assert view["credential"]["ref"] == SECRET_ARN
    assert view["normal_close"] == "final"


def test_handoff_mode_is_stored_only_when_given_and_reads_back() -> None:
    from wsfleet.upstream_options import HandoffMode, UpstreamOptions

    assert parse(None).handoff is None and "handoff" not in parse(None).to_item()
    for mode in HandoffMode:
        options = parse({"handoff": mode.value})
        assert options.handoff is mode
        assert options.to_item() == {"handoff": mode.value}
        assert UpstreamOptions.from_item(options.to_item()) == options
        assert options.to_view()["handoff"] == mode.value


def test_normal_close_reconnect_is_the_default_and_is_not_stored() -> None:
    assert parse({"normal_close": "reconnect"}) == parse(None)
    assert not parse(None).final_normal_close
    assert "normal_close" not in parse({"normal_close": "reconnect"}).to_item()


def test_default_options_leave_the_item_as_it_was() -> None:
    item = ConnectionRecord.new("c1", "wss://feed.example/x", 1).to_item()
    assert "upstream" not in item and "gap_frames" not in item and "resume_gaps" not in item


def test_parameter_credentials_resolve_through_ssm() -> None:
    options = parse({"credential": {"ref": PARAM_ARN, "query": "token"}})
    assert options.credential is not None
    assert options.credential.service == "ssm"
    assert options.credential.placement is CredentialPlacement.QUERY
    assert options.credential.render("v") == "v"


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ([], "upstream", "must be an object"),
        ({"header": {}}, "upstream", "unknown field"),
        ({"headers": {"Host": "x"}}, "upstream.headers", "handshake"),
        ({"headers": {"sec-websocket-key": "x"}}, "upstream.headers", "handshake"),
        ({"headers": {"Connection": "close"}}, "upstream.headers", "handshake"),
        ({"headers": {"Proxy-Authorization": "x"}}, "upstream.headers", "handshake"),
        ({"headers": {"Authorization": "Bearer x"}}, "upstream.headers", "credential"),
        ({"headers": {"cookie": "a=b"}}, "upstream.headers", "credential"),
        ({"headers": {"X-A": "a\r\nX-Injected: 1"}}, "upstream.headers", "line breaks"),
        ({"headers": {"X-A": "x" * 1025}}, "upstream.headers", "1024"),
        ({"headers": {"bad name": "x"}}, "upstream.headers", "token"),
        ({"headers": {f"X-{i}": "v" for i in range(17)}}, "upstream.headers", "16"),
        ({"headers": {"X-A": 1}}, "upstream.headers", "strings"),
        ({"subprotocols": "v1"}, "upstream.subprotocols", "list"),
        ({"subprotocols": ["a", "a"]}, "upstream.subprotocols", "twice"),
        ({"subprotocols": [f"p{i}" for i in range(9)]}, "upstream.subprotocols", "8"),
        ({"subscribe": ""}, "upstream.subscribe", "empty"),
        ({"subscribe": 5}, "upstream.subscribe", "object"),
        ({"subscribe": "x" * 8193}, "upstream.subscribe", "8192"),
        ({"subscribe": "{{symbol}}"}, "upstream.subscribe", "unknown placeholder"),
        ({"subscribe": "{{ from_seq }}", "resume": "subscribe"}, "upstream.subscribe", "spaces"),
        ({"subscribe": "hi {{from_seq}}"}, "upstream.subscribe", "resume: subscribe"),
        ({"resume": "subscribe"}, "upstream.resume", "{{from_seq}}"),
        ({"resume": "replay"}, "upstream.resume", "one of"),
        ({"resume": "none", "resume_param": "p"}, "upstream.resume_param", "query"),
        ({"resume_param": "a b"}, "upstream.resume_param", "token"),
        ({"normal_close": "stop"}, "upstream.normal_close", "reconnect, final"),
        ({"normal_close": True}, "upstream.normal_close", "reconnect, final"),
        ({"handoff": "make"}, "upstream.handoff", "overlap, break"),
        ({"handoff": ["overlap"]}, "upstream.handoff", "overlap, break"),
        ({"handoff": True}, "upstream.handoff", "overlap, break"),
        ({"seq_pointer": "seq"}, "upstream.seq_pointer", "JSON pointer"),
        ({"seq_pointer": "/a~2"}, "upstream.seq_pointer", "escape"),
        ({"seq_pointer": "/a" * 17}, "upstream.seq_pointer", "segments"),
        ({"credential": {"ref": SECRET_ARN, "header": "Authorization"}}, "upstream.credential",
         None),  # refused only because prefixes are empty below
        ({"credential": {"ref": "wsfleet/feed", "header": "X-Key"}}, "upstream.credential.ref",
         "ARN"),
        ({"credential": {"ref": SECRET_ARN.replace("wsfleet/upstream", "prod/db"),
                         "query": "k"}}, "upstream.credential.ref", "outside"),
        ({"credential": {"ref": SECRET_ARN}}, "upstream.credential", "exactly one"),
        ({"credential": {"ref": SECRET_ARN, "query": "k", "header": "X-K"}},
         "upstream.credential", "exactly one"),
        ({"credential": {"ref": SECRET_ARN, "header": "X-K", "format": "no placeholder"}},
         "upstream.credential.format", "{{secret}}"),
        ({"credential": {"ref": SECRET_ARN, "query": "k", "format": "{{secret}}"}},
         "upstream.credential.format", "header"),
        ({"credential": {"ref": SECRET_ARN, "header": "Host"}}, "upstream.credential.header",
         "handshake"),
        ({"credential": {"ref": SECRET_ARN, "header": "X-K"}, "headers": {"x-k": "1"}},
         "upstream.credential.header", "twice"),
        ({"credential": {"ref": SECRET_ARN, "subscribe": True}}, "upstream.credential",
         "{{secret}}"),
        ({"subscribe": {"k": "{{secret}}"}}, "upstream.subscribe", "{{secret}}"),
        ({"credential": {"ref": SECRET_ARN, "subscribe": "yes"}},
         "upstream.credential.subscribe", "true"),
        ({"credential": {"ref": SECRET_ARN, "query": "k", "json_key": ""}},
         "upstream.credential.json_key", "json_key"),
        ({"credential": {"ref": SECRET_ARN, "query": "k", "value": "plain"}},
         "upstream.credential", "unknown field"),
    ],
)
def test_refusals_name_the_field(raw: object, field: str, words: str | None) -> None:
    prefixes = () if words is None else PREFIXES
    with pytest.raises(InvalidUpstreamOptions) as info:
        parse(raw, prefixes)
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert (words or "turned off") in str(info.value)


def test_secret_in_subscribe_is_rendered_json_escaped() -> None:
    options = parse(
        {
            "credential": {"ref": SECRET_ARN, "subscribe": True},
            "subscribe": {"auth": "{{secret}}", "from": "{{from_seq}}", "note": "at {{from_seq}}"},
            "resume": "subscribe",
        }
    )
    text = render_subscribe(options, from_seq=42, secret='to"k\\en')
    assert json.loads(text or "") == {"auth": 'to"k\\en', "from": 42, "note": "at 42"}
    live = json.loads(render_subscribe(options, from_seq=None, secret="t") or "")
    assert live["from"] is None


def test_text_subscribe_is_rendered_verbatim() -> None:
    options = parse({"subscribe": "SUB trades {{from_seq}}", "resume": "subscribe"})
    assert render_subscribe(options, from_seq=7) == "SUB trades 7"
    assert render_subscribe(DEFAULT_OPTIONS, from_seq=7) is None


def test_seq_at_follows_the_pointer_and_never_raises() -> None:
    frame = {"meta": {"seq": 9, "list": [1, 2]}, "a~b": 3}
    assert seq_at(frame, "/meta/seq") == (True, 9)
    assert seq_at(frame, "/meta/list/1") == (True, 2)
    assert seq_at(frame, "/a~0b") == (True, 3)
    for pointer in ("/meta/list/01", "/meta/list/9", "/meta/seq/x", "/nope", "/meta/list/-1"):
        assert seq_at(frame, pointer) == (False, None)
    assert seq_at("text", "/seq") == (False, None)


def test_resume_mode_none_parses_and_gap_arithmetic() -> None:
    assert parse({"resume": "none"}).resume is ResumeMode.NONE
    assert resume_gap(100, 101) == 0
    assert resume_gap(100, 150) == 49
    assert resume_gap(100, 50) == 0  # replayed older frames: duplicates, not a gap
    assert resume_gap(0, 1000) == 0  # a new stream may start anywhere


def test_subscribe_limit_is_8_kib_measured_as_utf8() -> None:
    # GIVEN messages at the limit, in ASCII and in 2-byte characters
    assert parse({"subscribe": "x" * MAX_SUBSCRIBE_BYTES}).subscribe == "x" * 8192
    assert parse({"subscribe": "é" * (MAX_SUBSCRIBE_BYTES // 2)}).subscribe is not None
    # THEN one byte more is refused, naming the field
    for too_big in ("x" * (MAX_SUBSCRIBE_BYTES + 1), "é" * (MAX_SUBSCRIBE_BYTES // 2) + "x"):
        with pytest.raises(InvalidUpstreamOptions) as caught:
            parse({"subscribe": too_big})
        assert caught.value.field == "upstream.subscribe"


@pytest.mark.parametrize(
    ("seq_field", "pointer", "stored"),
    [
        ("seq", "/seq", None),  # the default, spelled out: not stored
        ("seq", "/meta/seq", "/meta/seq"),
        ("seq", "/Seq", "/Seq"),  # pointers are case-sensitive
        ("n", "/seq", "/seq"),  # not the default of a fleet whose SEQ_FIELD is n
        ("n", "/n", None),
        ("a/b", "/a~1b", None),
    ],
)
def test_a_pointer_that_names_the_default_seq_field_is_the_default(
    seq_field: str, pointer: str, stored: str | None
) -> None:
    options = parse_upstream_options(
        {"seq_pointer": pointer}, secret_prefixes=(), default_seq_field=seq_field
    )
    assert options.seq_pointer == stored
    assert options.pointer(seq_field) == pointer
    assert ("seq_pointer" in options.to_item()) is (stored is not None)
