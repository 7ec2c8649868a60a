"""The ``wsfleet`` command: run the fleet locally, drive any deployment's API, watch connections.

Commands::

    wsfleet local up [--workers N] [--port P]   the whole system on 127.0.0.1 until Ctrl-C
            [--secret-cache-seconds S]
    wsfleet local secret NAME VALUE --endpoint-url URL [--ssm]
                                                a secret in the local fleet; prints its ARN
    wsfleet demo [--workers 3] [--streams 12]   crash + deploy + STOP scenario, then an audit
    wsfleet start ID URL [--api URL]            START a connection (PUT /connections/ID)
            [-H 'Name: value'] [--subprotocol P] [--secret-ref ARN --secret-in header:NAME]
            [--subscribe MSG] [--seq-pointer /p] [--resume query|subscribe|none]
            [--upstream JSON | --upstream-file PATH]     (README "Real upstreams")
    wsfleet get ID [--api URL]                  its view: lease, checkpoint, upstream, gaps
    wsfleet stop ID [--api URL]                 STOP it (DELETE /connections/ID)
    wsfleet status [--watch] [--state S]... [--all] [--api URL | --table NAME [--endpoint URL]]
    wsfleet --version

``--api`` defaults to ``$WSFLEET_API_URL`` (``wsfleet local up`` prints the lines to export).
A non-loopback API URL is a deployed API Gateway: requests are SigV4-signed with your usual
AWS credentials (``ApiAuth=IAM``), or carry ``--api-key`` / ``$WSFLEET_API_KEY`` in
``x-api-key`` (``ApiAuth=API_KEY``). ``status --table`` reads the connections table directly
(``--endpoint`` or ``$AWS_ENDPOINT_URL`` selects a local backend), so it works against AWS
without the API.

Every error is one line on stderr starting ``error:``, never a traceback. Exit status (one
rule, :data:`EXIT_CODES`): 0 done; 2 the command cannot succeed as given, fix the input or
the configuration (a bad option, no API URL, region or credentials, an unknown connection or
table, any 4xx answer: 400, 403, 404, 413, 415, 422); 1 the command was right but something
failed (unreachable, a timeout, a 5xx answer such as the API's 503, AWS throttling; ``demo``
found lost or duplicated frames; the local fleet failed); 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from wsfleet.exceptions import ConfigurationError, WsfleetError
from wsfleet.record import DesiredState

from .client import (
    ApiClient,
    ApiError,
    ConnectionRow,
    TableError,
    UpstreamUsageError,
    build_upstream,
    read_connections_table,
    read_upstream_json,
)

if TYPE_CHECKING:
    from .procs import StopSignals

__all__ = ["EXIT_CODES", "app", "main"]

_T = TypeVar("_T")

API_ENV = "WSFLEET_API_URL"
API_KEY_ENV = "WSFLEET_API_KEY"
#: The exit statuses, one rule for every command (the module docstring says which is which).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_FAILED: "the command was right but something failed (unreachable, timeout, 5xx, "
    "throttling; demo found loss; the local fleet failed)",
    EXIT_USAGE: "fix the input or the configuration (bad option, no API URL/region/"
    "credentials, unknown connection or table, any 4xx answer)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
#: The states the API lists (GET /connections?state=...), in its order.
STATES = tuple(state.value for state in DesiredState)

app = typer.Typer(
    name="wsfleet",
    help="wsfleet: long-lived WebSocket streams held by a fleet of lease-owning workers.",
    epilog="Exit status: 0 done; 2 fix the input or the configuration (a bad option, no API "
    "URL, region or credentials, an unknown connection or table, any 4xx answer); 1 something "
    "failed (unreachable, 5xx, throttling; demo found loss); 130 interrupted. Errors are one "
    "line starting 'error:'.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
local_app = typer.Typer(
    help="Run wsfleet on this machine (no AWS account, no Docker).", no_args_is_help=True
)
app.add_typer(local_app, name="local")

# emoji off: rich would print a Secrets Manager ARN's ":secret:" as an emoji.
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api", help=f"API base URL incl. stage (default: ${API_ENV}).", show_default=False
    ),
]
RegionOption = Annotated[
    str | None,
    typer.Option("--region", help="AWS region (SigV4, --table; default: from the URL or your "
                 "AWS configuration)."),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", envvar=API_KEY_ENV, show_envvar=True, show_default=False,
                 help="API key of a deployment with ApiAuth=API_KEY (sent as x-api-key; "
                 "nothing is signed)."),
]  # fmt: skip


def _error(message: str, code: int) -> typer.Exit:
    """The one way a command fails: ``error: <message>`` on stderr, then exit ``code``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _exit_code(exc: Exception) -> int:
    """:data:`EXIT_CODES`' rule for an exception: whose side is the fix on?"""
    if isinstance(exc, (ConfigurationError, UpstreamUsageError)):
        return EXIT_USAGE
    if isinstance(exc, TableError):
        return EXIT_USAGE if exc.input_error else EXIT_FAILED
    status = getattr(exc, "status", None)
    return EXIT_USAGE if isinstance(status, int) and 400 <= status < 500 else EXIT_FAILED


def _fail(exc: Exception) -> typer.Exit:
    """Say what failed, with the exit status of :func:`_exit_code`."""
    return _error(str(exc), _exit_code(exc))


def _api_client(api: str | None, region: str | None, api_key: str | None) -> ApiClient:
    url = api or os.environ.get(API_ENV)
    if not url:
        raise _error(f"no API URL: pass --api or set {API_ENV} (see `wsfleet local up`)",
                     EXIT_USAGE)  # fmt: skip
    try:
        return ApiClient(url, region=region, api_key=api_key)
    except ApiError as exc:
        raise _error(str(exc), EXIT_USAGE) from None


def _ask_api(
    api: str | None, region: str | None, api_key: str | None, call: Callable[[Any], Any]
) -> Any:
    """``call(ApiClient)``; an API error prints and exits (see :func:`_exit_code`)."""
    client = _api_client(api, region, api_key)
    try:
        return call(client)
    except ApiError as exc:
        raise _fail(exc) from exc


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        def of(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "unknown"

        console.print(f"wsfleet {of('wsfleet-local')} (wsfleet package {of('wsfleet')}, "
                      f"worker {of('wsfleet-worker')})", highlight=False)  # fmt: skip
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """wsfleet: long-lived WebSocket streams held by a fleet of lease-owning workers."""


# ----------------------------------------------------------------------------- local up

NoTaskEventsOption = Annotated[
    bool,
    typer.Option(
        "--no-task-events",
        help="Do not publish a worker's exit as its ECS task state change event: a crashed "
        "worker's connections then wait out its lease (the path of a hung, partitioned or "
        "unreported worker) instead of failing over in about a second.",
    ),
]


def _print_usage(fleet: Any) -> None:
    """Where everything is (a panel), then copy-pasteable commands (plain, never wrapped)."""
    api = fleet.api_url
    sim = fleet.simulator_url
    control = sim.replace("ws://", "http://") + "/_sim/streams"
    workers = ", ".join(f"{slot.worker_id} (pid {slot.pid})" for slot in fleet.workers)
    where = [
        f"REST API      [bold]{api}[/bold]",
        f"upstream      {sim}/<stream_id>  (simulator control: {control})",
        f"DynamoDB/SQS  {fleet.endpoint_url}  (also Secrets Manager/SSM: secrets under wsfleet/)",
        f"tables        {fleet.resources.connections_table}, {fleet.resources.messages_table}",
        f"workers       {workers or 'none'}",
        f"logs          {fleet.run_dir}",
    ]
    console.print(Panel("\n".join(where), title="wsfleet local fleet is up", expand=False))
    env = fleet.resources.env()
    # What `wsfleet status --table`, the aws CLI and boto3 need to reach the local backend.
    names = ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    exports = " ".join(f"{name}={env[name]}" for name in names)
    commands = [
        f"export {API_ENV}={api}",
        f"export {exports}",
        f"wsfleet status --table {fleet.resources.connections_table}",
        f"curl -X PUT {api}/connections/s1 -H 'content-type: application/json' "
        f'-d \'{{"ws_url": "{sim}/s1"}}\'',
        f"curl {api}/connections/s1",
        "wsfleet get s1",
        f"curl '{api}/connections?state=STARTED'",
        f"curl -X DELETE {api}/connections/s1",
        f"wsfleet tail s1 --fleet {fleet.run_dir}",
        "wsfleet status --watch",
        f"wsfleet local secret feed-key VALUE --endpoint-url {fleet.endpoint_url}"
        "   # prints the ARN for credential.ref",
    ]
    for command in commands:
        console.print(command, soft_wrap=True, highlight=False, markup=False)
    console.print("Ctrl-C drains the workers and stops everything (press twice: at once).")


@local_app.command("up")
def local_up(
    workers: Annotated[int, typer.Option("--workers", "-w", min=0, help="Worker processes.")] = 3,
    port: Annotated[int, typer.Option("--port", "-p", help="API port (0: any free port).")] = 0,
    rate: Annotated[float, typer.Option(help="Simulator frames per second per stream.")] = 10.0,
    lease: Annotated[float, typer.Option(help="LEASE_SECONDS.")] = 4.0,
    heartbeat: Annotated[float, typer.Option(help="HEARTBEAT_EVERY (seconds).")] = 1.0,
    secret_cache_seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="WORKER_SECRET_CACHE_SECONDS: how long workers reuse a resolved credential "
            "(0: read it at every connect; default: the worker's 60).",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Where logs go (default: a new temp directory).")
    ] = None,
    no_task_events: NoTaskEventsOption = False,
    allow_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host", metavar="SUFFIX",
            help="Also accept upstreams on this host suffix (repeatable; ALLOWED_UPSTREAM_HOSTS "
            "besides loopback), e.g. example.com for README's Real upstreams examples. The "
            "workers then connect to those hosts for real.",
        ),
    ] = None,
    sink: Annotated[
        str, typer.Option(help="Where workers store frames: dynamodb, kinesis or firehose.")
    ] = "dynamodb",
) -> None:
    """Start the backend, simulator, API, reconciler, streams poller and N workers; stay up."""
    from .fleet import FleetTimings, LocalFleet
    from .procs import StopSignals

    status = console.status("starting", spinner="dots")

    def progress(message: str) -> None:
        status.update(message)
        console.print(f"  {message}", style="dim", highlight=False)

    with StopSignals() as signals:
        try:
            timings = FleetTimings(lease_seconds=lease, heartbeat_seconds=heartbeat)
            fleet = LocalFleet(
                workers=workers,
                timings=timings,
                rate=rate,
                api_port=port,
                run_dir=run_dir,
                progress=progress,
                task_events=not no_task_events,
                allowed_hosts=_host_suffixes(allow_hosts or []),
                extra_worker_env=_worker_overrides(secret_cache_seconds),
                sink=sink,
            )
        except WsfleetError as exc:
            raise _fail(exc) from exc
        failed = _supervise(fleet, status, signals)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _host_suffixes(hosts: list[str]) -> list[str]:
    """``--allow-host`` values, checked: a host name or suffix, no scheme, port or list."""
    import re

    for host in hosts:
        if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", host) or host.strip(".") == "":
            raise _error(f"--allow-host: expected a host name or suffix such as example.com, "
                         f"got {host[:60]!r}", EXIT_USAGE)  # fmt: skip
    return hosts


def _worker_overrides(secret_cache_seconds: float | None) -> dict[str, str]:
    """Worker settings ``local up`` takes as options (the fleet strips them from the shell's
    environment, so each process gets exactly what the template or an option says).

    >>> _worker_overrides(0), _worker_overrides(None)
    ({'WORKER_SECRET_CACHE_SECONDS': '0'}, {})
    """
    if secret_cache_seconds is None:
        return {}
    return {"WORKER_SECRET_CACHE_SECONDS": f"{secret_cache_seconds:g}"}


@local_app.command("secret")
def local_secret(
    name: Annotated[str, typer.Argument(help="Name under wsfleet/ (e.g. feed-key).")],
    value: Annotated[
        str, typer.Argument(help="The secret's value ('-': read it from standard input).")
    ],
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url",
            envvar="AWS_ENDPOINT_URL",
            help="The local fleet's endpoint (the DynamoDB/SQS line `wsfleet local up` prints).",
        ),
    ] = None,
    ssm: Annotated[
        bool, typer.Option("--ssm", help="An SSM SecureString parameter, not a secret.")
    ] = False,
) -> None:
    """Store a secret in a running local fleet and print the ARN to name in credential.ref."""
    from botocore.exceptions import BotoCoreError, ClientError

    from .client import is_loopback_url
    from .fleet import create_local_secret

    if not endpoint_url:
        raise _error("--endpoint-url is required (`wsfleet local up` prints it)", EXIT_USAGE)
    if not is_loopback_url(endpoint_url):
        raise _error("--endpoint-url must be the local fleet's (127.0.0.1)", EXIT_USAGE)
    secret = sys.stdin.read().rstrip("\n") if value == "-" else value
    try:
        arn = create_local_secret(endpoint_url, name, secret, ssm=ssm)
    except ValueError as exc:
        raise _error(str(exc), EXIT_USAGE) from exc
    except (BotoCoreError, ClientError) as exc:  # the endpoint is down or not a local fleet
        raise _error(f"could not store the secret at {endpoint_url}: {exc}", EXIT_FAILED) from exc
    typer.echo(arn)  # plain: rich would render ":secret:" as an emoji


#: After a second Ctrl-C, how long the supervisor waits for its work thread once every child
#: was killed (the README's bound: everything gone within 25 s, the kills' own 5 s included).
_ABORT_JOIN_SECONDS = 10.0


class _Forced(Exception):
    """A second signal: every process was killed, the work thread left behind."""


def _supervised(
    signals: StopSignals, work: Callable[[threading.Event], _T], abort: Callable[[], object]
) -> _T:
    """``work(stop)`` on a thread of its own; its result, or its exception re-raised here.

    The main thread (where Python runs signal handlers) only waits for signals, so no handler
    ever interrupts the work's own waits and locks. The first signal sets ``stop`` (the work
    then stops its fleet gracefully: workers drain first); a second one calls ``abort`` from
    here, which kills every process without waiting for the drain, and raises
    :class:`_Forced`; a third gets the default action.
    """
    stop = threading.Event()  # set by this thread's ordinary code, never by a handler
    results: list[_T] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work(stop))
        except BaseException as exc:  # re-raised by the main thread
            failures.append(exc)
        finally:
            signals.wake()

    thread = threading.Thread(target=run, name="supervised-work", daemon=True)
    thread.start()
    while thread.is_alive() and not signals.force_exit:
        if signals.should_exit:
            stop.set()
        signals.pause(1.0)
    if thread.is_alive():
        console.print("[yellow]forced: killing every process now[/yellow]")
        abort()
        thread.join(_ABORT_JOIN_SECONDS)
        raise _Forced
    if failures:
        raise failures[0]
    return results[0]


def _supervise(fleet: Any, status: Any, signals: StopSignals) -> bool:
    """Run the fleet until the first signal (see :func:`_supervised`); True if it failed."""
    try:
        _supervised(signals, lambda stop: _run_fleet(fleet, status, stop), fleet.abort)
    except _Forced:
        console.print("stopped; nothing left running", highlight=False)
    except WsfleetError as exc:
        _error(str(exc), EXIT_FAILED)
        return True
    return False


def _run_fleet(fleet: Any, status: Any, stop: threading.Event) -> None:
    """Start the fleet, restart dead workers until ``stop``, then stop it (always)."""
    try:
        with status:
            fleet.start()
        if stop.is_set():
            return
        _print_usage(fleet)
        sys.stdout.flush()
        while not stop.wait(0.5):
            dead = [slot for slot in fleet.workers if not slot.alive()]
            if dead:
                names = ", ".join(slot.worker_id for slot in dead)
                console.print(f"[yellow]worker(s) exited: {names}; restarting[/yellow]")
                for slot in dead:
                    fleet.restart_worker(slot.index)
    finally:
        console.print("stopping (Ctrl-C again to force)", highlight=False)
        with console.status("stopping", spinner="dots"):
            fleet.stop()
        console.print("stopped; nothing left running", highlight=False)


# ----------------------------------------------------------------------------- demo



@app.command()
def demo(
    workers: Annotated[int, typer.Option("--workers", "-w", min=2, help="Worker processes.")] = 3,
    streams: Annotated[int, typer.Option("--streams", "-m", min=2, help="Simulated streams.")] = 12,
    stops: Annotated[int, typer.Option(min=0, help="Streams STOPped through the API.")] = 3,
    seed: Annotated[int | None, typer.Option(help="Seed for the choice of victims.")] = None,
    rate: Annotated[float, typer.Option(help="Frames per second per stream.")] = 10.0,
    lease: Annotated[float, typer.Option(help="LEASE_SECONDS.")] = 4.0,
    heartbeat: Annotated[float, typer.Option(help="HEARTBEAT_EVERY (seconds).")] = 1.0,
    steady: Annotated[float, typer.Option(help="Seconds of quiet streaming first.")] = 3.0,
    run_dir: Annotated[Path | None, typer.Option(help="Where logs go.")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the summary as JSON here.")
    ] = None,
    no_task_events: NoTaskEventsOption = False,
) -> None:
    """Crash a worker, deploy another, STOP some streams; audit for lost and duplicated frames."""
    from .demo import DemoInterrupted, DemoOptions, render_summary, run_demo
    from .fleet import FleetTimings
    from .procs import StopSignals

    try:
        options = DemoOptions(
            workers=workers,
            streams=streams,
            stops=min(stops, streams - 1),
            rate=rate,
            seed=seed,
            steady_seconds=steady,
            run_dir=run_dir,
            timings=FleetTimings(lease_seconds=lease, heartbeat_seconds=heartbeat),
            task_events=not no_task_events,
        )
        fleets: list[Any] = []
        with StopSignals() as signals:
            report = _supervised(
                signals,
                lambda stop: run_demo(options, console, cancel=stop, on_fleet=fleets.append),
                lambda: [fleet.abort() for fleet in fleets],
            )
    except DemoInterrupted:
        raise _error("interrupted; the fleet was stopped", EXIT_INTERRUPTED) from None
    except _Forced:
        raise _error("interrupted; every process was killed", EXIT_INTERRUPTED) from None
    except WsfleetError as exc:
        raise _fail(exc) from exc
    console.print(render_summary(report))
    if json_out is not None:
        json_out.write_text(json.dumps(_report_json(report), indent=2), encoding="utf-8")
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FAILED)


def _report_json(report: Any) -> dict[str, Any]:
    from .demo import crash_path

    audit = report.audit
    return {
        "ok": report.ok,
        "seed": report.seed,
        "failures": report.failures,
        "elapsed_seconds": round(report.elapsed_seconds, 1),
        "task_exit_events": report.options.task_events,
        "crash_path": crash_path(report.options),
        "crash_failover_seconds": report.crash.seconds,
        "handoff_seconds": report.handoff.seconds,
        "stop_seconds": report.stop.seconds,
        "rebalance_gap_seconds": report.rebalance.seconds,
        "rebalance": report.rebalance_line,
        "produced": audit.produced,
        "stored": audit.stored,
        "lost": audit.lost,
        "duplicated": audit.duplicated,
        "overlapping_sessions": audit.overlapping_sessions,
        # issue #26: the live-only pair through the deploy (per hand-off mode)
        "live_handoffs": [dataclasses.asdict(h) for h in report.live],
        "run_dir": str(report.run_dir),
    }


# ----------------------------------------------------------------------------- API commands


# Like `aws` and `sam`: a short line for people by default, the whole document on request.
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the whole connection document (= --output json).")
]
OutputOption = Annotated[
    str, typer.Option("--output", "-o", help="text (one line) or json (the whole document).")
]


def _summary(view: dict[str, Any]) -> str:
    """One line: id, what happened, desired state, checkpoint, lease holder."""
    lease = view.get("lease") or {}
    holder = lease.get("owner") if lease.get("state") == "held" else None
    parts = [
        str(view.get("connection_id")),
        str(view.get("outcome", "")),
        f"desired={view.get('desired_state')}",
        f"last_seq={view.get('last_seq')}",
        f"lease={lease.get('state', '-')}" + (f" ({holder})" if holder else ""),
    ]
    return "  ".join(part for part in parts if part)


def _output(output: str, json_flag: bool) -> str:
    """The output format, checked before anything is sent."""
    if output not in ("text", "json"):
        raise _error(f"--output must be text or json, not {output!r}", EXIT_USAGE)
    return "json" if json_flag else output


def _print_view(view: dict[str, Any], output: str, *, details: bool = False) -> None:
    """The whole document (json) or the one-line summary (text), ``details`` under it."""
    if output == "json":
        console.print_json(data=view)
        return
    for line in [_summary(view), *(_details(view) if details else ())]:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


_UPSTREAM = "Upstream (README: Real upstreams)"


def _upstream(flags: str, metavar: str, help_text: str) -> Any:
    """An option of ``start``'s "Upstream" help panel (``flags``: "--name" or "--name -X")."""
    return typer.Option(*flags.split(), metavar=metavar, rich_help_panel=_UPSTREAM, help=help_text)


@app.command()
def start(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    ws_url: Annotated[str, typer.Argument(metavar="URL", help="Upstream ws:// or wss:// URL.")],
    api: ApiOption = None,
    region: RegionOption = None,
    api_key: ApiKeyOption = None,
    no_resume: Annotated[
        bool,
        typer.Option("--no-resume", help="Start from live data, ignoring any checkpoint."),
    ] = False,
    upstream_json: Annotated[str | None, _upstream(
        "--upstream", "JSON", "The whole upstream object as JSON; the options below add to it."
    )] = None,
    upstream_file: Annotated[Path | None, _upstream(
        "--upstream-file", "PATH", "The upstream object from a JSON file."
    )] = None,
    headers: Annotated[list[str] | None, _upstream(
        "--header -H", "'NAME: VALUE'",
        "Extra handshake header (repeatable). Stored in plain text: secrets go through "
        "--secret-ref.",
    )] = None,
    subprotocols: Annotated[list[str] | None, _upstream(
        "--subprotocol", "NAME", "Offered WebSocket subprotocol (repeatable)."
    )] = None,
    secret_ref: Annotated[str | None, _upstream(
        "--secret-ref", "ARN",
        "Secrets Manager secret or SSM parameter ARN; the value is read by the worker at each "
        "connect, never stored.",
    )] = None,
    secret_in: Annotated[str | None, _upstream(
        "--secret-in", "header:NAME|query:NAME|subscribe",
        "Where the secret goes (subscribe: the {{secret}} of --subscribe).",
    )] = None,
    secret_format: Annotated[str | None, _upstream(
        "--secret-format", "TEXT", "Header value around the secret, e.g. 'Bearer {{secret}}'."
    )] = None,
    secret_json_key: Annotated[str | None, _upstream(
        "--secret-json-key", "KEY", "The secret is a JSON object: use this key's value."
    )] = None,
    subscribe: Annotated[str | None, _upstream(
        "--subscribe", "MESSAGE",
        "Message sent after the handshake: a JSON object/array (sent as JSON) or text; "
        "{{from_seq}} and {{secret}} are filled in.",
    )] = None,
    seq_pointer: Annotated[str | None, _upstream(
        "--seq-pointer", "POINTER", "JSON pointer of a frame's seq, e.g. /data/seq (default /seq)."
    )] = None,
    resume_mode: Annotated[str | None, _upstream(
        "--resume", "query|subscribe|none",
        "How the upstream resumes: query parameter (default), the {{from_seq}} of --subscribe, "
        "or none (live only; gaps are reported).",
    )] = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """START a connection: a worker acquires its lease and streams it."""
    output = _output(output, json_flag)
    try:
        upstream = build_upstream(
            read_upstream_json(upstream_json, upstream_file),
            headers=headers or (),
            subprotocols=subprotocols or (),
            secret_ref=secret_ref,
            secret_in=secret_in,
            secret_format=secret_format,
            secret_json_key=secret_json_key,
            subscribe=subscribe,
            seq_pointer=seq_pointer,
            resume=resume_mode,
        )
    except UpstreamUsageError as exc:
        raise _fail(exc) from None

    def call(client: Any) -> Any:
        return client.start(connection_id, ws_url, resume=not no_resume, upstream=upstream)

    _print_view(_ask_api(api, region, api_key, call), output)


def _details(view: dict[str, Any]) -> list[str]:
    """``wsfleet get``'s lines under the summary: the upstream options and the gap report."""
    lines = [f"ws_url    {view.get('ws_url')}"]
    upstream = view.get("upstream") or {}
    lines.append(
        "upstream  " + (json.dumps(upstream, separators=(",", ":")) if upstream else "default")
    )
    gaps = view.get("gaps") or {}
    resumes, frames = gaps.get("resumes", 0), gaps.get("frames", 0)
    if resumes:
        lines.append(
            f"gaps      {frames} frame(s) never received across {resumes} resume(s) "
            "(the upstream could not replay them)"
        )
    else:
        lines.append("gaps      none")
    replayed = view.get("replayed") or {}
    if replayed.get("takeovers"):
        lines.append(
            f"replayed  {replayed.get('frames', 0)} frame(s) re-sent inside the windows of "
            f"{replayed['takeovers']} takeover(s); last window seq "
            f"{replayed.get('from_seq')}..{replayed.get('to_seq')} (at-least-once sink)"
        )
    else:
        lines.append("replayed  none")
    if view.get("last_error"):
        lines.append(f"error     {view['last_error']}")
    return lines


@app.command()
def get(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    api: ApiOption = None,
    region: RegionOption = None,
    api_key: ApiKeyOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """Show a connection: state, checkpoint, lease, upstream options, resume gaps, replays."""
    output = _output(output, json_flag)
    view = _ask_api(api, region, api_key, lambda client: client.get(connection_id))
    _print_view(view, output, details=True)


@app.command()
def stop(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    api: ApiOption = None,
    region: RegionOption = None,
    api_key: ApiKeyOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """STOP a connection: its owner closes the socket and releases the lease."""
    output = _output(output, json_flag)
    view = _ask_api(api, region, api_key, lambda client: client.stop(connection_id))
    _print_view(view, output)


def _status_table(rows: list[ConnectionRow], source: str) -> Table:
    table = Table(title=f"connections ({source})", title_justify="left")
    for column in (
        "connection",
        "desired",
        "owner",
        "epoch",
        "lease",
        "lease left",
        "last_seq",
        "note",
    ):
        # An id is never cut: too narrow a terminal folds it onto more lines, whole.
        table.add_column(
            column,
            justify="right" if column in ("epoch", "last_seq") else "left",
            overflow="fold",
            no_wrap=column in ("connection", "owner"),
        )
    for row in sorted(rows, key=lambda r: r.connection_id):
        left = "-" if row.lease_left_ms is None else f"{row.lease_left_ms / 1000:.1f}s"
        style = {"STOPPED": "dim", "FAILED": "red"}.get(
            row.desired_state, "green" if row.streaming else "yellow"
        )
        table.add_row(
            escape(row.connection_id),
            row.desired_state,
            escape(row.owner or "-"),
            str(row.epoch),
            row.lease_state,
            left,
            str(row.last_seq),
            escape(row.note),
            style=style,
        )
    if not rows:
        table.caption = "no connections"
    return table


def _print_status(table: Table) -> None:
    """The table at its natural width when the output is not a terminal (a pipe, a file, CI):
    rich would squeeze it into 80 columns and cut the ids a ``grep`` looks for."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update_width(10_000), table).maximum
    Console(file=console.file, width=max(width, console.width)).print(table)


def _states(given: list[str] | None, all_states: bool) -> list[str]:
    """``--state`` values (the API's states, any case) or the default set."""
    if all_states:
        return list(STATES)
    if not given:
        # FAILED is always shown: it needs an operator (a new START restarts it).
        return [DesiredState.STARTED.value, DesiredState.FAILED.value]
    states = []
    for value in given:
        state = value.upper()
        if state not in STATES:
            raise _error(f"--state must be one of {', '.join(STATES)}, not {value!r}",
                         EXIT_USAGE)  # fmt: skip
        states.append(state)
    return list(dict.fromkeys(states))


def _read_rows(
    api: str | None,
    table_name: str | None,
    region: str | None,
    api_key: str | None,
    endpoint: str | None,
    states: list[str],
) -> tuple[list[ConnectionRow], str]:
    if table_name:
        rows = read_connections_table(
            table_name, region=region, endpoint_url=endpoint, now_ms=int(time.time() * 1000)
        )
        return [row for row in rows if row.desired_state in states], f"table {table_name}"
    client = _api_client(api, region, api_key)
    rows = [
        ConnectionRow.from_api(view) for state in states for view in client.list_connections(state)
    ]
    return rows, client.base_url


@app.command()
def status(
    api: ApiOption = None,
    table: Annotated[
        str | None, typer.Option("--table", help="Read this connections table directly.")
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", metavar="URL", show_default=False,
                     help="DynamoDB endpoint for --table (default: $AWS_ENDPOINT_URL, else "
                     "AWS), e.g. the local backend `wsfleet local up` prints."),
    ] = None,
    region: RegionOption = None,
    api_key: ApiKeyOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", metavar="|".join(STATES),
                     help="Only connections in this state (repeatable; the API's states). "
                     "Default: STARTED and FAILED."),
    ] = None,
    all_states: Annotated[
        bool, typer.Option("--all", help="Every state: STARTED, STOPPED and FAILED.")
    ] = False,
) -> None:
    """Table of connections: owner, epoch, lease left, last_seq, state."""
    states = _states(state, all_states)
    if endpoint and not table:
        raise _error("--endpoint goes with --table (the API is --api)", EXIT_USAGE)
    try:
        if not watch:
            rows, source = _read_rows(api, table, region, api_key, endpoint, states)
            _print_status(_status_table(rows, source))
            return
        with Live(console=console, auto_refresh=False) as live:
            while True:
                rows, source = _read_rows(api, table, region, api_key, endpoint, states)
                live.update(_status_table(rows, source), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return
    except WsfleetError as exc:  # ApiError and TableError included
        raise _fail(exc) from exc


@app.command()
def tail(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    fleet: Annotated[
        Path | None, typer.Option(help="A local fleet's run directory (its fleet.json).")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="Last N frames; 0: all.")] = 20,
) -> None:
    """A connection's stored frames, one JSON line each, from whichever sink is configured
    (MESSAGE_SINK, MESSAGE_STREAM, MESSAGES_TABLE; with --fleet, the local fleet's)."""
    from .frame_sinks import tail_frames

    try:
        for line in tail_frames(connection_id, fleet, lines):
            typer.echo(line)
    except WsfleetError as exc:
        raise _fail(exc) from exc


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``wsfleet``). Click's own usage errors (an unknown option, a
    missing argument, a value of the wrong type) get the same ``error:`` line and exit 2 as
    every other error, instead of a framed panel."""
    try:  # typer 0.2x vendors click; its exceptions are not re-exported
        from typer._click import exceptions as click_errors
    except ImportError:  # pragma: no cover - an older typer on plain click
        from click import exceptions as click_errors  # type: ignore[no-redef]

    try:
        code = app(args=argv, prog_name="wsfleet", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        err_console.print(exc.ctx.get_help() if exc.ctx else "", highlight=False, markup=False)
        return EXIT_USAGE
    except click_errors.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        _error(exc.format_message() + where, EXIT_USAGE)
        return EXIT_USAGE
    except typer.Abort:
        _error("interrupted", EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    return code if isinstance(code, int) else EXIT_OK
