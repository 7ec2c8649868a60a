"""The ``wsfleet`` command: run the fleet locally, drive any deployment's API, watch connections.

Commands::

    wsfleet local up [--workers N] [--port P]   the whole system on 127.0.0.1 until Ctrl-C
    wsfleet demo [--workers 3] [--streams 12]   crash + deploy + STOP scenario, then an audit
    wsfleet start ID URL [--api URL]            START a connection (PUT /connections/ID)
    wsfleet stop ID [--api URL]                 STOP it (DELETE /connections/ID)
    wsfleet status [--watch] [--api URL | --table NAME]

``--api`` defaults to ``$WSFLEET_API_URL`` (``wsfleet local up`` prints the line to export).
A non-loopback API URL is a deployed, IAM-authorised API Gateway: requests are SigV4-signed
with your usual AWS credentials. ``status --table`` reads the connections table directly
(``$AWS_ENDPOINT_URL`` selects a local backend), so it works against AWS without the API.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from wsfleet.exceptions import WsfleetError

__all__ = ["app", "main"]

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

console = Console()
err_console = Console(stderr=True)

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api", help=f"API base URL incl. stage (default: ${API_ENV}).", show_default=False
    ),
]
RegionOption = Annotated[
    str | None, typer.Option("--region", help="Region for SigV4 (default: from the URL).")
]


def _api_client(api: str | None, region: str | None = None) -> Any:
    from .client import ApiClient

    url = api or os.environ.get(API_ENV)
    if not url:
        err_console.print(f"no API URL: pass --api or set {API_ENV} (see `wsfleet local up`)")
        raise typer.Exit(2)
    return ApiClient(url, region=region)


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


# ----------------------------------------------------------------------------- local up


class _Signals:
    """First SIGINT/SIGTERM asks for a graceful stop; a second one forces it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.force = threading.Event()

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            self.force.set()
            raise KeyboardInterrupt
        self.stop.set()


def _print_usage(fleet: Any) -> None:
    """Where everything is (a panel), then copy-pasteable commands (plain, never wrapped)."""
    api = fleet.api_url
    sim = fleet.simulator_url
    control = sim.replace("ws://", "http://") + "/_sim/streams"
    workers = ", ".join(f"{slot.worker_id} (pid {slot.pid})" for slot in fleet.workers)
    where = [
        f"REST API      [bold]{api}[/bold]",
        f"upstream      {sim}/<stream_id>  (simulator control: {control})",
        f"DynamoDB/SQS  {fleet.endpoint_url}",
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
        f"curl '{api}/connections?state=STARTED'",
        f"curl -X DELETE {api}/connections/s1",
        "wsfleet status --watch",
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
    run_dir: Annotated[
        Path | None, typer.Option(help="Where logs go (default: a new temp directory).")
    ] = None,
) -> None:
    """Start the backend, simulator, API, reconciler, streams poller and N workers; stay up."""
    from .fleet import FleetTimings, LocalFleet

    signals = _Signals()
    signals.install()
    status = console.status("starting", spinner="dots")

    def progress(message: str) -> None:
        status.update(message)
        console.print(f"  {message}", style="dim", highlight=False)

    try:
        timings = FleetTimings(lease_seconds=lease, heartbeat_seconds=heartbeat)
        fleet = LocalFleet(
            workers=workers,
            timings=timings,
            rate=rate,
            api_port=port,
            run_dir=run_dir,
            progress=progress,
        )
    except WsfleetError as exc:
        raise _fail(exc) from exc
    failed = False
    try:
        with status:
            fleet.start()
        _print_usage(fleet)
        sys.stdout.flush()
        while not signals.stop.wait(0.5):
            dead = [slot.worker_id for slot in fleet.workers if not slot.alive()]
            if dead:
                console.print(f"[yellow]worker(s) exited: {', '.join(dead)}; restarting[/yellow]")
                for slot in list(fleet.workers):
                    if not slot.alive():
                        fleet.restart_worker(slot.index)
    except KeyboardInterrupt:
        pass
    except WsfleetError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        failed = True
    finally:
        _shutdown(fleet)
    if failed:
        raise typer.Exit(1)


def _shutdown(fleet: Any) -> None:
    console.print("stopping (Ctrl-C again to force)", highlight=False)
    try:
        with console.status("stopping", spinner="dots"):
            fleet.stop()
    except KeyboardInterrupt:
        console.print("[yellow]forced: killing every process now[/yellow]")
        fleet.abort()
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
    from .demo import DemoOptions, render_summary, run_demo
    from .fleet import FleetTimings

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
        report = run_demo(options, console)
    except KeyboardInterrupt:
        err_console.print("interrupted; the fleet was stopped")
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


def _print_view(view: dict[str, Any], output: str) -> None:
    if output == "json":
        console.print_json(data=view)
    elif output == "text":
        console.print(_summary(view), soft_wrap=True, highlight=False, markup=False)
    else:
        err_console.print(f"--output must be text or json, not {output!r}")
        raise typer.Exit(2)


@app.command()
def start(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    ws_url: Annotated[str, typer.Argument(metavar="URL", help="Upstream ws:// or wss:// URL.")],
    api: ApiOption = None,
    region: RegionOption = None,
    no_resume: Annotated[
        bool, typer.Option("--no-resume", help="Never resume from a seq.")
    ] = False,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """START a connection: a worker acquires its lease and streams it."""
    from .client import ApiError

    try:
        view = _api_client(api, region).start(connection_id, ws_url, resume=not no_resume)
    except ApiError as exc:
        raise _fail(exc) from exc
    _print_view(view, "json" if json_flag else output)


@app.command()
def stop(
    connection_id: Annotated[str, typer.Argument(metavar="ID")],
    api: ApiOption = None,
    region: RegionOption = None,
    json_flag: JsonOption = False,
    output: OutputOption = "text",
) -> None:
    """STOP a connection: its owner closes the socket and releases the lease."""
    from .client import ApiError

    try:
        view = _api_client(api, region).stop(connection_id)
    except ApiError as exc:
        raise _fail(exc) from exc
    _print_view(view, "json" if json_flag else output)


def _status_table(rows: list[Any], source: str) -> Table:
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
        note = row.note
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
            note,
            style=style,
        )
    if not rows:
        table.caption = "no connections"
    return table


def _read_rows(api: str | None, table_name: str | None, region: str | None, states: list[str]):
    from .client import ConnectionRow, read_table

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
    from .client import ApiError

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
    except (ApiError, WsfleetError) as exc:
        raise _fail(exc) from exc


def main() -> None:
    """Console entry point (``wsfleet``)."""
    app()


if __name__ == "__main__":
    main()
