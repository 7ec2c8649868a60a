"""``wsfleet start``'s upstream options: the builder, and bad input as exit status 2.

Every refusal here happens before a request is sent: the API URL is a closed port, so a
request would end with status 1 ("API unreachable"), never 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wsfleet_local.cli import app
from wsfleet_local.client import (
    UpstreamUsageError,
    build_upstream,
    parse_header,
    parse_secret_in,
    read_upstream_json,
)

REF = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/feeds/acme-AbCdEf"
PARAM = "arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/feeds/acme"
CLOSED_API = "http://127.0.0.1:9/dev"  # nothing listens on the discard port


# ---------------------------------------------------------------------------- the builder
def test_no_option_is_no_upstream_object() -> None:
    assert build_upstream() is None
    assert build_upstream({}) == {}  # an explicit --upstream '{}' is sent as given


def test_each_shape_from_options() -> None:
    # header-authenticated, the secret by reference
    assert build_upstream(
        headers=["X-Client: acme"], subprotocols=["feed.v2"], secret_ref=REF,
        secret_in="header:Authorization", secret_format="Bearer {{secret}}",
    ) == {
        "headers": {"X-Client": "acme"},
        "subprotocols": ["feed.v2"],
        "credential": {"ref": REF, "header": "Authorization", "format": "Bearer {{secret}}"},
    }
    # subscribe-to-resume, the seq deeper in the frame, the key inside the subscribe message
    assert build_upstream(
        subscribe='{"op": "subscribe", "from": "{{from_seq}}", "key": "{{secret}}"}',
        resume="subscribe", seq_pointer="/data/seq", secret_ref=PARAM, secret_in="subscribe",
        secret_json_key="token",
    ) == {
        "credential": {"ref": PARAM, "subscribe": True, "json_key": "token"},
        "subscribe": {"op": "subscribe", "from": "{{from_seq}}", "key": "{{secret}}"},
        "seq_pointer": "/data/seq",
        "resume": "subscribe",
    }
    # live only; a query-parameter credential
    assert build_upstream(resume="none") == {"resume": "none"}
    assert build_upstream(secret_ref=REF, secret_in="query:api_key")["credential"] == {
        "ref": REF, "query": "api_key",
    }


@pytest.mark.parametrize(
    ("text", "sent"),
    [
        ('{"op": "sub"}', {"op": "sub"}),
        ('[1, "two"]', [1, "two"]),
        ("SUBSCRIBE trades", "SUBSCRIBE trades"),
        ('"quoted"', '"quoted"'),  # a bare JSON string is text, sent as typed
        ("42", "42"),
    ],
)
def test_subscribe_is_json_only_when_it_is_an_object_or_array(text: str, sent: object) -> None:
    assert build_upstream(subscribe=text) == {"subscribe": sent}


def test_options_add_to_the_upstream_json_but_never_set_a_field_twice() -> None:
    base = {"headers": {"X-A": "1"}, "resume": "none"}
    assert build_upstream(base, headers=["X-B: 2"]) == {
        "headers": {"X-A": "1", "X-B": "2"}, "resume": "none",
    }
    with pytest.raises(UpstreamUsageError, match="resume is also set by --upstream") as caught:
        build_upstream(base, resume="query")
    assert caught.value.option == "--resume"
    with pytest.raises(UpstreamUsageError, match="header x-a is given twice"):
        build_upstream(base, headers=["x-a: 3"])


@pytest.mark.parametrize(
    ("kwargs", "option", "words"),
    [
        ({"headers": ["NoColon"]}, "--header", "expected 'Name: value'"),
        ({"headers": [" X: y"]}, "--header", "expected 'Name: value'"),
        ({"headers": ["Authorization: Bearer t0k3n"]}, "upstream.headers", "--header"),
        ({"headers": ["Host: evil.example"]}, "upstream.headers", "handshake"),
        ({"secret_ref": REF}, "--secret-ref", "needs --secret-in"),
        ({"secret_in": "header:X"}, "--secret-in", "needs --secret-ref"),
        ({"secret_format": "B {{secret}}"}, "--secret-format", "needs --secret-ref"),
        ({"secret_ref": REF, "secret_in": "cookie:x"}, "--secret-in", "header:NAME"),
        ({"secret_ref": REF, "secret_in": "header:"}, "--secret-in", "header:NAME"),
        ({"secret_ref": "wsfleet/feed", "secret_in": "header:X"}, "upstream.credential.ref",
         "ARN"),
        ({"secret_ref": REF, "secret_in": "query:k", "secret_format": "B {{secret}}"},
         "upstream.credential.format", "only to header"),
        ({"resume": "maybe"}, "upstream.resume", "query, subscribe, none"),
        ({"resume": "subscribe"}, "upstream.resume", "{{from_seq}}"),
        ({"subscribe": '{"from": "{{from_seq}}"}'}, "upstream.subscribe", "resume: subscribe"),
        ({"subscribe": "x" * 8193}, "upstream.subscribe", "8192 bytes"),
        ({"seq_pointer": "seq"}, "upstream.seq_pointer", "JSON pointer"),
        ({"subprotocols": ["a b"]}, "upstream.subprotocols", "token"),
    ],
)
def test_bad_options_name_what_to_fix(kwargs: dict, option: str, words: str) -> None:
    with pytest.raises(UpstreamUsageError) as caught:
        build_upstream(**kwargs)
    assert caught.value.option == option
    assert words in str(caught.value)
    assert "t0k3n" not in str(caught.value)  # a refused header value is never repeated


def test_the_secret_prefix_is_left_to_the_deployment() -> None:
    # The CLI cannot know UPSTREAM_SECRET_PREFIXES: any well-formed ARN passes locally and
    # the router decides (tests/integration/test_local_cli_api.py).
    other = "arn:aws:secretsmanager:us-west-2:210987654321:secret:elsewhere/x-AbCdEf"
    assert build_upstream(secret_ref=other, secret_in="header:X-Key") is not None


def test_small_parsers() -> None:
    assert parse_header("X-Client:acme") == ("X-Client", "acme")
    assert parse_header("X-Empty:") == ("X-Empty", "")
    assert parse_secret_in("query:token") == {"query": "token"}
    with pytest.raises(UpstreamUsageError):
        parse_secret_in("subscribe:key")  # the message says where: {{secret}}


def test_upstream_json_from_text_or_file(tmp_path: Path) -> None:
    path = tmp_path / "upstream.json"
    path.write_text('{"resume": "none"}')
    assert read_upstream_json(None, path) == {"resume": "none"}
    assert read_upstream_json('{"resume": "none"}', None) == {"resume": "none"}
    assert read_upstream_json(None, None) is None
    for text, path_, words in [
        ("{", None, "not JSON"),
        ("[]", None, "must be a JSON object"),
        ("{}", path, "not both"),
        (None, tmp_path / "missing.json", "cannot read"),
    ]:
        with pytest.raises(UpstreamUsageError, match=words):
            read_upstream_json(text, path_)


def test_upstream_json_the_decoder_refuses_is_a_usage_error() -> None:
    # Not JSONDecodeErrors: a plain ValueError (no .msg/.pos) and a RecursionError.
    huge_int = '{"seq": ' + "9" * 5000 + "}"
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for text, words in [(huge_int, "not JSON .*4300"), (deep, "not JSON .*recursion")]:
        with pytest.raises(UpstreamUsageError, match=words):
            read_upstream_json(text, None)


# ---------------------------------------------------------------------------- the command
runner = CliRunner()


def wsfleet(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-H", "NoColon"], "--header: expected 'Name: value'"),
        (["-H", "Authorization: Bearer t0k3n"], "upstream.credential"),
        (["--secret-ref", REF], "--secret-in"),
        (["--secret-ref", REF, "--secret-in", "body:x"], "header:NAME"),
        (["--resume", "none", "--subscribe", '{"f": "{{from_seq}}"}'], "resume: subscribe"),
        (["--upstream", "{not json"], "--upstream: not JSON"),
        (["--upstream", '{"resume": "none"}', "--resume", "query"], "also set by --upstream"),
        (["--upstream", '{"nope": 1}'], "unknown field"),
        (["--upstream-file", "/nonexistent/upstream.json"], "cannot read"),
        (["--seq-pointer", "data.seq"], "JSON pointer"),
    ],
)
def test_bad_input_is_exit_2_with_a_message_and_no_request(args: list[str], words: str) -> None:
    code, output = wsfleet("start", "c1", "wss://feed.example/v1", "--api", CLOSED_API, *args)
    assert code == 2, output
    assert words in " ".join(output.split())  # rich may wrap long lines
    assert "Traceback" not in output and "t0k3n" not in output


def test_an_unreachable_api_is_exit_1() -> None:
    # the same command with good options does try the API, which is not there
    code, output = wsfleet(
        "start", "c1", "wss://feed.example/v1", "--api", CLOSED_API, "--resume", "none"
    )
    assert code == 1
    assert "Traceback" not in output


def test_upstream_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"headers": {"Cookie": "session=abc"}}))
    code, output = wsfleet(
        "start", "c1", "wss://feed.example/v1", "--api", CLOSED_API, "--upstream-file", str(path)
    )
    assert code == 2 and "upstream.headers" in output and "session=abc" not in output
