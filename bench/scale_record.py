"""Record the request stream of a local fleet for the scale model (bench/scale_model.py).

A :class:`~wsfleet_local.fleet.LocalFleet` runs with every cadence divided by ``factor``
(lease, heartbeat, safety margin, reconcile pass, CHECKPOINT_SECONDS, WORKER_SWEEP_SECONDS).
Every process that talks to DynamoDB goes through one counting proxy
(:mod:`bench.faults`), one listener per label: ``worker`` for the workers and one per
Lambda (router, reconciler, stream_notifier). The proxy journals every request to the
connections table with its answer. Once every stream is streaming (and two heartbeats more),
a window of ``window`` seconds is recorded:

* writes: the connections table's stream records in the window (moto keeps NEW_AND_OLD
  images), read straight from the backend after the run; plus the journal's conditional
  writes that failed (they cost units but leave no stream record);
* reads: the journal's GetItem / BatchGetItem / Query / Scan in the window, each with the
  partition value it read and the entries it returned.

The result (a "recording": per-key units, the run's shape, the production cadences) is what
:func:`bench.scale_model.model` scales. The recorder uses only what the local fleet of v1
and of v2 share (a LocalFleet subclass puts the Lambdas behind the proxy through two private
hooks: the fleet has no endpoint option for them), so it also records another checkout: run it
with that checkout's interpreter from this directory (the proxy child gets this worktree's
``local/`` first on its path, for the journal)::

    cd /work/wt/scale && /work/wt/v1/.venv/bin/python -m bench.scale_record record \\
        --version v1 --factor 2.5 --window 90 --out bench/scale_v1.json
    python -m bench.scale_record render     # SCALE.md from scale_v1.json + results.json

(or this interpreter with ``PYTHONPATH`` = the other checkout's ``layers/wsfleet``, ``worker``
and ``local``: the fleet's children inherit it). ``python -m bench --only scale`` records the
checkout it runs in as v2 and renders SCALE.md beside bench/scale_v1.json.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import nullcontext, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .faults import ProxyProcess
from .harness import ROOT, aws_client, machine
from .scale_model import (
    KeyLoad,
    Run,
    TableDef,
    failed_write,
    key_class,
    model,
    reads_of_request,
    render_markdown,
    table_def,
    writes_of_change,
)
from .waiting import wait_until

__all__ = ["PRODUCTION_V1", "PRODUCTION_V2", "record", "render_scale", "run_scale", "step_result"]

SCALE_MD = ROOT / "bench" / "SCALE.md"
V1_RECORDING = ROOT / "bench" / "scale_v1.json"
RESULTS_JSON = ROOT / "bench" / "results.json"
STEP = "scale"
#: Production cadences (template defaults, seconds). v1 has no checkpoint or sweep cadence:
#: its checkpoint rode on the per-connection renewal.
PRODUCTION_V2 = {"lease": 20.0, "heartbeat": 5.0, "safety_margin": 2.0, "reconcile_pass": 10.0,
                 "checkpoint": 600.0, "worker_sweep": 30.0, "rebalance": 10.0}  # fmt: skip
PRODUCTION_V1 = {"lease": 20.0, "heartbeat": 5.0, "safety_margin": 2.0, "reconcile_pass": 10.0}
LAMBDA_LABELS = ("router", "reconciler", "stream_notifier")
WORKER_LABEL = "worker"
#: Label of the reconciler reads the recorder makes itself (``emulate_reconciler``).
EMULATED_LABEL = "reconciler_emulated"


def _git_commit(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


def _fleet_class() -> Any:
    """LocalFleet with the Lambdas' endpoint on the proxy too (the fleet has no hook for it)."""
    from bench.faults import FaultClient
    from wsfleet_local.fleet import LocalFleet

    class JournalledFleet(LocalFleet):  # type: ignore[misc]
        proxy_urls: dict[str, str] = {}  # noqa: RUF012 (set per instance before start)

        def _start_backend(self) -> None:
            super()._start_backend()
            FaultClient(self.proxy_urls[WORKER_LABEL]).set_upstream(self.endpoint_url)

        def _function_env(self, spec: Any) -> dict[str, str]:
            env = dict(super()._function_env(spec))
            if spec.name in self.proxy_urls:
                env["AWS_ENDPOINT_URL"] = self.proxy_urls[spec.name]
            # The Lambdas validate the lease settings too, and the default margin (2 s) is
            # not below lease - heartbeat once every cadence is divided by 10.
            env["LEASE_SAFETY_MARGIN_SECONDS"] = f"{self.timings.margin_seconds:g}"
            return env

        # Some Lambdas only (``lambdas``: a checkout where some are not v2 yet and may not
        # even import): the router always (the API needs it), the reconciler with its
        # schedule, the notifier with the stream poller, each only if asked for.
        only_lambdas: tuple[str, ...] | None = None

        def _start_functions(self) -> None:
            if self.only_lambdas is None:
                super()._start_functions()
                return
            from wsfleet_local.fleet import ROUTER

            self._functions = {}
            for name in dict.fromkeys((ROUTER, *self.only_lambdas)):
                self._functions[name] = self._function_process(name)
                self._functions[name].start()

        def _start_event_sources(self) -> None:
            if self.only_lambdas is None:
                super()._start_event_sources()
                return
            from wsfleet_local.fleet import RECONCILER, STREAM_NOTIFIER

            if STREAM_NOTIFIER in self.only_lambdas:
                self._start_stream_poller(self.stack.function(STREAM_NOTIFIER).streams[0])
            if RECONCILER in self.only_lambdas:
                self._start_reconcile_schedule()

    return JournalledFleet


class _StreamReader:
    """The connections table's stream, read from the backend (not through the proxy)."""

    def __init__(self, endpoint_url: str, stream_arn: str) -> None:
        self.client = aws_client("dynamodbstreams", endpoint_url)
        shards = self.client.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
        self.iterators = [
            self.client.get_shard_iterator(StreamArn=stream_arn, ShardId=s["ShardId"],
                                           ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            for s in shards
        ]  # fmt: skip

    def drain(self) -> list[dict[str, Any]]:
        """Every record written since the table's start (moto keeps them all)."""
        records: list[dict[str, Any]] = []
        for number, iterator in enumerate(self.iterators):
            while iterator:
                page = self.client.get_records(ShardIterator=iterator, Limit=1000)
                records += page["Records"]
                iterator = page.get("NextShardIterator")
                self.iterators[number] = iterator
                if not page["Records"]:
                    break
        return records


class _EmulatedReconciler:
    """The v2 reconciler's steady-state reads, made through the proxy every pass.

    Only for recording a checkout whose worker is v2 but whose reconciler Lambda is not yet
    (the branches are merged later): per pass, what the design reads when nothing is dead
    or orphaned: ``list_worker_ids`` (gsi_workers), ``get_workers`` (BatchGetItem) and
    ``unowned(shard, before)`` for every shard (gsi_unowned), with the store's own calls.
    """

    def __init__(self, url: str, table_name: str, pass_seconds: float) -> None:
        from wsfleet.record import INDEX_SHARDS
        from wsfleet.store import DynamoDBLeaseStore

        self.store = DynamoDBLeaseStore(aws_client("dynamodb", url), table_name)
        self.shards = INDEX_SHARDS
        self.pass_seconds = pass_seconds
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulated-reconciler", daemon=True)

    def _run(self) -> None:
        next_pass = time.monotonic() + self.pass_seconds
        while not self._stop.wait(max(0.0, next_pass - time.monotonic())):
            next_pass += self.pass_seconds  # one pass per interval, however long a pass takes
            now_ms = int(time.time() * 1000)
            self.store.get_workers(self.store.list_worker_ids())
            for shard in range(self.shards):
                list(self.store.unowned(shard, now_ms - int(self.pass_seconds * 1000)))
            self.passes += 1

    def __enter__(self) -> _EmulatedReconciler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _start_directly(fleet: Any, ids: list[str]) -> None:
    """START the way the router does (store.start + a hint), for a checkout whose router is
    not v2 yet; before the window, so it costs the recording nothing."""
    from wsfleet.hint_sender import HintSender
    from wsfleet.hints import Hint
    from wsfleet.record import connection_pk
    from wsfleet.store import DynamoDBLeaseStore

    resources = fleet.resources
    store = DynamoDBLeaseStore(aws_client("dynamodb", fleet.endpoint_url),
                               resources.connections_table)  # fmt: skip
    for stream_id in ids:
        store.start(stream_id, fleet.simulator.url_for(stream_id), resume=True)
    sender = HintSender(aws_client("sqs", fleet.endpoint_url), resources.env()["HINT_QUEUE_URL"])
    failed = sender.send_many([Hint(connection_pk(i)) for i in ids])
    if failed:
        raise RuntimeError(f"{len(failed)} hints not sent")


def _all_streaming(fleet: Any, ids: list[str]) -> bool:
    open_with_frames = {
        s.stream_id for s in fleet.simulator.sessions() if s.is_open and s.first_frame_at
    }
    return all(i in open_with_frames for i in ids)


def _images(records: list[dict[str, Any]], hash_key: str, into: dict[str, Any]) -> None:
    for record in records:
        data = record["dynamodb"]
        pk = data["Keys"][hash_key]
        ((_, value),) = pk.items()
        if "NewImage" in data:
            into[str(value)] = data["NewImage"]
        else:
            into.pop(str(value), None)


def record(
    *,
    version: str,
    connections: int = 100,
    workers: int = 2,
    factor: float = 10.0,
    window_seconds: float = 120.0,
    rate: float = 1.0,
    run_dir: Path | None = None,
    production: dict[str, float] | None = None,
    lambdas: tuple[str, ...] | None = None,
    emulate_reconciler: bool = False,
    commit: str | None = None,
    keep_raw: bool = False,
) -> dict[str, Any]:
    """Run a fleet with compressed cadences; the per-key loads of its steady-state window.

    ``keep_raw``: the result also has ``raw`` (the window's stream records, journal entries
    and the latest item images, not JSON-serialisable): bench/request_cost.py sorts them by
    what each request was for.

    For a checkout whose Lambdas are not all ported yet (before the v2 branches are merged):
    ``lambdas`` runs only those (and the router, whose START is then not used: STARTs are
    written with the store, :func:`_start_directly`); ``emulate_reconciler`` makes the v2
    reconciler's pass reads here (:class:`_EmulatedReconciler`).
    """
    from wsfleet_local.backend import find_template, load_template
    from wsfleet_local.client import ApiClient
    from wsfleet_local.fleet import FleetTimings

    production = dict(production or (PRODUCTION_V2 if version != "v1" else PRODUCTION_V1))
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"wsfleet-scale-{version}-"))
    template_path = find_template()
    table = table_def(load_template(template_path))
    compressed = {name: seconds / factor for name, seconds in production.items()}
    timings = FleetTimings(
        lease_seconds=compressed["lease"],
        heartbeat_seconds=compressed["heartbeat"],
        lease_safety_margin_seconds=compressed["safety_margin"],
        reconcile_pass_seconds=compressed["reconcile_pass"],
        drain_timeout_seconds=10.0,
        queue_wait_seconds=2,
        max_connections=math.ceil(connections / workers) + 5,  # about even across workers
        # Not in the production figures: the fleet's own defaults.
        checkpoint_seconds=compressed.get("checkpoint", FleetTimings.checkpoint_seconds),
        sweep_seconds=compressed.get("worker_sweep", FleetTimings.sweep_seconds),
        # The fleet's own default (2 s) is no compression of REBALANCE_SECONDS: each worker
        # reads the fleet view this often, a read per worker that the window must scale too.
        rebalance_seconds=compressed.get("rebalance", FleetTimings.rebalance_seconds),
    )
    worker_env = {"POWERTOOLS_LOG_LEVEL": "WARNING"}
    if "checkpoint" in compressed:
        worker_env["CHECKPOINT_SECONDS"] = f"{compressed['checkpoint']:g}"
    if "worker_sweep" in compressed:
        worker_env["WORKER_SWEEP_SECONDS"] = f"{compressed['worker_sweep']:g}"
    journal = run_dir / "journal.jsonl"
    ids = [f"scale-{i:04d}" for i in range(connections)]
    proxy = ProxyProcess(
        labels=(WORKER_LABEL, *LAMBDA_LABELS, EMULATED_LABEL),
        log_path=run_dir / "proxy.log",
        journal=journal,
        journal_table="ConnectionsTable",
    )
    with proxy:
        urls = dict(proxy.urls)
        fleet_class = _fleet_class()
        worker_env["AWS_ENDPOINT_URL"] = urls[WORKER_LABEL]
        fleet = fleet_class(workers=workers, timings=timings, rate=rate, run_dir=run_dir,
                            extra_worker_env=worker_env)  # fmt: skip
        fleet.proxy_urls = urls
        fleet.only_lambdas = lambdas
        with fleet:
            for stream_id in ids:
                fleet.simulator.open_stream(stream_id, rate=rate)
            if lambdas is not None:
                _start_directly(fleet, ids)
            else:
                api = ApiClient(fleet.api_url)
                for stream_id in ids:
                    api.start(stream_id, fleet.simulator.url_for(stream_id))
            wait_until(lambda: _all_streaming(fleet, ids), timeout=120 + connections,
                       interval=0.5, message="every stream streaming")  # fmt: skip
            time.sleep(2 * compressed["heartbeat"] + 1)  # acquire writes and first renewals over
            emulated = (
                _EmulatedReconciler(urls[EMULATED_LABEL], fleet.resources.connections_table,
                                    compressed["reconcile_pass"])
                if emulate_reconciler else nullcontext()
            )  # fmt: skip
            with emulated:
                started = time.time()
                time.sleep(window_seconds)
                ended = time.time()
            still_streaming = _all_streaming(fleet, ids)
            stream = _StreamReader(fleet.endpoint_url, fleet.resources.stream_arn)
            records = stream.drain()
            worker_ids = list(fleet.worker_ids)
            table_name = fleet.resources.connections_table
    # Stream records carry the time of the write (ms): the window is [started, ended] on the
    # same clock as the journal's; what came before only tells item sizes.
    images: dict[str, Any] = {}
    window_records = []
    for stream_record in records:
        at = stream_record["dynamodb"]["ApproximateCreationDateTime"].timestamp()
        if at < started:
            _images([stream_record], table.hash_key, images)
        elif at <= ended:
            window_records.append(stream_record)
    _images(window_records, table.hash_key, images)
    entries = []
    with journal.open(encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            if started <= entry["at"] <= ended:
                entries.append(entry)
    loads, operations = _loads(table, table_name, window_records, entries, images, worker_ids)
    passes = emulated.passes if isinstance(emulated, _EmulatedReconciler) else None
    notes = []
    if lambdas is not None:
        notes.append(
            f"Recorded before every v2 Lambda was merged: only {', '.join(lambdas) or 'none'} "
            "ran beside the router, and the STARTs were written with the store before the "
            "window (the STOP notifier makes no request in a steady state)."
        )
    if passes is not None:
        notes.append(
            f"The recorder made the v2 reconciler's steady-state pass reads itself ({passes} "
            "passes of list_worker_ids, get_workers and unowned for every shard, label "
            f"`{EMULATED_LABEL}`)."
        )
    raw = (
        {"raw": {"stream_records": window_records, "entries": entries, "images": images,
                 "table": table, "table_name": table_name}}
        if keep_raw else {}
    )  # fmt: skip
    return {
        **raw,
        "version": version,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit or _git_commit(template_path.parent),
        "checkout": str(template_path.parent),
        "machine": machine(),
        "connections": connections,
        "workers": workers,
        "worker_ids": worker_ids,
        "factor": factor,
        "window_seconds": round(ended - started, 2),
        "frames_per_second_per_stream": rate,
        "production": production,
        "compressed": compressed,
        "still_streaming_at_end": still_streaming,
        "emulated_reconciler_passes": passes,
        "lambdas": list(lambdas) if lambdas is not None else "all",
        "notes": " ".join(notes),
        "table": table.to_dict(),
        "stream_records": len(window_records),
        "operations": operations,
        "keys": [load.to_dict() for load in loads],
    }


def _loads(
    table: TableDef,
    table_name: str,
    records: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    images: dict[str, Any],
    worker_ids: list[str],
) -> tuple[list[KeyLoad], dict[str, int]]:
    loads: dict[tuple[str, str], KeyLoad] = {}

    def load_of(target: str, key: str) -> KeyLoad:
        found = loads.get((target, key))
        if found is None:
            found = loads[(target, key)] = KeyLoad(target, key, key_class(target, key, worker_ids))
        return found

    operations: Counter[str] = Counter()
    for stream_record in records:
        operations[f"stream:{stream_record['eventName']}"] += 1
        data = stream_record["dynamodb"]
        for write in writes_of_change(data.get("OldImage"), data.get("NewImage"), table):
            load_of(write.target, write.key).add_write(write)
    for entry in entries:
        operations[f"{entry['label']}:{entry['operation']}:{entry['status']}"] += 1
        failed = failed_write(entry, table, images)
        if failed is not None:
            load_of(failed.target, failed.key).add_write(failed)
        for read in reads_of_request(entry, table, table_name, images):
            load_of(read.target, read.key).add_read(read)
    return sorted(loads.values(), key=lambda k: (k.target, k.key)), dict(sorted(operations.items()))


def _model_of(recording: dict[str, Any]) -> dict[str, Any]:
    run = Run(recording["connections"], recording["workers"], recording["window_seconds"],
              recording["factor"])  # fmt: skip
    result = model([KeyLoad.from_dict(k) for k in recording["keys"]], run)
    seconds = run.seconds
    base_conn = [k for k in recording["keys"] if k["target"] == "table"
                 and k["key_class"] == "connection"]  # fmt: skip
    index_units = sum(k["write_units_connection"] for k in recording["keys"]
                      if k["target"] != "table")  # fmt: skip
    connection_hours = recording["connections"] * seconds / 3600
    result["per_connection_hour"] = {
        "connection_item_writes": round(sum(k["write_requests"] for k in base_conn)
                                        / connection_hours, 2),
        "connection_item_wcu": round(sum(k["write_units_connection"] for k in base_conn)
                                     / connection_hours, 2),
        "index_wcu_from_connection_items": round(index_units / connection_hours, 2),
    }  # fmt: skip
    return result


def render_scale(v2: dict[str, Any] | None, v1: dict[str, Any] | None = None) -> str:
    """SCALE.md from the v1 baseline (bench/scale_v1.json) and a v2 recording, if any."""
    if v1 is None and V1_RECORDING.exists():
        v1 = json.loads(V1_RECORDING.read_text())
    versions = [
        ("v1 (per-connection renewal; baseline recorded on main before v2, "
         "bench/scale_v1.json)", v1, _model_of(v1) if v1 else None),
        ("v2 (one lease per worker)", v2, _model_of(v2) if v2 else None),
    ]  # fmt: skip
    return render_markdown(versions)


def run_scale(
    *,
    run_dir: Path,
    connections: int = 100,
    workers: int = 2,
    factor: float = 10.0,
    window_seconds: float = 120.0,
) -> dict[str, Any]:
    """The bench step: record this checkout (v2), model it beside v1, write SCALE.md."""
    v2 = record(version="v2", connections=connections, workers=workers, factor=factor,
                window_seconds=window_seconds, run_dir=run_dir)  # fmt: skip
    return step_result(v2)


def step_result(v2: dict[str, Any]) -> dict[str, Any]:
    """Write SCALE.md for a v2 recording beside the v1 baseline; the bench step's result
    (the raw per-key figures are the recording's ``keys``)."""
    v1 = json.loads(V1_RECORDING.read_text()) if V1_RECORDING.exists() else None
    SCALE_MD.write_text(render_scale(v2, v1))
    v2_model = _model_of(v2)
    return {
        "benchmark": "scale",
        "v2": {"recording": v2, "model": _without_cold_connection_keys(v2_model)},
        "v1": {"model": _without_cold_connection_keys(_model_of(v1))} if v1 else None,
        "target": v2_model["target"],
        "target_met": v2_model["target_met"],
        "scale_md": str(SCALE_MD.relative_to(ROOT)),
    }


def _without_cold_connection_keys(result: dict[str, Any]) -> dict[str, Any]:
    """The model's keys for results.json: all but the per-connection ones, of which only the
    hottest per table or index (the recording beside it keeps every key's raw figures)."""
    kept, seen = [], set()
    for key in result["keys"]:  # hottest first
        if key["class"] == "connection":
            if key["target"] in seen:
                continue
            seen.add(key["target"])
        kept.append(key)
    return {**result, "keys": kept, "keys_modelled": len(result["keys"])}


def _store_result(result: dict[str, Any]) -> None:
    """Put a result recorded outside ``python -m bench`` into results.json as its step."""
    try:
        document = json.loads(RESULTS_JSON.read_text())
    except (OSError, ValueError):
        document = {}
    result = {**result, "group": STEP, "recorded_outside_bench": True}
    document.setdefault("results", {})[STEP] = result
    RESULTS_JSON.write_text(json.dumps(document, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_record",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record this interpreter's checkout")
    rec.add_argument("--version", required=True, help="label, e.g. v1 or v2")
    rec.add_argument("--connections", type=int, default=100)
    rec.add_argument("--workers", type=int, default=2)
    rec.add_argument("--factor", type=float, default=10.0)
    rec.add_argument("--window", type=float, default=120.0, help="seconds (wall clock)")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--commit", help="commit of the checkout, if it is no git work tree")
    rec.add_argument(
        "--lambdas",
        help="comma list of the Lambdas to run besides the router (reconciler, "
        "stream_notifier); STARTs then go through the store",
    )
    rec.add_argument(
        "--emulate-reconciler",
        action="store_true",
        help="make the v2 reconciler's pass reads (its Lambda is not v2 yet)",
    )
    ren = sub.add_parser("render", help="SCALE.md from scale_v1.json and a v2 recording")
    ren.add_argument("--v2", type=Path, help="a v2 recording (default: results.json's)")
    ren.add_argument(
        "--store",
        action="store_true",
        help="also put the --v2 recording into results.json as the scale step",
    )
    args = parser.parse_args(argv)
    v2: dict[str, Any] | None = None
    if args.command == "record":
        recording = record(version=args.version, connections=args.connections,
                           workers=args.workers, factor=args.factor,
                           window_seconds=args.window,
                           emulate_reconciler=args.emulate_reconciler,
                           lambdas=(tuple(filter(None, args.lambdas.split(",")))
                                    if args.lambdas is not None else None),
                           commit=args.commit)  # fmt: skip
        args.out.write_text(json.dumps(recording, indent=2) + "\n")
        summary = _model_of(recording)
        print(json.dumps({k: summary[k] for k in ("hottest", "ceiling_50", "ceiling_100",
                                                  "per_connection_hour")}, indent=2))  # fmt: skip
        return 0
    if args.v2:
        v2 = json.loads(args.v2.read_text())
        if args.store:
            _store_result(step_result(v2))
    else:
        with suppress(OSError, ValueError, KeyError, TypeError):
            v2 = json.loads(RESULTS_JSON.read_text())["results"][STEP]["v2"]["recording"]
    SCALE_MD.write_text(render_scale(v2))
    print(f"wrote {SCALE_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
