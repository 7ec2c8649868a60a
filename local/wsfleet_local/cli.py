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
    wsfleet status [--watch] [--api URL | --table NAME]

``--api`` defaults to ``$WSFLEET_API_URL`` (``wsfleet local up`` prints the line to export).
A non-loopback API URL is a deployed, IAM-authorised API Gateway: requests are SigV4-signed
with your usual AWS credentials. ``status --table`` reads the connections table directly
(``$AWS_ENDPOINT_URL`` selects a local backend), so it works against AWS without the API.

Exit status: 0 done; 1 the API failed or said no for another reason (404, 5xx, unreachable);
2 bad input, whether found here (an option, ``--upstream`` JSON) or refused by the API (400,
413, 415, 422), always with a message naming the option or field, never a traceback.
"""

from __future__ import annotations

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

from wsfleet.exceptions import WsfleetError

from .client import (
    ApiClient,
    ApiError,
    ConnectionRow,
    UpstreamUsageError,
    build_upstream,
    read_table,
    read_upstream_json,
)

if TYPE_CHECKING:
    from .procs import StopSignals

__all__ = ["app", "main"]

_T = TypeVar("_T")

API_ENV = "WSFLEET_API_URL"

app = typer.Typer(
    name="wsfleet",
    help="wsfleet: long-lived WebSocket streams held by a fleet of lease-owning workers.",
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
    str | None, typer.Option("--region", help="Region for SigV4 (default: from the URL).")
]


def _api_client(api: str | None, region: str | None = None) -> ApiClient:
    url = api or os.environ.get(API_ENV)
    if not url:
        err_console.print(f"no API URL: pass --api or set {API_ENV} (see `wsfleet local up`)")
        raise typer.Exit(2)
    return ApiClient(url, region=region)


#: API answers that mean "your input": the same exit status as a bad option.
_INPUT_REFUSED = frozenset({400, 413, 415, 422})


def _fail(exc: Exception) -> typer.Exit:
    """Say what failed; exit 2 when the API refused the input, else 1."""
    return _usage_error(exc, 2 if getattr(exc, "status", None) in _INPUT_REFUSED else 1)


def _usage_error(exc: Exception, code: int = 2) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    return typer.Exit(code)


def _ask_api(api: str | None, region: str | None, call: Callable[[Any], Any]) -> Any:
    """``call(ApiClient)``; an API error prints and exits (see :func:`_fail`)."""
    try:
        return call(_api_client(api, region))
    except ApiError as exc:
        raise _fail(exc) from exc


# ----------------------------------------------------------------------------- local up


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
    commands = [
        f"export {API_ENV}={api}",
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
                extra_worker_env=_worker_overrides(secret_cache_seconds),
                sink=sink,
            )
        except WsfleetError as exc:
            raise _fail(exc) from exc
        failed = _supervise(fleet, status, signals)
    if failed:
        raise typer.Exit(1)


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
        raise _usage_error(ValueError("--endpoint-url is required (`wsfleet local up` prints it)"))
    if not is_loopback_url(endpoint_url):
        raise _usage_error(ValueError("--endpoint-url must be the local fleet's (127.0.0.1)"))
    secret = sys.stdin.read().rstrip("\n") if value == "-" else value
    try:
        arn = create_local_secret(endpoint_url, name, secret, ssm=ssm)
    except ValueError as exc:
        raise _usage_error(exc) from exc
    except (BotoCoreError, ClientError) as exc:  # the endpoint is down or not a local fleet
        failure = ValueError(f"could not store the secret at {endpoint_url}: {exc}")
        raise _usage_error(failure, 1) from exc
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
        err_console.print(f"[red]error:[/red] {exc}")
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
        )
        fleets: list[Any] = []
        with StopSignals() as signals:
            report = _supervised(
                signals,
                lambda stop: run_demo(options, console, cancel=stop, on_fleet=fleets.append),
                lambda: [fleet.abort() for fleet in fleets],
            )
    except DemoInterrupted:
        err_console.print("interrupted; the fleet was stopped")
        raise typer.Exit(130) from None
    except _Forced:
        err_console.print("interrupted; every process was killed")
        raise typer.Exit(130) from None
    except WsfleetError as exc:
        raise _fail(exc) from exc
    console.print(render_summary(report))
    if json_out is not None:
        json_out.write_text(json.dumps(_report_json(report), indent=2), encoding="utf-8")
    raise typer.Exit(0 if report.ok else 1)


def _report_json(report: Any) -> dict[str, Any]:
    audit = report.audit
    return {
        "ok": report.ok,
        "seed": report.seed,
        "failures": report.failures,
        "elapsed_seconds": round(report.elapsed_seconds, 1),
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


def _print_view(view: dict[str, Any], output: str, *, details: bool = False) -> None:
    """The whole document (json) or the one-line summary (text), ``details`` under it."""
    if output == "json":
        console.print_json(data=view)
    elif output == "text":
        for line in [_summary(view), *(_details(view) if details else ())]:
            console.print(line, soft_wrap=True, highlight=False, markup=False)
    else:
        err_console.print(f"--output must be text or json, not {output!r}")
        raise typer.Exit(2)


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
        raise _usage_error(exc) from None

    def call(client: Any) -> Any:
        return client.start(connection_id, ws_url, resume=not no_resume, upstream=upstream)

    _print_view(_ask_api(api, region, call), "json" if json_flag else output)


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
    if view.get("last_error"):
        lines.append(f"error     {view['last_error']}")
    return lines


@app.command()
def get(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    api: ApiOption = None,
    region: RegionOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """Show a connection: state, checkpoint, lease, upstream options, resume gaps."""
    view = _ask_api(api, region, lambda client: client.get(connection_id))
    _print_view(view, "json" if json_flag else output, details=True)


@app.command()
def stop(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    api: ApiOption = None,
    region: RegionOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """STOP a connection: its owner closes the socket and releases the lease."""
    view = _ask_api(api, region, lambda client: client.stop(connection_id))
    _print_view(view, "json" if json_flag else output)


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
        table.add_column(column, justify="right" if column in ("epoch", "last_seq") else "left")
    for row in sorted(rows, key=lambda r: r.connection_id):
        left = "-" if row.lease_left_ms is None else f"{row.lease_left_ms / 1000:.1f}s"
        style = {"STOPPED": "dim", "FAILED": "red"}.get(
            row.desired_state, "green" if row.streaming else "yellow"
        )
        table.add_row(
            row.connection_id,
            row.desired_state,
            row.owner or "-",
            str(row.epoch),
            row.lease_state,
            left,
            str(row.last_seq),
            row.note,
            style=style,
        )
    if not rows:
        table.caption = "no connections"
    return table


def _read_rows(
    api: str | None, table_name: str | None, region: str | None, states: list[str]
) -> tuple[list[ConnectionRow], str]:
    if table_name:
        import boto3

        client = boto3.session.Session(region_name=region).client("dynamodb")
        rows, _workers = read_table(client, table_name, int(time.time() * 1000))
        return [row for row in rows if row.desired_state in states], f"table {table_name}"
    client = _api_client(api, region)
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
    region: RegionOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    all_states: Annotated[bool, typer.Option("--all", help="Include STOPPED connections.")] = False,
) -> None:
    """Table of connections: owner, epoch, lease left, last_seq, state."""
    # FAILED is always shown: it needs an operator (a new START restarts it).
    states = ["STARTED", "FAILED", "STOPPED"] if all_states else ["STARTED", "FAILED"]
    try:
        if not watch:
            rows, source = _read_rows(api, table, region, states)
            console.print(_status_table(rows, source))
            return
        with Live(console=console, auto_refresh=False) as live:
            while True:
                rows, source = _read_rows(api, table, region, states)
                live.update(_status_table(rows, source), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return
    except WsfleetError as exc:  # ApiError included
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


def main() -> None:
    """Console entry point (``wsfleet``)."""
    app()
