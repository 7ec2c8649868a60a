"""README "Real upstreams" stays true: every example in it is a START the router accepts.

The JSON blocks, the curl bodies and the ``wsfleet start`` lines are parsed out of the README
and checked with the router's own rules (``validate_ws_url``, ``parse_upstream_options``) and
the CLI's parser, so an example cannot drift from the schema. The limits its table states are
the schema's constants.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from wsfleet.upstream_options import (
    MAX_HEADER_VALUE_LENGTH,
    MAX_HEADERS,
    MAX_SUBPROTOCOLS,
    MAX_SUBSCRIBE_BYTES,
    CredentialPlacement,
    ResumeMode,
    UpstreamOptions,
    parse_upstream_options,
)
from wsfleet.upstream_url import validate_ws_url
from wsfleet_local.cli import app
from wsfleet_local.client import build_upstream
from wsfleet_local.fleet import local_secret_prefixes

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: The prefixes the section's own IAM paragraph deploys with (checked below).
PREFIXES = (
    "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/",
    "arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/",
)


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.index("\n## ", start + 1)
    return README[start:end]


SECTION = section("Real upstreams")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", SECTION, re.DOTALL)


def start_bodies() -> list[dict[str, Any]]:
    """Every START body of the section: its JSON blocks and its curl ``-d`` bodies."""
    bodies = [json.loads(block) for block in blocks("json")]
    for block in blocks("bash"):
        bodies += [json.loads(body) for body in re.findall(r"-d '([^']*)'", block)]
    return bodies


def accepted(body: dict[str, Any]) -> UpstreamOptions:
    """What the router does with a START body: the URL and the options, or an exception."""
    assert set(body) == {"ws_url", "upstream"}, body
    validate_ws_url(body["ws_url"], allowed_hosts=(), allow_insecure=False)
    return parse_upstream_options(body["upstream"], secret_prefixes=PREFIXES)


def test_the_section_shows_every_shape() -> None:
    options = [accepted(body) for body in (json.loads(b) for b in blocks("json"))]
    assert len(options) == 4
    # plain (query), header-authenticated by reference, subscribe-to-resume, live only
    assert [o.resume for o in options] == [
        ResumeMode.QUERY, ResumeMode.QUERY, ResumeMode.SUBSCRIBE, ResumeMode.NONE,
    ]
    header = options[1].credential
    assert header is not None and header.placement is CredentialPlacement.HEADER
    subscribe = options[2].credential
    assert subscribe is not None and subscribe.placement is CredentialPlacement.SUBSCRIBE
    assert options[2].seq_pointer == "/data/seq"


@pytest.mark.parametrize("body", start_bodies(), ids=lambda b: b["ws_url"])
def test_every_start_body_is_accepted(body: dict[str, Any]) -> None:
    accepted(body)


def test_the_prefixes_the_examples_need_are_the_ones_the_section_deploys() -> None:
    assert f"UpstreamSecretPrefix={PREFIXES[0]}" in SECTION
    # and the references of the examples are under them (the router would refuse others)
    refs = re.findall(r"arn:aws:(?:secretsmanager|ssm):[^\"'` ]+", SECTION)
    local = local_secret_prefixes("us-east-1")
    examples = [ref for ref in refs if ref not in local]
    assert examples and all(ref.startswith(PREFIXES) for ref in examples)


def test_the_local_prefixes_the_section_names_are_the_local_fleets() -> None:
    # what `wsfleet local up` accepts (its UpstreamSecretPrefix) is what the README says
    for prefix in local_secret_prefixes("us-east-1"):
        assert f"`{prefix}`" in SECTION


def cli_lines() -> list[str]:
    """The ``wsfleet`` commands of the section's bash blocks, continuation lines joined."""
    lines: list[str] = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            # `wsfleet local secret` needs a running backend: tests/integration/
            # test_readme_local_secrets.py runs those lines.
            if line.startswith("wsfleet ") and not line.startswith("wsfleet local "):
                lines.append(line.split("   #")[0])
    return lines


@pytest.mark.parametrize("line", cli_lines())
def test_every_cli_example_parses_and_reaches_the_api(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the file the --upstream-file example reads, and an API that is not there
    monkeypatch.chdir(tmp_path)
    (tmp_path / "upstream.json").write_text('{"resume": "none"}')
    args = [*shlex.split(line)[1:], "--api", "http://127.0.0.1:9/dev"]
    # WHEN it runs
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    # THEN its options were accepted (2 would be bad input) and it tried to call the API
    assert result.exit_code == 1, result.output
    assert "failed" in result.output


def test_the_cli_examples_send_the_json_examples_upstream_objects() -> None:
    # speech-1, md-1 and ticker-1 are the header, subscribe and live-only JSON examples
    json_examples = [json.loads(b)["upstream"] for b in blocks("json")]
    starts = [shlex.split(line) for line in cli_lines() if line.startswith("wsfleet start ")]
    by_id = {args[2]: args for args in starts}

    def upstream_of(connection_id: str) -> dict[str, Any] | None:
        args = by_id[connection_id]
        values: dict[str, list[str]] = {}
        for flag, value in zip(args[4::2], args[5::2], strict=True):
            values.setdefault(flag, []).append(value)
        one = {flag: given[-1] for flag, given in values.items()}
        return build_upstream(
            headers=values.get("-H", []), subprotocols=values.get("--subprotocol", []),
            secret_ref=one.get("--secret-ref"), secret_in=one.get("--secret-in"),
            secret_format=one.get("--secret-format"), subscribe=one.get("--subscribe"),
            seq_pointer=one.get("--seq-pointer"), resume=one.get("--resume"),
        )

    assert upstream_of("speech-1") == json_examples[1]
    assert upstream_of("md-1") == json_examples[2]
    assert upstream_of("ticker-1") == json_examples[3]


def test_the_limits_table_states_the_schema() -> None:
    assert MAX_SUBSCRIBE_BYTES == 8 * 1024 and "| 8 KiB as UTF-8" in SECTION
    assert f"at most {MAX_HEADERS}" in SECTION
    assert f"up to {MAX_HEADER_VALUE_LENGTH:,}" in SECTION
    assert f"1 to {MAX_SUBPROTOCOLS} distinct tokens" in SECTION


def test_the_sam_local_lines_name_every_upstream_sample() -> None:
    invoke = section("Invoke one function with sam local")
    for name in (
        "api_put_connection_header_secret",
        "api_post_events_start_subscribe",
        "api_put_connection_live_only",
        "api_post_events_header_in_plain",
    ):
        assert (ROOT / "events" / f"{name}.json").is_file()
        assert (
            f"sam local invoke RouterFunction -e events/{name}.json --env-vars env.json" in invoke
        )
