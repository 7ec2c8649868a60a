"""The pure parts of a connect: the handshake plan, the credential value, the seq pointer."""

from __future__ import annotations

import json

import pytest

from wsfleet.upstream_options import (
    Credential,
    CredentialPlacement,
    ResumeMode,
    UpstreamOptions,
    parse_upstream_options,
)
from wsfleet_worker.credentials import CredentialUnavailable, parameter_name, secret_value
from wsfleet_worker.frames import FrameKind, parse_frame
from wsfleet_worker.handshake import Handshake, plan_handshake, same_origin, with_query_param

URL = "wss://feed.example/s?symbol=X"
SM = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/feed"
PREFIXES = ("arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/",)


def options(**raw: object) -> UpstreamOptions:
    return parse_upstream_options(raw, secret_prefixes=PREFIXES)


def plan(
    opts: UpstreamOptions, *, from_seq: int = 11, resume: bool = True, secret: str | None = None
) -> Handshake:
    return plan_handshake(
        URL, opts, from_seq=from_seq, resume_enabled=resume, default_resume_param="from_seq",
        secret=secret,
    )


def test_default_options_are_todays_dialogue() -> None:
    h = plan(UpstreamOptions())
    assert h.url == URL + "&from_seq=11"
    assert (h.headers, h.subprotocols, h.subscribe, h.origin_locked) == ((), (), None, False)
    assert h.asked_from == 11


def test_query_mode_uses_the_connections_resume_param() -> None:
    h = plan(options(resume_param="since"))
    assert h.url == URL + "&since=11" and h.asked_from == 11


def test_resume_false_asks_for_nothing() -> None:
    h = plan(UpstreamOptions(), resume=False)
    assert h.url == URL and h.asked_from is None


def test_subscribe_mode_puts_from_seq_in_the_message_not_the_url() -> None:
    opts = options(subscribe={"op": "sub", "from_seq": "{{from_seq}}"}, resume="subscribe")
    h = plan(opts)
    assert h.url == URL
    assert json.loads(h.subscribe or "") == {"op": "sub", "from_seq": 11}
    assert h.asked_from == 11
    live = plan(opts, resume=False)
    assert json.loads(live.subscribe or "") == {"op": "sub", "from_seq": None}
    assert live.asked_from is None


def test_none_mode_connects_live_and_sends_the_message_as_written() -> None:
    h = plan(options(subscribe={"op": "sub"}, resume="none"))
    assert h.url == URL and h.subscribe == '{"op":"sub"}' and h.asked_from is None


def test_headers_and_subprotocols_are_sent() -> None:
    h = plan(options(headers={"X-Client": "acme"}, subprotocols=["feed.v2"]))
    assert h.headers == (("X-Client", "acme"),) and h.subprotocols == ("feed.v2",)


def test_credential_in_a_header_through_its_format() -> None:
    opts = options(credential={"ref": SM, "header": "Authorization", "format": "Bearer {{secret}}"})
    h = plan(opts, secret="t0p")
    assert ("Authorization", "Bearer t0p") in h.headers
    assert h.origin_locked
    assert "t0p" not in repr(h)


def test_credential_in_the_query_is_encoded_and_replaces_an_old_value() -> None:
    h = plan_handshake(
        "wss://feed.example/s?token=old", options(credential={"ref": SM, "query": "token"}),
        from_seq=3, resume_enabled=True, default_resume_param="from_seq", secret="a&b c",
    )
    assert h.url == "wss://feed.example/s?from_seq=3&token=a%26b%20c"
    assert "a%26b" not in repr(h) and "a&b" not in repr(h)


def test_credential_in_the_subscribe_message_is_json_escaped() -> None:
    opts = options(
        credential={"ref": SM, "subscribe": True},
        subscribe={"op": "auth", "key": "{{secret}}"},
    )
    h = plan(opts, secret='q"x')
    assert json.loads(h.subscribe or "") == {"op": "auth", "key": 'q"x'}


def test_same_origin_and_query_helpers() -> None:
    assert same_origin("wss://a.example/x", "wss://a.example:443/y")
    assert not same_origin("wss://a.example/x", "wss://b.example/x")
    assert not same_origin("wss://a.example/x", "ws://a.example/x")
    assert not same_origin("wss://a.example/x", "wss://a.example:8443/x")
    assert with_query_param("ws://h/s", "k", "v") == "ws://h/s?k=v"


# ------------------------------------------------------------------------ credential values
def header_credential(**kw: object) -> Credential:
    return Credential(SM, CredentialPlacement.HEADER, "Authorization", **kw)  # type: ignore[arg-type]


def test_secret_value_picks_a_json_key() -> None:
    cred = header_credential(json_key="token")
    assert secret_value(cred, '{"token": "abc", "other": 1}') == "abc"
    assert secret_value(cred, b'{"token": "abc"}') == "abc"


@pytest.mark.parametrize(
    ("raw", "cred"),
    [
        ("line\r\nX-Evil: 1", header_credential()),  # header injection through the secret
        ("not json", header_credential(json_key="token")),
        ('{"token": 5}', header_credential(json_key="token")),
        ("", header_credential()),
        (b"\xff\xfe", header_credential()),
        (None, header_credential()),
    ],
)
def test_unusable_secrets_are_refused_without_quoting_them(raw: object, cred: Credential) -> None:
    with pytest.raises(CredentialUnavailable) as refused:
        secret_value(cred, raw)
    assert SM in str(refused.value)
    if isinstance(raw, str) and raw:
        assert raw not in str(refused.value)


def test_ssm_parameter_names_from_arns() -> None:
    assert parameter_name("arn:aws:ssm:us-east-1:123456789012:parameter/a/b") == "/a/b"
    assert parameter_name("arn:aws:ssm:us-east-1:123456789012:parameter/flat") == "flat"


# ------------------------------------------------------------------------ seq pointer
def test_seq_pointer_reads_a_nested_seq() -> None:
    frame = parse_frame('{"meta": {"seq": 9}, "data": "x"}', seq_pointer="/meta/seq")
    assert (frame.kind, frame.seq, frame.data) == (FrameKind.SEQUENCED, 9, "x")
    missing = parse_frame('{"seq": 9}', seq_pointer="/meta/seq")
    assert missing.kind is FrameKind.NOSEQ
    bad = parse_frame('{"meta": {"seq": -1}}', seq_pointer="/meta/seq")
    assert bad.kind is FrameKind.INVALID


def test_resume_none_is_a_mode_of_its_own() -> None:
    assert options(resume="none").resume is ResumeMode.NONE


def test_websockets_never_logs_handshake_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a worker whose logging is at DEBUG, WHEN it builds its connector, THEN websockets'
    # client logger still does not log requests (headers and query may carry a credential)
    import logging

    from wsfleet_worker.connector import make_connector

    client_log = logging.getLogger("websockets.client")
    monkeypatch.setattr(client_log, "level", logging.DEBUG)
    make_connector(allowed_hosts=(), allow_insecure=False)
    assert not client_log.isEnabledFor(logging.DEBUG)
