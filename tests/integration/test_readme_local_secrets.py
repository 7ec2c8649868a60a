"""README "Real upstreams": the local secrets example works as written (issue #23).

It used to say ``aws --endpoint-url ... secretsmanager create-secret ...``, which needed the
``aws`` CLI (not installed by ``make install``), region us-east-1, dummy credentials and, for
SSM, a name starting with ``/wsfleet/``, none of which it said. The README's own
``wsfleet local secret`` lines are run here against the embedded backend with no AWS
configuration at all, and what they print is a reference the local router accepts and the
worker's resolver reads.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from wsfleet.upstream_options import parse_upstream_options
from wsfleet_local.cli import app
from wsfleet_local.fleet import local_secret_prefixes
from wsfleet_worker.credentials import SecretResolver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = "http://127.0.0.1:9"
README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def secret_lines() -> list[str]:
    start = README.index("\n## Real upstreams\n")
    section = README[start : README.index("\n## ", start + 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    lines = [line for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("wsfleet local secret ")]


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def run_line(line: str, endpoint: str, value: str) -> str:
    """One README line with its placeholder filled in; returns the ARN it printed."""
    filled = re.sub(r"<[^>]*>", endpoint, line).replace(" VALUE ", f" {value} ")
    result = CliRunner().invoke(app, shlex.split(filled)[1:], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output.strip()


def test_the_readme_secret_lines_work_with_no_aws_setup(aws: Any, monkeypatch) -> None:
    lines = secret_lines()
    assert len(lines) == 2 and any("--ssm" in line for line in lines)
    resolve_env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    prefixes = local_secret_prefixes("us-east-1")
    for line in lines:
        # GIVEN a shell with no AWS credentials, region or endpoint configured
        for name in resolve_env:
            monkeypatch.delenv(name)
        # WHEN the README line runs, twice (the second is a rotation)
        first, second = f"v1-{uuid.uuid4().hex[:6]}", f"v2-{uuid.uuid4().hex[:6]}"
        arn = run_line(line, aws.endpoint_url, first)
        assert run_line(line, aws.endpoint_url, second) == arn
        # THEN the ARN is one the local fleet's router accepts as a credential reference
        assert arn.startswith(prefixes), arn
        options = parse_upstream_options(
            {"credential": {"ref": arn, "header": "X-Api-Key"}}, secret_prefixes=prefixes
        )
        assert options.credential is not None
        # AND the worker's resolver (in the worker's environment) reads the rotated value
        for name, value in resolve_env.items():
            monkeypatch.setenv(name, value)
        resolver = SecretResolver(in_thread, ttl_seconds=0)
        assert asyncio.run(resolver.resolve(options.credential)) == second


def test_a_non_local_endpoint_or_an_empty_name_is_refused_before_any_call() -> None:
    runner = CliRunner()
    command = ["local", "secret", "k", "v", "--endpoint-url"]
    remote = runner.invoke(app, [*command, "https://x.example"])
    assert remote.exit_code == 2 and "127.0.0.1" in remote.output
    empty = runner.invoke(app, ["local", "secret", "wsfleet/", "v", "--endpoint-url", LOOPBACK])
    assert empty.exit_code == 2 and "needs a name" in empty.output
