"""Settings: every environment variable wsfleet reads, with its default, in one place.

The table :data:`ENVIRONMENT` lists each variable once: its name, the field it fills, its
documented default, its meaning and the components that read it. Two typed objects are built
from it with the same parsing (:func:`read_environment`):

* :class:`Settings` (``scope="shared"``) - every component builds one with
  :meth:`Settings.from_env` and reads the fields it needs;
* ``wsfleet_worker.config.WorkerConfig`` (``scope="worker"``) - knobs that only tune the worker
  process (long-poll waits, thread and queue limits, ...). Their defaults are production values;
  tests and the local fleet shorten them.

An unset or empty variable keeps its default. A value that cannot be parsed, or that fails
validation, raises :class:`~wsfleet.exceptions.ConfigurationError` naming the variable.
Units are in the names (``*_seconds``, ``*_ms``). Endpoint selection is deliberately absent:
boto3 honours the standard ``AWS_ENDPOINT_URL`` itself (that is how the embedded moto backend is
selected locally).

The README's configuration table is :func:`markdown_table` (print it with
``python -m wsfleet.settings``); a test keeps the two in step.
"""

from __future__ import annotations

import math
import os
import socket
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from .exceptions import ConfigurationError

__all__ = [
    "ENVIRONMENT",
    "EnvVar",
    "Scope",
    "Settings",
    "default_worker_id",
    "markdown_table",
    "read_environment",
]

#: Which typed object a variable fills: ``"shared"`` -> :class:`Settings`, ``"worker"`` ->
#: ``wsfleet_worker.config.WorkerConfig`` (read by the worker process only).
Scope = Literal["shared", "worker"]


class EnvVar(NamedTuple):
    """One environment variable: its name, the field it fills, default, meaning and readers."""

    name: str
    field: str
    default: str
    doc: str
    used_by: str
    scope: Scope = "shared"


ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar("CONNECTIONS_TABLE", "connections_table", "wsfleet-connections",
           "DynamoDB table of connection and worker items.", "all"),
    EnvVar("MESSAGES_TABLE", "messages_table", "wsfleet-messages",
           "DynamoDB table the worker stores upstream frames in.", "worker"),
    EnvVar("HINT_QUEUE_URL", "hint_queue_url", "",
           "SQS queue URL for work hints (required by router, reconciler, worker).", "all"),
    EnvVar("LEASE_SECONDS", "lease_seconds", "20",
           "Worker lease duration: a worker that stops renewing without a task exit event (hung, "
           "partitioned, or its event lost) has its connections taken over this long after "
           "its last heartbeat; a crash fails over from the exit event in about a second. "
           "Must be at least twice HEARTBEAT_EVERY.", "all"),
    EnvVar("HEARTBEAT_EVERY", "heartbeat_seconds", "5",
           "Seconds between renewals of a worker's one lease (one write per worker, whatever "
           "it holds).", "all"),
    EnvVar("LEASE_SAFETY_MARGIN_SECONDS", "lease_safety_margin_seconds", "2",
           "Self-fence: a worker closes every socket this long before its unrenewed lease "
           "expires.", "worker"),
    EnvVar("CHECKPOINT_SECONDS", "checkpoint_seconds", "600",
           "A connection's checkpoint is written at most this often, and only when it "
           "advanced (plus at release, STOP and session end). It is the replay window: after a "
           "crash the next owner resumes from the last written checkpoint, so the upstream "
           "must replay at least this far back. Costs 3600/N writes per active "
           "connection-hour.", "worker"),
    EnvVar("MAX_CONNECTIONS", "max_connections", "100",
           "Connections one worker process holds at most.", "worker"),
    EnvVar("WORKER_ID", "worker_id", "<hostname>-<pid>-<random>",
           "Identity written as lease_owner. Unset in an ECS task, the id names the task: "
           "<task_id>.<hostname>-<pid>-<random>.", "worker"),
    EnvVar("DRAIN_TIMEOUT_SECONDS", "drain_timeout_seconds", "20",
           "Upper bound for graceful shutdown; keep below ECS stopTimeout.", "worker"),
    EnvVar("CONTROL_QUEUE_PREFIX", "control_queue_prefix", "wsfleet-ctl-",
           "Name prefix of per-worker control queues (the stack sets <stack>-ctl-).",
           "worker, reconciler, stream_notifier"),
    EnvVar("CONTROL_QUEUE_SENDER_ARNS", "control_queue_sender_arns", "",
           "Comma-separated IAM role ARNs allowed to send to control queues (a queue policy "
           "set at CreateQueue denies every other sender); empty sets no policy (local runs).",
           "worker"),
    EnvVar("SEQ_FIELD", "seq_field", "seq",
           "Field of each upstream JSON frame that holds its sequence number (a START's "
           "upstream.seq_pointer overrides it per connection; the router drops a pointer "
           "that names this field, so give both the same value).", "router, worker"),
    EnvVar("RESUME_PARAM", "resume_param", "from_seq",
           "Query parameter that asks the upstream to resume from a sequence number.", "worker"),
    EnvVar("MESSAGE_FLUSH_MS", "message_flush_ms", "100",
           "A message batch is written at least this often, or as soon as it is full "
           "(DynamoDB 25 frames; Kinesis 5,000 frames aggregated, 500 plain, or 4 MiB; "
           "Firehose 5,000 frames or 4 MiB). The longest a frame waits before its write "
           "starts. On the stream sinks a longer flush packs more frames per record and "
           "request: at 100 x 20 frames/s, 250 ms gave 16,500 frames/s per worker vCPU "
           "instead of 13,300, for up to 150 ms more latency (bench/RESULTS.md 6f).", "worker"),
    EnvVar("MESSAGE_RETENTION_DAYS", "message_retention_days", "30",
           "Stored frames get a TTL (expires_at) this many days ahead; 0 keeps them.", "worker"),
    EnvVar("MESSAGE_SINK", "message_sink", "dynamodb",
           "Where the worker stores frames: dynamodb (MESSAGES_TABLE, one item per frame, "
           "idempotent), kinesis (a data stream, partition key = connection id, records "
           "KPL-aggregated) or firehose (a delivery stream, JSON Lines); kinesis and firehose "
           "are at-least-once (README \"Where frames go\").", "worker"),
    EnvVar("MESSAGE_STREAM", "message_stream", "",
           "The Kinesis data stream or Firehose delivery stream (name or ARN) frames go to; "
           "required when MESSAGE_SINK is kinesis or firehose.", "worker"),
    EnvVar("MESSAGE_KINESIS_AGGREGATION", "message_kinesis_aggregation", "true",
           "kinesis: pack each connection's frames into KPL aggregated records (consumers "
           "deaggregate with the KPL libraries, as KCL and Lambda do); false: one frame per "
           "record.", "worker"),
    EnvVar("MESSAGE_REPLAY_WINDOW", "message_replay_window", "10000",
           "kinesis and firehose: the most frames a failover re-sends. A holder sends no seq "
           "above the bound it last wrote with the checkpoint (checkpoint + this), so the "
           "checkpoint is also written when 3/4 of it is used: about 3600 x rate / (0.75 x N) "
           "writes per connection-hour at `rate` frames/s, at least 3600/CHECKPOINT_SECONDS. "
           "Ignored by dynamodb (idempotent).", "worker"),
    EnvVar("STOPPED_RETENTION_DAYS", "stopped_retention_days", "7",
           "STOPPED connection items expire (TTL) this many days after the stop; 0 keeps them.",
           "router, worker"),
    EnvVar("HEALTH_FILE", "health_file", "/tmp/wsfleet-worker.health",
           "File the worker touches on every healthy loop, for the container health check.",
           "worker"),
    EnvVar("SERVICE_NAME", "service_name", "wsfleet-worker",
           "ServiceName dimension of the ActiveConnections metric (autoscaling).", "worker"),
    EnvVar("RECONCILE_PASS_SECONDS", "reconcile_pass_seconds", "10",
           "Seconds between reconcile passes inside one reconciler invocation.", "reconciler"),
    EnvVar("RECONCILE_PAGE_SIZE", "reconcile_page_size", "500",
           "Page size of the reconciler's index queries (a dead worker's connections, free "
           "connections).", "reconciler"),
    EnvVar("REBALANCE", "rebalance", "true",
           "Even the load out after a scale-out: the reconciler plans moves from workers above "
           "their share to those below, workers hand them off gracefully; false turns moves "
           "and placement off.", "reconciler, worker"),
    EnvVar("REBALANCE_SECONDS", "rebalance_seconds", "10",
           "A worker reads the fleet view (one item) this often and carries out its part of "
           "the plan.", "reconciler, worker"),
    EnvVar("REBALANCE_MAX_MOVES", "rebalance_max_moves", "20",
           "Connections one worker hands off per plan at most (a plan at most every other "
           "reconcile pass); 0 turns moves off.", "reconciler"),
    EnvVar("REBALANCE_DWELL_SECONDS", "rebalance_dwell_seconds", "600",
           "A connection moved by rebalancing is not moved again for this long.", "worker"),
    EnvVar("REBALANCE_BAND_PERCENT", "rebalance_band_percent", "10",
           "Tolerance band: a worker within this percent of its share (at least one "
           "connection) is balanced; nothing moves while every worker is.",
           "reconciler, worker"),
    EnvVar("REBALANCE_PLACEMENT_SECONDS", "rebalance_placement_seconds", "1",
           "A worker holding more than its share of the fleet's load plus the band waits "
           "this long before each receive from the hint queue, so new and orphaned "
           "connections go to less loaded peers first; 0 turns placement off.", "worker"),
    EnvVar("ALLOWED_UPSTREAM_HOSTS", "allowed_upstream_hosts", "",
           "Comma-separated host suffixes ws_url may use; empty allows any public host. "
           "Private/loopback IP literals are refused unless listed. The worker applies it "
           "to every redirect hop and resolved address too: a listed name resolving to a "
           "private address is refused unless that address is listed.", "router, worker"),
    EnvVar("UPSTREAM_SECRET_PREFIXES", "upstream_secret_prefixes", "",
           "Comma-separated ARN prefixes a START's upstream.credential.ref must start with "
           "(Secrets Manager secret or SSM parameter ARNs; the template sets it from "
           "UpstreamSecretPrefix, and the worker role may read exactly those prefixes). Empty "
           "turns credentials by reference off (422).", "router"),
    EnvVar("ALLOW_INSECURE_WS", "allow_insecure_ws", "false",
           "Accept ws:// upstream URLs (wss:// is always accepted).", "router, worker"),
    EnvVar("WORKER_CONTAINER_NAME", "worker_container_name", "worker",
           "Name of the worker container in the ECS task definition: a task exit event fails "
           "the worker over only once this container has stopped.", "task_exit"),
    # -- worker process tuning (WorkerConfig) ---------------------------------------------
    EnvVar("WORKER_HINT_WAIT_SECONDS", "hint_wait_seconds", "20",
           "Hint-queue long-poll wait, 0-20 (the SQS limit).", "worker", scope="worker"),
    EnvVar("WORKER_CONTROL_WAIT_SECONDS", "control_wait_seconds", "20",
           "Control-queue long-poll wait, 0-20 (the SQS limit).", "worker", scope="worker"),
    EnvVar("WORKER_CONTROL_CHANNEL", "control_channel", "true",
           "Create and consume a control queue; false: a STOP is only noticed by the worker's "
           "sweep (WORKER_SWEEP_SECONDS).", "worker", scope="worker"),
    EnvVar("WORKER_SWEEP_SECONDS", "sweep_seconds", "30",
           "The worker reads its own connections from gsi_owner this often: a STOP whose "
           "control message was lost ends within this long, and a connection it owns without "
           "a session is released. Template parameter WorkerSweepSeconds. Each sweep reads "
           "about 1 unit per 125 connections held (at least 0.5): at 30 s about 6 read units "
           "per connection-hour at 10 connections per worker, 1 at 1,000 (docs/tradeoffs.md).",
           "worker", scope="worker"),
    EnvVar("WORKER_METRICS_FLUSH_SECONDS", "metrics_flush_seconds", "60",
           "EMF metrics are printed this often.", "worker", scope="worker"),
    EnvVar("WORKER_IO_THREADS", "io_threads", "16",
           "Threads for DynamoDB/SQS lease calls.", "worker", scope="worker"),
    EnvVar("WORKER_WRITE_THREADS", "write_threads", "4",
           "Message batches written concurrently.", "worker", scope="worker"),
    EnvVar("WORKER_QUEUE_FRAMES", "queue_frames", "10000",
           "Frames queued for writing (all connections) before sessions stop reading their "
           "sockets.", "worker", scope="worker"),
    EnvVar("WORKER_SESSION_QUEUE_FRAMES", "session_queue_frames", "500",
           "Frames one connection may have in flight.", "worker", scope="worker"),
    EnvVar("WORKER_MAX_FRAME_BYTES", "max_frame_bytes", "393216",
           "Largest accepted frame (DynamoDB items are at most 400 KB).", "worker", scope="worker"),
    EnvVar("WORKER_QUEUE_BYTES", "queue_bytes", "134217728",
           "Bytes of frames (DynamoDB item size) held for writing by all connections before "
           "sessions stop reading their sockets: 128 MiB, 1/8 of the 1 GiB task (queued frames "
           "cost more than their size in Python, and a batch being sent is copied).",
           "worker", scope="worker"),
    EnvVar("WORKER_SESSION_QUEUE_BYTES", "session_queue_bytes", "4194304",
           "Bytes of frames one connection may have in flight (4 MiB: about 10 frames of the "
           "largest size) before it stops reading its socket.", "worker", scope="worker"),
    EnvVar("WORKER_MAX_SEQ_JUMP", "max_seq_jump", "1000000",
           "A seq more than this above the highest seen on the connection is an invalid frame "
           "(stored under a local key, counted), so one bogus seq cannot jam the stream; 0 "
           "turns the check off. Seqs are always 1 to 2^53-1.", "worker", scope="worker"),
    EnvVar("WORKER_MESSAGE_TIMEOUT_SECONDS", "message_timeout_seconds", "30",
           "A message (a fragmented one, or one frame) still incomplete this long after its "
           "first byte fails the connection (close 1008 \"message timeout\", counted by the "
           "crash-loop breaker, metric MessageTimeouts): a trickled message cannot hold a "
           "session. 0 turns it off.", "worker", scope="worker"),
    EnvVar("WORKER_BREAKER_MAX_FAILURES", "breaker_max_failures", "5",
           "Crash-loop breaker: failures counted, across all workers, before the connection "
           "ends FAILED: session crashes, closes the worker sent for what the upstream sent "
           "(1002/1007/1008/1009), unreadable credentials, normal upstream closes before any "
           "frame. They count at one checkpoint whatever the time, and at any position within "
           "WORKER_BREAKER_WINDOW_SECONDS of the first. 0 turns the breaker off.",
           "worker", scope="worker"),
    EnvVar("WORKER_BREAKER_WINDOW_SECONDS", "breaker_window_seconds", "600",
           "Crash-loop breaker window: failures this close to the first one counted add up "
           "even when each session moved the checkpoint (an upstream that sends one new frame, "
           "then a poison one, on every connect). 0 counts at one checkpoint only.",
           "worker", scope="worker"),
    EnvVar("WORKER_SECRET_CACHE_SECONDS", "secret_cache_seconds", "60",
           "How long a worker reuses a resolved upstream credential (Secrets Manager / SSM "
           "SecureString) before reading it again at the next connect: a rotated secret is "
           "picked up within this, or at once when a handshake is refused with 401/403 (one "
           "forced read per reference per 30 s). 0 reads it at every connect.",
           "worker", scope="worker"),
    EnvVar("HANDOFF_PREPARE_SECONDS", "handoff_prepare_seconds", "3",
           "Make-before-break bound (docs/handoff.md): a giver that has no READY from its "
           "taker this long after PREPARE (the taker could not connect, got no numbered frame, "
           "or lags) breaks instead (close, release, HANDOFF), and the taker waits twice this "
           "for COMMIT before it closes what it opened. 0 turns overlap hand-offs off.",
           "worker", scope="worker"),
    EnvVar("HANDOFF_BUFFER_FRAMES", "handoff_buffer_frames", "10000",
           "Frames a taker's prepared session may buffer before it owns the connection (10 s "
           "at 1,000 frames/s: the overlap lasts the prepare bound at most, and twice that "
           "until COMMIT); its bytes stay within WORKER_SESSION_QUEUE_BYTES. Over either, the "
           "taker declines and the move breaks.",
           "worker", scope="worker"),
)


def default_worker_id() -> str:
    """A worker identity unique across restarts: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Typed, validated settings. Build with :meth:`from_env`; override in tests with kwargs."""

    connections_table: str = "wsfleet-connections"
    messages_table: str = "wsfleet-messages"
    hint_queue_url: str = ""
    lease_seconds: float = 20.0
    heartbeat_seconds: float = 5.0
    lease_safety_margin_seconds: float = 2.0
    max_connections: int = 100
    worker_id: str = field(default_factory=default_worker_id)
    drain_timeout_seconds: float = 20.0
    control_queue_prefix: str = "wsfleet-ctl-"
    control_queue_sender_arns: str = ""
    seq_field: str = "seq"
    resume_param: str = "from_seq"
    message_flush_ms: int = 100
    message_retention_days: float = 30.0
    message_sink: str = "dynamodb"
    message_stream: str = ""
    message_kinesis_aggregation: bool = True
    message_replay_window: int = 10_000
    stopped_retention_days: float = 7.0
    checkpoint_seconds: float = 600.0
    health_file: str = "/tmp/wsfleet-worker.health"
    service_name: str = "wsfleet-worker"
    reconcile_pass_seconds: float = 10.0
    reconcile_page_size: int = 500
    rebalance: bool = True
    rebalance_seconds: float = 10.0
    rebalance_max_moves: int = 20
    rebalance_dwell_seconds: float = 600.0
    rebalance_band_percent: float = 10.0
    rebalance_placement_seconds: float = 1.0
    allowed_upstream_hosts: tuple[str, ...] = ()
    upstream_secret_prefixes: tuple[str, ...] = ()
    allow_insecure_ws: bool = False
    worker_container_name: str = "worker"

    def __post_init__(self) -> None:
        if self.heartbeat_seconds <= 0:
            raise ConfigurationError("HEARTBEAT_EVERY must be positive")
        if self.lease_seconds < 2 * self.heartbeat_seconds:
            raise ConfigurationError(
                f"LEASE_SECONDS ({self.lease_seconds}) must be at least twice HEARTBEAT_EVERY "
                f"({self.heartbeat_seconds}) so one late renewal does not lose the lease"
            )
        if not 0 <= self.lease_safety_margin_seconds < self.lease_seconds - self.heartbeat_seconds:
            raise ConfigurationError(
                "LEASE_SAFETY_MARGIN_SECONDS must be >= 0 and below LEASE_SECONDS - HEARTBEAT_EVERY"
            )
        if self.checkpoint_seconds <= 0:
            raise ConfigurationError("CHECKPOINT_SECONDS must be positive")
        if self.message_replay_window < 1:
            raise ConfigurationError("MESSAGE_REPLAY_WINDOW must be at least 1")
        if self.max_connections < 1:
            raise ConfigurationError("MAX_CONNECTIONS must be at least 1")
        if self.message_sink not in ("dynamodb", "kinesis", "firehose"):
            raise ConfigurationError(
                f"MESSAGE_SINK must be dynamodb, kinesis or firehose, got {self.message_sink!r}"
            )
        if self.message_sink != "dynamodb" and not self.message_stream:
            raise ConfigurationError(
                f"MESSAGE_STREAM is required with MESSAGE_SINK={self.message_sink}"
            )
        arn_kind = {"kinesis": ":kinesis:", "firehose": ":firehose:"}.get(self.message_sink)
        stream = self.message_stream
        if arn_kind and stream.startswith("arn:") and arn_kind not in stream:
            raise ConfigurationError(
                f"MESSAGE_STREAM {stream!r} is not a {self.message_sink} ARN"
            )
        if not 1 <= self.reconcile_page_size <= 10_000:
            raise ConfigurationError("RECONCILE_PAGE_SIZE must be between 1 and 10000")
        if self.rebalance_seconds <= 0:
            raise ConfigurationError("REBALANCE_SECONDS must be positive")
        if self.rebalance_max_moves < 0:
            raise ConfigurationError("REBALANCE_MAX_MOVES must be >= 0")
        if self.rebalance_dwell_seconds < 0:
            raise ConfigurationError("REBALANCE_DWELL_SECONDS must be >= 0")
        if not 0 <= self.rebalance_band_percent <= 100:
            raise ConfigurationError("REBALANCE_BAND_PERCENT must be between 0 and 100")
        if not 0 <= self.rebalance_placement_seconds <= 20:
            raise ConfigurationError("REBALANCE_PLACEMENT_SECONDS must be between 0 and 20")
    # -- derived values -------------------------------------------------------------------
    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @property
    def checkpoint_ms(self) -> int:
        return int(self.checkpoint_seconds * 1000)

    @property
    def safety_margin_ms(self) -> int:
        return int(self.lease_safety_margin_seconds * 1000)

    def check_reconcile_pass(self) -> None:
        """Refuse a pass interval that would put live leases in the early-hint window.

        A pass hints leases expiring before the next pass. A lease renewed every heartbeat
        always expires more than ``lease - heartbeat`` ahead, so as long as the pass interval is
        shorter than that, early hints only ever name leases whose owner stopped renewing.
        """
        if self.reconcile_pass_seconds >= self.lease_seconds - self.heartbeat_seconds:
            raise ConfigurationError(
                f"RECONCILE_PASS_SECONDS ({self.reconcile_pass_seconds}) must be shorter than "
                f"LEASE_SECONDS - HEARTBEAT_EVERY ({self.lease_seconds - self.heartbeat_seconds})"
            )

    def require_hint_queue_url(self) -> str:
        """The hint queue URL, or a ConfigurationError naming the variable."""
        if not self.hint_queue_url:
            raise ConfigurationError("HINT_QUEUE_URL is not set")
        return self.hint_queue_url

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every shared variable in :data:`ENVIRONMENT`; unset ones keep their defaults.

        >>> Settings.from_env({"LEASE_SECONDS": "4", "HEARTBEAT_EVERY": "1"}).lease_ms
        4000
        """
        env = os.environ if environ is None else environ
        return cls(**{**read_environment(cls, "shared", env), **overrides})


# ---------------------------------------------------------------------------- parsing
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
#: Lists compared case-insensitively (host names); ARNs and the like keep their case.
_CASE_INSENSITIVE = frozenset({"ALLOWED_UPSTREAM_HOSTS"})


def read_environment(target: type, scope: Scope, environ: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``target`` from the set variables of ``scope``.

    Each value is parsed to the type annotated on ``target``'s field. Unset and empty variables
    are left out, so the dataclass default applies.
    """
    types = typing.get_type_hints(target)
    values: dict[str, Any] = {}
    for var in ENVIRONMENT:
        raw = environ.get(var.name, "")
        if var.scope == scope and raw != "":
            values[var.field] = _parse_value(var.name, raw, types[var.field])
    return values


def _parse_value(name: str, raw: str, kind: Any) -> Any:
    """``raw`` as a ``kind`` value, or a ConfigurationError naming the variable ``name``."""
    if kind is bool:
        value = raw.strip().lower()
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        raise ConfigurationError(f"{name} must be true or false, got {raw!r}")
    if kind is int or kind is float:
        return _parse_number(name, raw, kind)
    if typing.get_origin(kind) is tuple:  # comma-separated; host names are case-insensitive
        parts = (part.strip() for part in raw.split(","))
        fold = name in _CASE_INSENSITIVE
        return tuple(part.lower() if fold else part for part in parts if part)
    return raw


def _parse_number(name: str, raw: str, kind: type[int] | type[float]) -> int | float:
    try:
        number = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be a finite number, got {raw!r}")
    if kind is int:
        if not number.is_integer():
            raise ConfigurationError(f"{name} must be a whole number, got {raw!r}")
        return int(number)
    return number


# ---------------------------------------------------------------------------- documentation
def markdown_table() -> str:
    """The README's configuration table: one row per variable, in :data:`ENVIRONMENT` order."""
    rows = ["| Variable | Default | Used by | Meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | `{v.default}` | {v.used_by} | {v.doc} |" for v in ENVIRONMENT]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
