"""The whole wsfleet system on one machine: backend, upstream, Lambdas, event sources, workers.

:class:`LocalFleet` wires the real pieces the way the stack wires them on AWS:

=====================  ==================================================================
AWS                    here
=====================  ==================================================================
DynamoDB, SQS          the embedded moto server (``python -m wsfleet_local.backend``), its
                       tables and queues created from template.yaml
upstream feeds         the simulator (``python -m wsfleet_local.simulator``)
API Gateway -> router  :class:`~wsfleet_local.api.LocalApi` -> router environment
Scheduler -> reconc.   :class:`~wsfleet_local.scheduler.ReconcileScheduler` -> reconciler env
Streams ESM -> notif.  :class:`~wsfleet_local.streams.StreamPoller` -> notifier environment
ECS tasks              N ``python -m wsfleet_worker`` processes, each a "task" with its own
                       metadata endpoint (:class:`~wsfleet_local.tasks.MetadataServer`)
ECS task state change  :class:`~wsfleet_local.tasks.TaskExitWatcher`: a worker process's
-> rule -> task exit   exit becomes the ECS event, matched against the template's rule
                       pattern and delivered to the task exit environment
=====================  ==================================================================

Every Lambda runs in its own execution-environment process
(:class:`~wsfleet_local.lambda_process.FunctionProcess`) with the environment template.yaml gives
it, resolved against the local resources; the workers get the ECS task definition's
environment the same way. Template *parameters* are overridden with short local timings
(lease 4 s, heartbeat 1 s, a reconcile pass every second) and with what a loopback upstream
needs (``ws://`` allowed, 127.0.0.1 allowed).

``tables=`` a :class:`TablesService` puts the tables on another DynamoDB (the benchmarks use
dynalite, ``bench/dynalite.py``, to show what the serialised moto server costs the K = 100
runs), with SQS still on moto: every process gets ``AWS_ENDPOINT_URL_DYNAMODB``, the standard
per-service override.

Everything listens on 127.0.0.1; every child runs in its own session and dies with the
supervisor (see :mod:`wsfleet_local.procs`); logs go to ``run_dir`` (one file per process).
:meth:`LocalFleet.stop` shuts down in dependency order: API first (no new work), workers
drained with SIGTERM while DynamoDB and the upstream are still up (SIGKILL after the drain
bound), then event sources, function environments, simulator and backend.

Example::

    with LocalFleet(workers=3) as fleet:
        requests.put(f"{fleet.api_url}/connections/s1",
                     json={"ws_url": fleet.simulator.url_for("s1")})
        fleet.kill_worker(0)            # SIGKILL: a crash
        fleet.restart_worker(0)         # a fresh worker id in the same slot
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from wsfleet.exceptions import WsfleetError
from wsfleet.settings import ENVIRONMENT

from .api import DEFAULT_STAGE, LocalApi
from .backend import DEFAULT_REGION, Resources, find_template, load_template, local_client
from .frame_sinks import create_local_sink
from .lambda_process import FunctionProcess
from .procs import ChildProcess, Service, spawn
from .scheduler import ReconcileScheduler
from .simulator import SimulatorClient
from .stack import LOCAL_ACCOUNT_ID, FunctionSpec, StackResolver, StackSpec, read_stack
from .streams import StreamPoller
from .tasks import LocalTask, MetadataServer, TaskExitWatcher, cluster_arn

__all__ = [
    "FleetError",
    "FleetTimings",
    "LocalFleet",
    "TablesService",
    "WorkerSlot",
    "create_local_secret",
    "local_secret_prefixes",
]

logger = logging.getLogger(__name__)

STREAM_NOTIFIER = "stream_notifier"
RECONCILER = "reconciler"
ROUTER = "router"
TASK_EXIT = "task_exit"
SCHEDULER_EVENT_SAMPLE = "scheduler_reconcile.json"

#: How long a worker may take from spawn to its first health-file touch.
WORKER_READY_TIMEOUT_SECONDS = 60.0
CHILD_READY_TIMEOUT_SECONDS = 60.0


class FleetError(WsfleetError):
    """The local fleet could not start, or a worker slot does not exist."""


class TablesService(Protocol):
    """Another DynamoDB for the fleet's tables, SQS staying on the embedded backend (the
    benchmarks' dynalite, ``bench/dynalite.py``).

    The fleet starts it right after the backend and has it create the tables the backend made
    from template.yaml, points every process at :attr:`endpoint_url` with
    ``AWS_ENDPOINT_URL_DYNAMODB`` and stops it last. It is assumed to have no Streams, so the
    fleet starts no Streams poller: a STOP reaches its worker at the next renewal.
    """

    #: What the progress lines call it.
    name: str

    @property
    def endpoint_url(self) -> str: ...

    @property
    def pid(self) -> int | None:
        """Its server's process id while it runs (the fleet's leak checks count it), else None."""

    def start(self) -> object: ...

    def create_tables(self, resources: Resources) -> None:
        """Create the tables of ``resources`` (the backend's) with the same keys and indexes."""

    def stop(self) -> None:
        """Safe to call twice."""


@dataclass(frozen=True, kw_only=True)
class FleetTimings:
    """Short local timings; every value becomes the matching template parameter or variable.

    The rules of :class:`wsfleet.settings.Settings` are checked here, before anything starts
    (lease >= 2 heartbeats; the self-fence margin and the reconcile pass both shorter than
    lease - heartbeat). Margin and pass default to 1 s, or half of lease - heartbeat when
    that is shorter, so any valid lease/heartbeat pair works as is.
    """

    lease_seconds: float = 4.0
    heartbeat_seconds: float = 1.0
    lease_safety_margin_seconds: float | None = None
    reconcile_pass_seconds: float | None = None
    drain_timeout_seconds: float = 5.0
    #: Queue long-poll waits of the workers: bound how long a drain waits for a poll to end.
    queue_wait_seconds: int = 2
    #: CHECKPOINT_SECONDS: short locally, so a run shows checkpoints being written between
    #: hand-offs (production: 600 s; the ratio to the lease matters less than seeing them).
    checkpoint_seconds: float = 10.0
    #: WORKER_SWEEP_SECONDS: the STOP fallback and the repair of connections kept without a
    #: session (production: 30 s).
    sweep_seconds: float = 5.0
    max_connections: int = 100
    #: REBALANCE_SECONDS (production: 10 s): a joining worker visibly evens the spread out
    #: within a few seconds locally.
    rebalance_seconds: float = 2.0
    #: REBALANCE_MAX_MOVES; None keeps the template's default. Benches that measure a
    #: disruption set 0, so no move changes what they measure.
    rebalance_max_moves: int | None = None
    #: REBALANCE_DWELL_SECONDS; None keeps the template's (600 s), which a bench or test that
    #: counts connections moved twice relies on.
    rebalance_dwell_seconds: float | None = None

    def __post_init__(self) -> None:
        from wsfleet.settings import Settings

        Settings(
            lease_seconds=self.lease_seconds,
            heartbeat_seconds=self.heartbeat_seconds,
            lease_safety_margin_seconds=self.margin_seconds,
            reconcile_pass_seconds=self.pass_seconds,
            worker_id="check",
        ).check_reconcile_pass()  # raises ConfigurationError, naming the variable

    @property
    def _slack_seconds(self) -> float:
        return min(1.0, (self.lease_seconds - self.heartbeat_seconds) / 2)

    @property
    def margin_seconds(self) -> float:
        """LEASE_SAFETY_MARGIN_SECONDS for the workers."""
        if self.lease_safety_margin_seconds is not None:
            return self.lease_safety_margin_seconds
        return self._slack_seconds

    @property
    def pass_seconds(self) -> float:
        """RECONCILE_PASS_SECONDS, which is also the local schedule's interval."""
        if self.reconcile_pass_seconds is not None:
            return self.reconcile_pass_seconds
        return self._slack_seconds


@dataclass
class WorkerSlot:
    """One worker position in the fleet; a restart puts a new process (new id) in the slot."""

    index: int
    worker_id: str
    process: ChildProcess
    generation: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()


Progress = Callable[[str], None]


def local_secret_prefixes(region: str) -> tuple[str, str]:
    """The secrets a local fleet's STARTs may name by reference: ``wsfleet/`` in the embedded
    backend's Secrets Manager and SSM (a deployment names its own with UpstreamSecretPrefix).

    >>> local_secret_prefixes("us-east-1")[0]
    'arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/'
    """
    return (
        f"arn:aws:secretsmanager:{region}:{LOCAL_ACCOUNT_ID}:secret:wsfleet/",
        f"arn:aws:ssm:{region}:{LOCAL_ACCOUNT_ID}:parameter/wsfleet/",
    )


def create_local_secret(
    endpoint_url: str, name: str, value: str, *, ssm: bool = False, region: str = DEFAULT_REGION
) -> str:
    """Store ``value`` as a secret a local fleet's STARTs may name; return the ARN to name.

    ``name`` goes under the local prefix whether or not it is spelled out (``key``,
    ``wsfleet/key`` and ``/wsfleet/key`` are the same): a Secrets Manager secret
    ``wsfleet/<name>`` or, with ``ssm``, an SSM SecureString parameter ``/wsfleet/<name>``
    (SSM names with a path start with ``/``). The client carries the local dummy
    credentials and region, so no AWS configuration or ``aws`` CLI is needed. An existing
    secret or parameter gets the new value (a rotation).

    Example::

        arn = create_local_secret(fleet.endpoint_url, "speech", "tok-42")
        # arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/speech-AbCdEf
    """
    parts = [part for part in name.split("/") if part]
    relative = "/".join(parts[1:] if parts[:1] == ["wsfleet"] else parts)
    if not relative:
        raise ValueError("the secret needs a name under wsfleet/, e.g. 'feed-key'")
    if ssm:
        client = local_client("ssm", endpoint_url, region)
        parameter = f"/wsfleet/{relative}"
        client.put_parameter(Name=parameter, Value=value, Type="SecureString", Overwrite=True)
        return f"arn:aws:ssm:{region}:{LOCAL_ACCOUNT_ID}:parameter{parameter}"
    client = local_client("secretsmanager", endpoint_url, region)
    secret = f"wsfleet/{relative}"
    try:
        return str(client.create_secret(Name=secret, SecretString=value)["ARN"])
    except client.exceptions.ResourceExistsException:
        return str(client.put_secret_value(SecretId=secret, SecretString=value)["ARN"])


class LocalFleet(Service):
    """Starts, supervises and stops the local system. Not thread-safe: drive it from one thread
    (the one that will outlive it; children receive SIGTERM when that thread's process dies).
    """

    def __init__(
        self,
        *,
        workers: int = 3,
        timings: FleetTimings | None = None,
        rate: float = 10.0,
        api_port: int = 0,
        run_dir: Path | str | None = None,
        stack_name: str = "wsfleet-local",
        stage: str = DEFAULT_STAGE,
        stream_poll_seconds: float = 0.15,
        extra_worker_env: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        tables: TablesService | None = None,
        task_events: bool = True,
        sink: str = "dynamodb",
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        """``tables``: where the tables live (not started yet; the fleet starts and stops it),
        None for the embedded backend. ``task_events``: publish each worker process's exit as
        its ECS task state change event to the task exit function (crash failover in about a
        second); False leaves a crashed worker's connections to its lease, as without the
        event rule. ``sink``: where the workers store frames (``MESSAGE_SINK``; a stream
        sink's stream is created on the backend, :mod:`wsfleet_local.frame_sinks`).
        ``allowed_hosts``: upstream host suffixes the router and the workers accept besides
        loopback (``AllowedUpstreamHosts``; the workers then connect to them)."""
        if workers < 0:
            raise FleetError("workers must be >= 0")
        self.tables = tables
        self.task_events = task_events
        self.allowed_hosts = tuple(allowed_hosts)
        self.worker_count = workers
        self.timings = timings or FleetTimings()
        self.rate = rate
        self.api_port = api_port
        self.stack_name = stack_name
        self.stage = stage
        self.stream_poll_seconds = stream_poll_seconds
        self.extra_worker_env = dict(extra_worker_env or {})
        self.sink = sink
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="wsfleet-local-"))
        self._on_progress = progress or (lambda message: None)
        self._template_path = find_template()
        self.stack: StackSpec = read_stack(load_template(self._template_path))
        self._backend: ChildProcess | None = None
        self._tables: TablesService | None = None  # ``tables`` while it runs
        self._simulator: ChildProcess | None = None
        self._functions: dict[str, FunctionProcess] = {}
        self._api: LocalApi | None = None
        self._scheduler: ReconcileScheduler | None = None
        self._poller: StreamPoller | None = None
        self._metadata: MetadataServer | None = None
        self._task_watcher: TaskExitWatcher | None = None
        self._resources: Resources | None = None
        self._resolver: StackResolver | None = None
        self.simulator_url: str | None = None
        self.workers: list[WorkerSlot] = []
        self._started = False
        self._aborted = False  # set by abort(), perhaps from another thread than start()'s

    # ------------------------------------------------------------------ properties

    @property
    def resources(self) -> Resources:
        if self._resources is None:
            raise FleetError("the fleet is not started")
        return self._resources

    @property
    def endpoint_url(self) -> str:
        return self.resources.endpoint_url

    @property
    def dynamodb_endpoint_url(self) -> str:
        """Where the tables are: the ``tables`` service's URL if given, else the backend's."""
        if self._tables is not None:
            return self._tables.endpoint_url
        return self.endpoint_url

    @property
    def api_url(self) -> str:
        """Base URL of the local REST API, stage included (``http://127.0.0.1:PORT/dev``)."""
        if self._api is None:
            raise FleetError("the fleet is not started")
        return self._api.url

    @property
    def simulator(self) -> SimulatorClient:
        """A client of the running simulator (streams, faults, session log)."""
        if self.simulator_url is None:
            raise FleetError("the fleet is not started")
        return SimulatorClient(self.simulator_url)

    @property
    def worker_ids(self) -> list[str]:
        return [slot.worker_id for slot in self.workers]

    @property
    def control_queue_prefix(self) -> str:
        return f"{self.stack_name}-ctl-"

    @property
    def task_watcher(self) -> TaskExitWatcher | None:
        """Publishes worker exits as task state change events (None with task_events off)."""
        return self._task_watcher

    def child_pids(self) -> list[int]:
        """Every process this fleet started that is still running (for leak checks)."""
        children = [self._backend, self._simulator, *(slot.process for slot in self.workers)]
        pids = [child.pid for child in children if child is not None and child.alive()]
        pids += [pid for function in self._functions.values() if (pid := function.pid)]
        if self._tables is not None and (pid := self._tables.pid):
            pids.append(pid)
        return pids

    def ports(self) -> list[int]:
        """The TCP ports the fleet listens on (API, backend, simulator)."""
        from urllib.parse import urlsplit

        endpoint = self._resources.endpoint_url if self._resources else None
        tables = self._tables.endpoint_url if self._tables else None
        urls = [self._api.url if self._api else None, endpoint, tables, self.simulator_url]
        return [port for url in urls if url and (port := urlsplit(url).port)]

    # ------------------------------------------------------------------ start

    def start(self) -> LocalFleet:
        """Bring everything up, in dependency order; on any failure, stop what started."""
        if self._started:
            return self
        self._started = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_backend()
            if self.tables is not None:
                self._start_tables(self.tables)
            self._start_simulator()
            self._start_functions()
            self._start_event_sources()
            self._start_api()
            self._start_workers()
            self._write_state()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_child(
        self, name: str, *args: str, stdin_pipe: bool = False
    ) -> tuple[ChildProcess, dict[str, Any]]:
        """``python -m wsfleet_local.<name> --host 127.0.0.1 --port 0 ARGS``, logged to
        run_dir; returns the child and its JSON ready line."""
        self._refuse_if_aborted(name)
        child = spawn(
            name,
            [sys.executable, "-m", f"wsfleet_local.{name}", "--host", "127.0.0.1", "--port", "0",
             *args],
            env=self._base_env(),
            log_path=self.run_dir / f"{name}.log",
            stdin_pipe=stdin_pipe,
            capture_stdout=True,
        )  # fmt: skip
        return child, child.read_json_line(CHILD_READY_TIMEOUT_SECONDS)

    def _start_backend(self) -> None:
        self._progress("starting DynamoDB + SQS (moto) and creating the stack's tables/queues")
        self._backend, ready = self._spawn_child(
            "backend",
            "--create-resources", self.stack_name,
            "--template", str(self._template_path),
            "--exit-on-stdin-eof",
            stdin_pipe=True,
        )  # fmt: skip
        self._resources = Resources(**ready["resources"])
        resources = self._resources
        self._resolver = StackResolver(
            stack_name=self.stack_name,
            region=resources.region,
            names={**resources.tables, **resources.queues},
            parameters=self.stack.parameters,
            overrides=self._parameter_overrides(),
            attributes={
                **resources.get_att(),
                ("WorkerCluster", "Arn"): cluster_arn(resources.region, self.stack_name),
            },
            conditions=self.stack.conditions,
        )

    def _start_tables(self, tables: TablesService) -> None:
        """The ``tables`` service, holding tables shaped like the ones the backend made from
        template.yaml."""
        self._progress(f"starting DynamoDB on {tables.name} (SQS stays on moto)")
        self._tables = tables
        tables.start()
        tables.create_tables(self.resources)

    def _local_env(self) -> dict[str, str]:
        """:meth:`_base_env` pointed at the local resources (the tables on ``tables`` if given)."""
        env = {**self._base_env(), **self.resources.env()}
        if self._tables is not None:
            env["AWS_ENDPOINT_URL_DYNAMODB"] = self._tables.endpoint_url
        return env

    def _parameter_overrides(self) -> dict[str, Any]:
        t = self.timings
        return {
            "LeaseSeconds": _number(t.lease_seconds),
            "HeartbeatSeconds": _number(t.heartbeat_seconds),
            "CheckpointSeconds": _number(t.checkpoint_seconds),
            "WorkerSweepSeconds": _number(t.sweep_seconds),
            "ReconcilePassSeconds": _number(t.pass_seconds),
            "MaxConnectionsPerTask": t.max_connections,
            "RebalanceSeconds": _number(t.rebalance_seconds),
            **(
                {"RebalanceDwellSeconds": _number(t.rebalance_dwell_seconds)}
                if t.rebalance_dwell_seconds is not None
                else {}
            ),
            **(
                {"RebalanceMaxMoves": t.rebalance_max_moves}
                if t.rebalance_max_moves is not None
                else {}
            ),
            "AllowedUpstreamHosts": ",".join(("127.0.0.1", "localhost", *self.allowed_hosts)),
            "AllowInsecureWs": "true",
            "UpstreamSecretPrefix": ",".join(local_secret_prefixes(self.resources.region)),
            "Stage": self.stage,
        }

    def _start_simulator(self) -> None:
        self._progress("starting the upstream WebSocket simulator")
        self._simulator, ready = self._spawn_child("simulator", "--rate", str(self.rate))
        self.simulator_url = str(ready["url"])

    def _function_env(self, spec: FunctionSpec) -> dict[str, str]:
        assert self._resolver is not None
        return {
            **self._local_env(),
            **self._resolver.environment(spec),
            "POWERTOOLS_TRACE_DISABLED": "true",
        }

    def _start_functions(self) -> None:
        names = (ROUTER, RECONCILER, STREAM_NOTIFIER) + ((TASK_EXIT,) if self.task_events else ())
        self._progress(f"starting Lambda environments: {', '.join(names)}")
        processes = {name: self._function_process(name) for name in names}
        self._functions = processes
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:  # cold starts in parallel
            for future in [pool.submit(p.start) for p in processes.values()]:
                future.result()

    def _start_event_sources(self) -> None:
        notifier_spec = self.stack.function(STREAM_NOTIFIER)
        if not notifier_spec.streams:
            raise FleetError("template.yaml gives the stream notifier no DynamoDB event source")
        if self._tables is None:
            self._progress("starting the DynamoDB Streams poller")
            self._start_stream_poller(notifier_spec.streams[0])
        else:
            self._progress(
                f"{self._tables.name} has no Streams: STOP reaches workers at their next renewal"
            )
        self._start_reconcile_schedule()
        if self.task_events:
            self._start_task_events()

    def _function_process(self, name: str) -> FunctionProcess:
        """The Lambda environment of the template's function ``name`` (not started)."""
        spec = self.stack.function(name)
        return FunctionProcess(
            spec.name,
            env=self._function_env(spec),
            log_path=self.run_dir / f"lambda-{spec.name}.log",
            handler=spec.handler,
            timeout_seconds=spec.timeout_seconds,
            memory_mb=spec.memory_mb,
        )

    def _start_reconcile_schedule(self) -> None:
        self._progress("starting the reconcile schedule")
        self._scheduler = ReconcileScheduler(
            self._functions[RECONCILER].invoke,
            interval_seconds=self.timings.pass_seconds,
            schedule_name=f"{self.stack_name}-reconcile",
            event_template=self._scheduler_sample(),
            region=self.resources.region,
        ).start()

    def _start_task_events(self) -> None:
        """The metadata endpoint the workers read, and their exits as EventBridge events."""
        assert self._resolver is not None
        spec = self.stack.function(TASK_EXIT)
        if not spec.rules:
            raise FleetError("template.yaml gives the task exit function no EventBridge rule")
        self._progress("starting the ECS metadata endpoint and the task exit events")
        self._metadata = MetadataServer().start()

        def reported(task: LocalTask, event: dict[str, Any], result: Any) -> None:
            killed = result.get("killed") if isinstance(result, Mapping) else None
            if killed:
                self._progress(
                    f"task {task.task_arn.rsplit('/', 1)[-1][:8]} exited: "
                    f"{', '.join(killed)} failed over"
                )

        self._task_watcher = TaskExitWatcher(
            self._functions[TASK_EXIT].invoke,
            self._resolver.resolve(spec.rules[0].pattern),
            region=self.resources.region,
            on_event=reported,
        ).start()

    def _start_stream_poller(self, source: Any) -> None:
        resources = self.resources
        streams_client = local_client("dynamodbstreams", resources.endpoint_url, resources.region)
        self._poller = StreamPoller(
            client=streams_client,
            stream_arn=resources.stream_arn,
            invoke=self._functions[STREAM_NOTIFIER].invoke,
            source=source,
            region=resources.region,
            function_arn=f"arn:aws:lambda:{resources.region}:{LOCAL_ACCOUNT_ID}:function:"
            f"{self.stack_name}-stream-notifier",
            poll_interval_seconds=self.stream_poll_seconds,
            on_failure=self._on_failure_sender(source.on_failure_destination),
        ).start()

    def _on_failure_sender(self, destination: Any) -> Callable[[dict[str, Any]], None] | None:
        """Send given-up batches to the template's on-failure queue, if it exists locally."""
        if not (isinstance(destination, Mapping) and "Fn::GetAtt" in destination):
            return None
        target = destination["Fn::GetAtt"]
        logical_id = target[0] if isinstance(target, list) else str(target).split(".")[0]
        url = self.resources.queues.get(logical_id)
        if url is None:
            return None
        sqs = local_client("sqs", self.resources.endpoint_url, self.resources.region)

        def send(message: dict[str, Any]) -> None:
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps(message, default=str))

        return send

    def _scheduler_sample(self) -> dict[str, Any] | None:
        path = self._template_path.parent / "events" / SCHEDULER_EVENT_SAMPLE
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def _start_api(self) -> None:
        self._api = LocalApi(
            self._functions[ROUTER].invoke,
            routes=self.stack.function(ROUTER).routes,
            port=self.api_port,
            stage=self.stage,
        ).start()
        self._progress(f"REST API listening on {self._api.url}")

    def _start_workers(self) -> None:
        if self.sink != "dynamodb":
            self._progress(f"creating the {self.sink} frame sink")
            self.extra_worker_env.update(
                create_local_sink(
                    self.sink, self.endpoint_url, self.resources.region, self.stack_name
                )
            )
        if not self.worker_count:
            return
        self._progress(f"starting {self.worker_count} worker process(es)")
        self.workers = [self._spawn_worker(index, 0) for index in range(self.worker_count)]
        for slot in self.workers:
            self._wait_worker_ready(slot)

    # ------------------------------------------------------------------ workers

    def _worker_env(self, worker_id: str, metadata_uri: str | None = None) -> dict[str, str]:
        assert self._resolver is not None
        t = self.timings
        return {
            **self._local_env(),
            **self._resolver.resolve_variables(self.stack.worker_environment, owner="worker"),
            "WORKER_ID": worker_id,
            "HEALTH_FILE": str(self._health_file(worker_id)),
            "DRAIN_TIMEOUT_SECONDS": _number(t.drain_timeout_seconds),
            "LEASE_SAFETY_MARGIN_SECONDS": _number(t.margin_seconds),
            "WORKER_HINT_WAIT_SECONDS": str(t.queue_wait_seconds),
            "WORKER_CONTROL_WAIT_SECONDS": str(t.queue_wait_seconds),
            "WORKER_METRICS_FLUSH_SECONDS": "10",
            **({"ECS_CONTAINER_METADATA_URI_V4": metadata_uri} if metadata_uri else {}),
            **self.extra_worker_env,
        }

    def _health_file(self, worker_id: str) -> Path:
        return self.run_dir / f"worker-{worker_id}.health"

    def _spawn_worker(self, index: int, generation: int) -> WorkerSlot:
        worker_id = f"w{index}" if generation == 0 else f"w{index}-r{generation}"
        self._refuse_if_aborted(f"worker {worker_id}")
        task = metadata_uri = None
        if self._metadata is not None:
            task = LocalTask.new(cluster_arn(self.resources.region, self.stack_name))
            metadata_uri = self._metadata.register(task)
        process = spawn(
            f"worker {worker_id}",
            [sys.executable, "-m", "wsfleet_worker"],
            env=self._worker_env(worker_id, metadata_uri),
            log_path=self.run_dir / f"worker-{worker_id}.log",
        )
        if task is not None and self._task_watcher is not None:
            self._task_watcher.watch(task, process.popen.poll)
        return WorkerSlot(index=index, worker_id=worker_id, process=process, generation=generation)

    def _wait_worker_ready(self, slot: WorkerSlot) -> None:
        """Ready = the worker touched its health file (its loop runs, its queues exist)."""
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_SECONDS
        health = self._health_file(slot.worker_id)
        while not health.exists():
            if not slot.alive():
                raise FleetError(
                    f"worker {slot.worker_id} exited with {slot.process.popen.returncode} "
                    f"during start-up (see {slot.process.log_path})"
                )
            if time.monotonic() > deadline:
                raise FleetError(f"worker {slot.worker_id} did not become healthy")
            time.sleep(0.05)

    def wait_workers_ready(self) -> None:
        """Block until every worker slot's current process is healthy (after restarts)."""
        for slot in self.workers:
            self._wait_worker_ready(slot)

    def _slot(self, index: int) -> WorkerSlot:
        if not 0 <= index < len(self.workers):
            raise FleetError(f"no worker slot {index} (slots: 0..{len(self.workers) - 1})")
        return self.workers[index]

    def kill_worker(self, index: int, signum: int = signal.SIGKILL) -> WorkerSlot:
        """Send ``signum`` to the worker in slot ``index`` (SIGKILL: a crash; SIGTERM: a drain)."""
        slot = self._slot(index)
        slot.process.send_signal(signum)
        return slot

    def wait_worker_exit(self, index: int, timeout_seconds: float | None = None) -> int | None:
        """The worker's exit code once it ended, or None after ``timeout_seconds``."""
        return self._slot(index).process.wait(timeout_seconds)

    def restart_worker(self, index: int, *, wait_ready: bool = True) -> WorkerSlot:
        """Replace the worker in slot ``index`` by a new process with a new worker id.

        A still-running worker is first drained (SIGTERM, bounded like :meth:`stop`). A new id
        matters: leases and control queues belong to a worker *incarnation*.
        """
        old = self._slot(index)
        old.process.stop(signal.SIGTERM, self.timings.drain_timeout_seconds + 5)  # or reap it
        slot = self._spawn_worker(index, old.generation + 1)
        self.workers[index] = slot
        if wait_ready:
            self._wait_worker_ready(slot)
        self._write_state()
        return slot

    def add_worker(self) -> WorkerSlot:
        """Scale out by one slot."""
        slot = self._spawn_worker(len(self.workers), 0)
        self.workers.append(slot)
        self._wait_worker_ready(slot)
        self._write_state()
        return slot

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Graceful shutdown in dependency order; safe to call twice and after a failed start."""
        api, self._api = self._api, None
        if api is not None:
            self._progress("stopping the REST API")
            api.stop()
        watcher, self._task_watcher = self._task_watcher, None
        if watcher is not None:  # the fleet's own shutdown is not a crash to fail over
            watcher.stop()
        self._drain_workers()
        scheduler, self._scheduler = self._scheduler, None
        poller, self._poller = self._poller, None
        if scheduler is not None or poller is not None:
            self._progress("stopping the reconcile schedule and the streams poller")
        if poller is not None:
            poller.stop()
        if scheduler is not None:
            scheduler.stop()
        functions, self._functions = self._functions, {}
        if functions:
            self._progress("stopping the Lambda environments")
            with ThreadPoolExecutor(max_workers=len(functions)) as pool:
                list(pool.map(lambda f: f.stop(), functions.values()))
        simulator, self._simulator = self._simulator, None
        if simulator is not None:
            self._progress("stopping the upstream simulator")
            simulator.stop(signal.SIGTERM, 10)
        backend, self._backend = self._backend, None
        if backend is not None:
            self._progress("stopping DynamoDB + SQS (moto)")
            backend.close_stdin()
            backend.stop(signal.SIGTERM, 10)
        metadata, self._metadata = self._metadata, None
        if metadata is not None:
            metadata.stop()
        tables, self._tables = self._tables, None
        if tables is not None:
            self._progress(f"stopping {tables.name}")
            tables.stop()
        self._started = False

    def abort(self) -> None:
        """Kill every child at once (SIGKILL), no drain: the second Ctrl-C. Safe to call twice,
        and from another thread while :meth:`start` or :meth:`stop` runs (the CLI's main
        thread does): from now on nothing new is spawned and nothing is drained."""
        self._aborted = True
        watcher, self._task_watcher = self._task_watcher, None
        if watcher is not None:
            watcher.stop()
        for slot in self.workers:
            slot.process.stop(signal.SIGKILL, 5)
        for function in list(self._functions.values()):
            function.kill()
        for child in (self._simulator, self._backend):
            if child is not None:
                child.stop(signal.SIGKILL, 5)
        self.stop()  # now quick: releases threads and sockets, reaps what is left

    def _refuse_if_aborted(self, name: str) -> None:
        if self._aborted:
            raise FleetError(f"not starting {name}: the fleet was aborted")

    def _drain_workers(self) -> None:
        alive = [slot for slot in self.workers if slot.alive()]
        if alive and self._aborted:
            for slot in alive:
                slot.process.stop(signal.SIGKILL, 5)
        elif alive:
            bound = self.timings.drain_timeout_seconds + 5
            self._progress(f"draining {len(alive)} worker(s) (SIGTERM, at most {bound:.0f} s)")
            with ThreadPoolExecutor(max_workers=len(alive)) as pool:
                codes = list(pool.map(lambda slot: slot.process.stop(signal.SIGTERM, bound), alive))
            for slot, code in zip(alive, codes, strict=True):
                self._progress(f"worker {slot.worker_id} exited with {code}")
        for slot in self.workers:
            slot.process.stop()  # reap the ones that had already exited

    # ------------------------------------------------------------------ misc

    def _progress(self, message: str) -> None:
        """Tell the caller (spinner, console) and keep a timestamped line in run_dir/fleet.log."""
        stamp = time.strftime("%H:%M:%S")
        with (
            contextlib.suppress(OSError),
            open(self.run_dir / "fleet.log", "a", encoding="utf-8") as log,
        ):
            log.write(f"{stamp} {message}\n")
        self._on_progress(message)

    def _base_env(self) -> dict[str, str]:
        """The parent's environment minus anything that could reach a real AWS account."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("AWS_", "WSFLEET_API")) and key not in _FUNCTION_VARIABLES
        }
        env["PYTHONUNBUFFERED"] = "1"
        env["WSFLEET_TEMPLATE"] = str(self._template_path)
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        return env

    def _write_state(self) -> None:
        """``run_dir/fleet.json``: URLs and pids, for humans and for `wsfleet status`."""
        state = {
            "api_url": self.api_url,
            "endpoint_url": self.endpoint_url,
            "dynamodb_endpoint_url": self.dynamodb_endpoint_url,
            "simulator_url": self.simulator_url,
            "connections_table": self.resources.connections_table,
            "messages_table": self.resources.messages_table,
            "message_sink": self.extra_worker_env.get("MESSAGE_SINK", "dynamodb"),
            "message_stream": self.extra_worker_env.get("MESSAGE_STREAM", ""),
            "region": self.resources.region,
            "supervisor_pid": os.getpid(),
            "workers": [{"worker_id": s.worker_id, "pid": s.pid} for s in self.workers],
            "child_pids": self.child_pids(),
            "ports": self.ports(),
        }
        partial = self.run_dir / "fleet.json.tmp"
        partial.write_text(json.dumps(state, indent=2), encoding="utf-8")
        partial.replace(self.run_dir / "fleet.json")  # readers never see half a file


#: Variables a developer's shell may hold that must not leak into the local processes (each
#: process gets exactly the value the template or the fleet gives it): every setting wsfleet
#: reads, and what the Lambda runtime or ECS would set.
_FUNCTION_VARIABLES = frozenset(
    {var.name for var in ENVIRONMENT} | {"POWERTOOLS_SERVICE_NAME", "ECS_CONTAINER_METADATA_URI_V4"}
)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
