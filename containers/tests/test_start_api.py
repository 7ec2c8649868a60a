"""The README's curl and `wsfleet` CLI examples against `sam local start-api`: the router in
the Lambda runtime's container behind SAM's API Gateway emulation must give the same answers
as the local API (`wsfleet local up`'s LocalApi in front of the router in a local process),
both configured by env.json, each on a fresh `make local-backend`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import (
    ENV_JSON,
    INVOKE_FLAGS,
    ROOT,
    SAM,
    LocalBackend,
    sam_env,
    tail,
)

from wsfleet_local.api import LocalApi
from wsfleet_local.backend import Resources, find_template, load_template
from wsfleet_local.lambda_process import FunctionProcess
from wsfleet_local.stack import FunctionSpec, StackResolver, StackSpec, read_stack

pytestmark = [pytest.mark.usefixtures("sam_build"), pytest.mark.timeout(1800)]

README = (ROOT / "README.md").read_text()
WSFLEET = str(ROOT / ".venv" / "bin" / "wsfleet")


def readme_block(containing: str) -> list[str]:
    """The commands of the README's ```bash block that holds ``containing`` (continuations
    joined, comments and blank lines dropped)."""
    at = README.index(containing)
    block = README[README.rindex("```bash\n", 0, at) + 8 :]
    block = block[: block.index("```")]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


#: The README's curl and CLI examples of "Real upstreams" (START with each kind of upstream,
#: a refused credential, START from a file, GET), then a list, a STOP and a GET of what they
#: created, the CLI the way "Run it locally" uses it (`wsfleet status` without --watch, which
#: refreshes until Ctrl-C).
COMMANDS = [
    *readme_block("curl -X PUT $WSFLEET_API_URL/connections/speech-1"),
    "wsfleet status --all",
    "wsfleet stop ticker-1",
    "wsfleet stop md-1 --json",
    "wsfleet get md-1",
    "wsfleet status --all",
    "curl -s $WSFLEET_API_URL/connections/nope",
]
#: What each fact must be, on both APIs (the same answers would also hide a broken router).
EXPECTED = {
    "curl -X PUT $WSFLEET_API_URL/connections/md-1": '"outcome":"created"',
    "curl -X PUT $WSFLEET_API_URL/connections/ticker-1": '"outcome":"created"',
    "wsfleet start ticker-1": "already_started",
    "wsfleet start feed-1": "created",
    "wsfleet stop ticker-1": "stopped",
}
#: What differs between two runs and is not an answer: times.
VOLATILE = re.compile(r'("(?:created_at_ms|updated_at_ms)":\s*)\d+|\b\d+(?:\.\d+)? ?(?:ms|s) ago\b')


def normalise(text: str) -> str:
    """Times masked, trailing blanks dropped (the CLI pads a title to the terminal's width)."""
    text = VOLATILE.sub(lambda m: (m.group(1) or "") + "<t>", text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def run_examples(api_url: str, workdir: Path) -> list[tuple[str, int, str]]:
    """Each command through bash, as a user types it; (command, exit status, output)."""
    env = {
        **os.environ,
        "WSFLEET_API_URL": api_url,
        "PATH": f"{Path(WSFLEET).parent}:{os.environ['PATH']}",
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    answers = []
    for command in COMMANDS:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        # curl's stderr is its progress meter (times and sizes); the CLI's is its messages
        output = proc.stdout if command.startswith("curl") else proc.stdout + proc.stderr
        answers.append((command, proc.returncode, normalise(output.replace(api_url, "<api>"))))
    return answers


def router_env(backend: LocalBackend, spec: FunctionSpec, stack: StackSpec) -> dict[str, str]:
    """What SAM gives the router: its template environment (resolved against the backend's
    resources, as the local fleet resolves it), then env.json's values (as --env-vars does),
    the endpoint the host's."""
    resources = Resources(**backend.resources)
    resolver = StackResolver(
        stack_name="wsfleet", region=resources.region,
        names={**resources.tables, **resources.queues}, parameters=stack.parameters,
        overrides={"LocalEndpointUrl": backend.endpoint_url}, attributes=resources.get_att(),
        conditions=stack.conditions,
    )  # fmt: skip
    values = {**ENV_JSON["Parameters"], **ENV_JSON["RouterFunction"]}
    endpoint = ENV_JSON["Parameters"]["AWS_ENDPOINT_URL"]
    return {
        **os.environ,
        **backend.env,
        **resolver.environment(spec),
        **{k: v.replace(endpoint, backend.endpoint_url) for k, v in values.items()},
        "POWERTOOLS_TRACE_DISABLED": "true",
    }


def local_api_answers(backend: LocalBackend, workdir: Path) -> list[tuple[str, int, str]]:
    stack = read_stack(load_template(find_template()))
    spec = stack.function("router")
    router = FunctionProcess(
        spec.name, env=router_env(backend, spec, stack), log_path=workdir / "router.log",
        handler=spec.handler, timeout_seconds=spec.timeout_seconds,
    ).start()  # fmt: skip
    api = LocalApi(router.invoke, routes=spec.routes).start()
    try:
        return run_examples(api.url, workdir)
    finally:
        api.stop()
        router.stop()


def sam_containers() -> set[str]:
    """The function containers SAM CLI runs (it labels them), by id."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=sam.cli.container.type=lambda"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return set(out.split())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_http(url: str, proc: subprocess.Popen[str], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"sam local start-api exited {proc.returncode}\n{tail(log.read_text())}"
            )
        try:
            urllib.request.urlopen(url, timeout=60).close()
            return
        except urllib.error.HTTPError:
            return  # an answer (a 4xx) is an API listening
        except OSError:
            time.sleep(1)
    raise AssertionError(
        f"sam local start-api did not answer within {timeout} s\n{tail(log.read_text())}"
    )


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[str]:
    """`sam local start-api --warm-containers EAGER` as the README runs it (plus INVOKE_FLAGS),
    on a free loopback port; its URL."""
    port = free_port()
    log = tmp_path / "start-api.log"
    before = sam_containers()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [SAM, "local", "start-api", "--warm-containers", "EAGER", "--host", "127.0.0.1",
             "--port", str(port), *INVOKE_FLAGS],
            cwd=ROOT, env=sam_env(), stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/connections/ready-check", proc, log, timeout=600)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # SAM stops its warm containers on Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # SAM CLI leaves its warm containers running when stopped this way: remove its own.
        if started := sam_containers() - before:
            subprocess.run(["docker", "rm", "-f", *started], capture_output=True)


def test_readme_examples_answer_alike(
    local_backend: LocalBackend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # GIVEN the README's upstream file for `--upstream-file upstream.json`
    (tmp_path / "upstream.json").write_text(json.dumps({"resume": "none"}))
    # WHEN the examples run against the local API, then against `sam local start-api`, each on
    # a fresh backend
    local = local_api_answers(local_backend, tmp_path)
    local_backend.restart()
    sam_url = request.getfixturevalue("start_api")
    sam = run_examples(sam_url, tmp_path)

    # THEN every command gets the same answer and exit status from both
    for (command, local_rc, local_out), (_, sam_rc, sam_out) in zip(local, sam, strict=True):
        assert (sam_rc, sam_out) == (local_rc, local_out), command
    # AND the answers are the README's
    for command, rc, out in sam:
        for prefix, expected in EXPECTED.items():
            if command.startswith(prefix):
                assert expected in out, (command, rc, out)
    # the credential outside env.json's UPSTREAM_SECRET_PREFIXES is refused, naming the field
    assert '"field":"upstream.credential.ref"' in sam[0][2], sam[0]
