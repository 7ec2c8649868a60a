"""A fault-injecting HTTP proxy in front of the local AWS endpoint: throttling, 5xx, and counts.

wsfleet must survive DynamoDB and SQS answering "slow down" or "something broke", including
the worst case where the write *landed* but the client only saw a 500. The moto server never
does either, so this proxy sits between the clients and the server (clients point
``AWS_ENDPOINT_URL`` at it) and, by rule, answers some requests itself with the exact error a
real service sends:

=============  =========================================================================
kind           what the client receives
=============  =========================================================================
``throttle``   400, DynamoDB ``ProvisionedThroughputExceededException``; SQS
               ``RequestThrottled`` (JSON protocol with the ``x-amzn-query-error`` header
               that maps it back to the query-protocol code, as SQS does)
``throttling`` 400 ``ThrottlingException`` (DynamoDB's request-rate error)
``500``        500 ``InternalServerError`` (SQS: ``InternalError``)
``503``        503 ``ServiceUnavailable``
``delay``      the real response, ``delay_ms`` later
=============  =========================================================================

A rule with ``after=True`` forwards the request first and *then* replaces the real answer by
the error: the ambiguous case (the conditional write happened, the caller cannot know). Every
client in wsfleet must re-read after an ambiguous failure rather than assume either outcome.

Rules match on service (``dynamodb``, ``sqs``, ``streams``), operation names, a table-name
substring and the listener label, fire with a probability drawn from one seeded RNG, and may
carry a ``budget`` (fire at most N times). They can be replaced at runtime over HTTP on any
listener (``/_faults``) or through a JSON rules file the proxy re-reads when it changes.

The proxy also **counts** every request it forwards by (label, service, operation, table),
with the items of batch writes and the bytes sent: it sees every call of every process, so it
is the simplest request-cost meter (see bench/).

With ``journal`` (``--journal PATH``), the proxy also appends one JSON line per forwarded
DynamoDB request (optionally only those touching a table whose name contains
``journal_table``): ``{"at", "label", "operation", "status", "request", "response"}`` with the
request and response bodies as parsed JSON. The scale model (bench/scale_record.py) reads
the partition key of every read and the bytes it returned from it; nothing else uses it.

Listeners and labels: one proxy can listen on several ports, one per *label* (e.g.
``worker`` and ``lambda``). All share the rules and the upstream; counts and rule matching are
per label, so the cost of the workers and of the Lambdas can be told apart.

Control API (JSON, on every listener)::

    GET    /_faults                 {"upstream", "seed", "rules": [...], "injected": {...}}
    PUT    /_faults                 body {"rules": [...], "seed"?: N}: replace the rules
    DELETE /_faults                 clear the rules
    PUT    /_faults/upstream        body {"url": "http://127.0.0.1:PORT"}
    GET    /_faults/stats           {"requests": [...], "injected": [...]}
    DELETE /_faults/stats           reset the counters

Example::

    with FaultProxy(upstream=backend.endpoint_url, labels=("worker",), seed=7) as proxy:
        proxy.set_rules([FaultRule(kind="throttle", service="dynamodb", probability=0.1)])
        env = {"AWS_ENDPOINT_URL": proxy.url_for("worker")}
        ...
        print(proxy.stats().total(service="dynamodb"))

``python -m bench.faults --upstream URL --labels worker,lambda`` runs it in the
foreground and prints ``{"url": ..., "urls": {label: url}}`` once it listens.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import gzip
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from wsfleet.exceptions import WsfleetError
from wsfleet_local.procs import Service, StopSignals, serve_until_stopped, spawn
from wsfleet_local.serving import ServerThread, call_json

__all__ = [
    "CONTROL_PREFIX",
    "FaultClient",
    "FaultError",
    "FaultKind",
    "FaultPlan",
    "FaultProxy",
    "FaultRule",
    "FaultyFleet",
    "ProxyProcess",
    "ProxyStats",
    "RequestInfo",
    "classify",
    "error_response",
    "main",
]

#: Where ``python -m bench.faults`` must run from: ``bench`` is a package of the repository.
REPO_ROOT = Path(__file__).resolve().parents[1]
CONTROL_PREFIX = "/_faults"
DEFAULT_LABEL = "default"
#: How often a rules file is checked for changes (on the request path, at most this often).
RULES_FILE_CHECK_SECONDS = 0.2
#: Upstream read timeout: above SQS's longest long poll (20 s).
UPSTREAM_TIMEOUT_SECONDS = 30.0
#: Request and response headers that belong to one hop, never forwarded.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade", "content-length", "host"}
)  # fmt: skip


class FaultError(WsfleetError):
    """A fault rule is invalid, or the proxy could not be started or reached."""


# =============================================================================================
# Pure core: what a request is, which rule fires, what the error looks like.
# =============================================================================================


class FaultKind(enum.StrEnum):
    THROTTLE = "throttle"
    THROTTLING = "throttling"
    ERROR_500 = "500"
    ERROR_503 = "503"
    DELAY = "delay"


@dataclass(frozen=True)
class RequestInfo:
    """What a request to the AWS endpoint is: service, operation, tables, items, protocol."""

    service: str  # dynamodb | sqs | streams | unknown
    operation: str
    tables: tuple[str, ...] = ()
    items: int = 0  # put/delete requests of a BatchWriteItem, keys of a BatchGetItem
    protocol: str = "json"  # json | query (SQS's older form-encoded protocol)
    size: int = 0


_TARGET_SERVICES = {
    "DynamoDB_20120810": "dynamodb",
    "DynamoDBStreams_20120810": "streams",
    "AmazonSQS": "sqs",
}


def classify(headers: Mapping[str, str], body: bytes) -> RequestInfo:
    """Identify an AWS request from its headers and body (JSON 1.0 or SQS query protocol).

    >>> info = classify({"X-Amz-Target": "DynamoDB_20120810.GetItem"},
    ...                 b'{"TableName": "t", "Key": {}}')
    >>> info.service, info.operation, info.tables, info.items, info.protocol, info.size
    ('dynamodb', 'GetItem', ('t',), 0, 'json', 29)
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    target = lowered.get("x-amz-target", "")
    if target:
        prefix, _, operation = target.partition(".")
        service = _TARGET_SERVICES.get(prefix, "unknown")
        tables, items = _json_tables(body) if service == "dynamodb" else ((), 0)
        return RequestInfo(service, operation, tables, items, "json", len(body))
    form = dict(parse_qsl(body.decode("utf-8", "replace"))) if body else {}
    if "Action" in form:
        return RequestInfo("sqs", form["Action"], (), 0, "query", len(body))
    return RequestInfo("unknown", "", (), 0, "json", len(body))


def _json_tables(body: bytes) -> tuple[tuple[str, ...], int]:
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        return (), 0
    if not isinstance(document, dict):
        return (), 0
    if isinstance(document.get("TableName"), str):
        return (document["TableName"],), 0
    requests = document.get("RequestItems")
    if isinstance(requests, dict):
        items = 0
        for value in requests.values():
            if isinstance(value, list):
                items += len(value)  # BatchWriteItem: put/delete requests
            elif isinstance(value, dict):
                items += len(value.get("Keys") or ())  # BatchGetItem
        return tuple(sorted(requests)), items
    transact = document.get("TransactItems")
    if isinstance(transact, list):
        names = {
            op.get("TableName")
            for entry in transact
            if isinstance(entry, dict)
            for op in entry.values()
            if isinstance(op, dict)
        }
        return tuple(sorted(n for n in names if isinstance(n, str))), len(transact)
    return (), 0


@dataclass(frozen=True, kw_only=True)
class FaultRule:
    """When to answer a request with an error instead of (or after) forwarding it.

    Empty matchers match everything. ``budget`` None: unlimited. ``label`` None: any listener.
    """

    kind: FaultKind = FaultKind.THROTTLE
    probability: float = 1.0
    service: str | None = None
    operations: frozenset[str] = frozenset()
    table: str | None = None  # substring of a table name the request touches
    label: str | None = None
    after: bool = False  # forward first, then answer with the error (the write landed)
    budget: int | None = None
    delay_ms: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))
        object.__setattr__(self, "operations", frozenset(self.operations))
        if not 0.0 <= self.probability <= 1.0:
            raise FaultError(f"probability must be in [0, 1], got {self.probability}")
        if self.budget is not None and self.budget < 0:
            raise FaultError("budget must be >= 0")
        if self.kind is FaultKind.DELAY and self.delay_ms <= 0:
            raise FaultError("a delay rule needs delay_ms > 0")
        if self.after and self.kind is FaultKind.DELAY:
            raise FaultError("after=True applies to error kinds only")

    def matches(self, info: RequestInfo, label: str) -> bool:
        if self.label is not None and self.label != label:
            return False
        if self.service is not None and self.service != info.service:
            return False
        if self.operations and info.operation not in self.operations:
            return False
        return self.table is None or any(self.table in name for name in info.tables)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultRule:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise FaultError(f"unknown fault rule fields: {sorted(unknown)}")
        values = dict(data)
        if "operations" in values:
            ops = values["operations"]
            values["operations"] = frozenset([ops] if isinstance(ops, str) else ops)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise FaultError(f"invalid fault rule {dict(data)!r}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        data["operations"] = sorted(self.operations)
        return data


@dataclass(frozen=True)
class Decision:
    """The rule that fired for one request (its index in the plan) and what it does."""

    index: int
    rule: FaultRule


class FaultPlan:
    """The active rules, their remaining budgets and one seeded RNG. Thread-safe.

    Rules are tried in order; the first that matches *and* wins its probability draw fires.
    With one seed and one request order the decisions are reproducible.

    >>> plan = FaultPlan([FaultRule(kind="500", budget=1)], seed=1)
    >>> info = RequestInfo("dynamodb", "PutItem")
    >>> [plan.decide(info, "w") is not None for _ in range(3)]
    [True, False, False]
    """

    def __init__(self, rules: Iterable[FaultRule] = (), *, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self.seed = seed
        self._rng = random.Random(seed)
        self._rules: list[FaultRule] = []
        self._left: list[int | None] = []
        self.fired: Counter[int] = Counter()
        self.replace(rules)

    def replace(self, rules: Iterable[FaultRule], *, seed: int | None = None) -> None:
        rules = list(rules)
        with self._lock:
            self._rules = rules
            self._left = [rule.budget for rule in rules]
            self.fired = Counter()
            if seed is not None:
                self.seed = seed
                self._rng = random.Random(seed)

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def decide(self, info: RequestInfo, label: str) -> Decision | None:
        with self._lock:
            for index, rule in enumerate(self._rules):
                if not rule.matches(info, label):
                    continue
                left = self._left[index]
                if left is not None and left <= 0:
                    continue
                if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                    continue
                if left is not None:
                    self._left[index] = left - 1
                self.fired[index] += 1
                return Decision(index, rule)
        return None

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {**rule.to_dict(), "fired": self.fired[i], "budget_left": self._left[i]}
                for i, rule in enumerate(self._rules)
            ]


#: (HTTP status, DynamoDB __type, SQS code) per error kind.
_ERRORS: dict[FaultKind, tuple[int, str, str]] = {
    FaultKind.THROTTLE: (
        400,
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "RequestThrottled",
    ),
    FaultKind.THROTTLING: (400, "com.amazon.coral.availability#ThrottlingException",
                           "ThrottlingException"),
    FaultKind.ERROR_500: (500, "com.amazon.coral.service#InternalServerError", "InternalError"),
    FaultKind.ERROR_503: (503, "com.amazon.coral.availability#ServiceUnavailableException",
                          "ServiceUnavailable"),
}  # fmt: skip
_MESSAGES = {
    FaultKind.THROTTLE: "The level of configured provisioned throughput for the table was "
    "exceeded. Consider increasing your provisioning level with the UpdateTable API.",
    FaultKind.THROTTLING: "Rate of requests exceeds the allowed throughput.",
    FaultKind.ERROR_500: "Internal server error (injected by bench.faults)",
    FaultKind.ERROR_503: "Service unavailable (injected by bench.faults)",
}


def error_response(kind: FaultKind, info: RequestInfo) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and body the real service sends for this error and protocol.

    >>> info = RequestInfo("sqs", "SendMessage")
    >>> status, headers, body = error_response(FaultKind.THROTTLE, info)
    >>> status, dict(headers)["x-amzn-query-error"]
    (400, 'RequestThrottled;Sender')
    """
    if kind is FaultKind.DELAY:
        raise FaultError("a delay is not an error")
    status, dynamodb_type, sqs_code = _ERRORS[kind]
    message = _MESSAGES[kind]
    request_id = f"wsfleet-fault-{random.getrandbits(48):012x}"
    fault_side = "Sender" if status < 500 else "Receiver"
    if info.service == "sqs" and info.protocol == "query":
        body = (
            f'<?xml version="1.0"?><ErrorResponse xmlns="http://queue.amazonaws.com/doc/'
            f'2012-11-05/"><Error><Type>{fault_side}</Type><Code>{sqs_code}</Code>'
            f"<Message>{message}</Message><Detail/></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>"
        ).encode()
        return status, [("Content-Type", "text/xml"), ("x-amzn-RequestId", request_id)], body
    if info.service == "sqs":
        document = {"__type": f"com.amazonaws.sqs#{sqs_code}", "message": message}
        headers = [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("x-amzn-RequestId", request_id),
            ("x-amzn-query-error", f"{sqs_code};{fault_side}"),
        ]
        return status, headers, json.dumps(document).encode()
    document = {"__type": dynamodb_type, "message": message}
    headers = [
        ("Content-Type", "application/x-amz-json-1.0"),
        ("x-amzn-RequestId", request_id),
        ("x-amzn-ErrorType", dynamodb_type.rsplit("#", 1)[-1]),
    ]
    return status, headers, json.dumps(document).encode()


# =============================================================================================
# Counters
# =============================================================================================


@dataclass
class ProxyStats:
    """Requests forwarded and faults injected, keyed by (label, service, operation, table).

    A request touching several tables (BatchWriteItem over two tables) counts once per table.
    """

    requests: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    items: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    bytes_sent: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    injected: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)  # .., kind

    def total(
        self,
        *,
        label: str | None = None,
        service: str | None = None,
        operation: str | None = None,
        table: str | None = None,
        what: str = "requests",
    ) -> int:
        """Sum of a counter over the keys matching the given parts (``table``: substring)."""
        counter: Counter[tuple[str, str, str, str]] = getattr(self, what)
        total = 0
        for (lab, svc, op, tab), value in counter.items():
            if label is not None and lab != label:
                continue
            if service is not None and svc != service:
                continue
            if operation is not None and op != operation:
                continue
            if table is not None and table not in tab:
                continue
            total += value
        return total

    def to_dict(self) -> dict[str, Any]:
        def rows(counter: Counter[tuple[str, str, str, str]], last: str) -> list[dict[str, Any]]:
            return [
                {"label": k[0], "service": k[1], "operation": k[2], last: k[3], "count": v}
                for k, v in sorted(counter.items())
            ]

        requests = [
            {**row, "items": self.items[key], "bytes": self.bytes_sent[key]}
            for key, row in zip(sorted(self.requests), rows(self.requests, "table"), strict=True)
        ]
        return {"requests": requests, "injected": rows(self.injected, "kind")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProxyStats:
        stats = cls()
        for row in data.get("requests", ()):
            key = (row["label"], row["service"], row["operation"], row["table"])
            stats.requests[key] += row["count"]
            stats.items[key] += row.get("items", 0)
            stats.bytes_sent[key] += row.get("bytes", 0)
        for row in data.get("injected", ()):
            stats.injected[(row["label"], row["service"], row["operation"], row["kind"])] += row[
                "count"
            ]
        return stats


# =============================================================================================
# The proxy (imperative shell)
# =============================================================================================


class FaultProxy(Service):
    """The proxy: one threaded HTTP listener per label, shared rules, upstream and counters.

    ``upstream`` may be None at start and set later (:meth:`set_upstream`): requests that
    arrive before get a 503 (retryable). Use as a context manager or call start()/stop().
    """

    def __init__(
        self,
        upstream: str | None = None,
        *,
        labels: Sequence[str] = (DEFAULT_LABEL,),
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        rules: Iterable[FaultRule] = (),
        rules_file: Path | str | None = None,
        journal: Path | str | None = None,
        journal_table: str | None = None,
    ) -> None:
        if not labels:
            raise FaultError("at least one label is needed")
        self.labels = tuple(labels)
        self.host = host
        self.port = port
        self.plan = FaultPlan(rules, seed=seed)
        self._upstream: tuple[str, int] | None = None
        self._upstream_url: str | None = None
        if upstream:
            self.set_upstream(upstream)
        self._stats = ProxyStats()
        self._stats_lock = threading.Lock()
        self._servers: dict[str, ServerThread] = {}
        self._local = threading.local()
        self.rules_file = Path(rules_file) if rules_file else None
        self._rules_mtime: float | None = None
        self._rules_checked = 0.0
        self._rules_lock = threading.Lock()
        self.journal_table = journal_table
        self._journal = open(journal, "a", encoding="utf-8") if journal else None  # noqa: SIM115
        self._journal_lock = threading.Lock()

    # -- configuration ------------------------------------------------------------------------
    def set_upstream(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise FaultError(f"upstream must be an http:// URL, got {url!r}")
        self._upstream = (parts.hostname, parts.port or 80)
        self._upstream_url = f"http://{parts.hostname}:{parts.port or 80}"

    @property
    def upstream(self) -> str | None:
        return self._upstream_url

    def set_rules(self, rules: Iterable[FaultRule], *, seed: int | None = None) -> None:
        self.plan.replace(rules, seed=seed)

    def clear_rules(self) -> None:
        self.plan.replace(())

    def stats(self) -> ProxyStats:
        """A copy of the counters."""
        with self._stats_lock:
            return ProxyStats(
                Counter(self._stats.requests),
                Counter(self._stats.items),
                Counter(self._stats.bytes_sent),
                Counter(self._stats.injected),
            )

    def reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = ProxyStats()

    def url_for(self, label: str = DEFAULT_LABEL) -> str:
        server = self._servers.get(label)
        if server is None:
            raise FaultError(f"no listener labelled {label!r} (labels: {self.labels})")
        return f"http://{server.host}:{server.port}"

    @property
    def url(self) -> str:
        """The first listener's URL."""
        return self.url_for(self.labels[0])

    def urls(self) -> dict[str, str]:
        return {label: self.url_for(label) for label in self.labels}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Self:
        for index, label in enumerate(self.labels):
            port = self.port if index == 0 else 0
            server = ThreadingHTTPServer((self.host, port), _make_handler(self, label))
            self._servers[label] = ServerThread(server, name=f"fault-proxy-{label}").start()
        return self

    def stop(self) -> None:
        """Stop every listener. Safe to call twice."""
        servers, self._servers = self._servers, {}
        for server in servers.values():
            server.stop()
        journal, self._journal = self._journal, None
        if journal is not None:
            with self._journal_lock:
                journal.close()

    # -- request path -------------------------------------------------------------------------
    def _maybe_reload_rules(self) -> None:
        if self.rules_file is None:
            return
        now = time.monotonic()
        if now - self._rules_checked < RULES_FILE_CHECK_SECONDS:
            return
        with self._rules_lock:
            self._rules_checked = now
            try:
                mtime = self.rules_file.stat().st_mtime
            except OSError:
                return
            if mtime == self._rules_mtime:
                return
            self._rules_mtime = mtime
            try:
                document = json.loads(self.rules_file.read_text(encoding="utf-8") or "{}")
                rules, seed = _parse_rules_document(document)
            except (OSError, ValueError, FaultError) as exc:
                print(f"fault proxy: ignoring rules file: {exc}", file=sys.stderr)
                return
            self.plan.replace(rules, seed=seed)

    def _record(self, label: str, info: RequestInfo, kind: FaultKind | None) -> None:
        tables = info.tables or ("",)
        with self._stats_lock:
            for table in tables:
                key = (label, info.service, info.operation, table)
                self._stats.requests[key] += 1
                self._stats.items[key] += info.items
                self._stats.bytes_sent[key] += info.size
            if kind is not None:
                self._stats.injected[(label, info.service, info.operation, kind.value)] += 1

    def _journal_entry(
        self,
        label: str,
        info: RequestInfo,
        body: bytes,
        status: int,
        headers: Sequence[tuple[str, str]],
        payload: bytes,
    ) -> None:
        """Append one forwarded DynamoDB request and its answer to the journal, if kept."""
        journal = self._journal
        if journal is None or info.service != "dynamodb":
            return
        if self.journal_table is not None and not any(
            self.journal_table in table for table in info.tables
        ):
            return
        if any(k.lower() == "content-encoding" and "gzip" in v.lower() for k, v in headers):
            with contextlib.suppress(OSError, EOFError):
                payload = gzip.decompress(payload)
        entry = {
            "at": time.time(),
            "label": label,
            "operation": info.operation,
            "status": status,
            "request": _json_or_none(body),
            "response": _json_or_none(payload),
        }
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._journal_lock:
            if self._journal is not None:
                self._journal.write(line)
                self._journal.flush()

    def _connection(self) -> http.client.HTTPConnection:
        assert self._upstream is not None
        connection: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if connection is None or getattr(self._local, "target", None) != self._upstream:
            if connection is not None:
                connection.close()
            host, port = self._upstream
            connection = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_SECONDS)
            connection.connect()
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = connection
            self._local.target = self._upstream
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "conn", None)
        if connection is not None:
            connection.close()
        self._local.conn = None

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request upstream on this thread's keep-alive connection; the full reply."""
        if self._upstream is None:
            raise ConnectionRefusedError("no upstream configured yet")
        host, port = self._upstream
        out_headers = [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS]
        out_headers.append(("Host", f"{host}:{port}"))
        out_headers.append(("Content-Length", str(len(body))))
        for attempt in (1, 2):
            connection = self._connection()
            try:
                connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in out_headers:
                    connection.putheader(name, value)
                connection.endheaders(body)
                response = connection.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server had closed: retry once on a fresh one.
                self._drop_connection()
                if attempt == 2:
                    raise
                continue
            except Exception:
                self._drop_connection()
                raise
            reply_headers = [
                (k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS
            ]
            if response.will_close:
                self._drop_connection()
            return response.status, reply_headers, payload
        raise AssertionError("unreachable")


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _parse_rules_document(document: Any) -> tuple[list[FaultRule], int | None]:
    """``[rule, ...]`` or ``{"rules": [...], "seed": N}``; anything else (it may come from an
    HTTP body) is a :class:`FaultError`, answered 400."""
    usage = "rules must be a list of rule objects or {'rules': [...], 'seed': N}"
    raw_rules, seed = document, None
    if isinstance(document, dict):
        raw_rules, seed = document.get("rules", []), document.get("seed")
    if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
        raise FaultError(usage)
    try:
        seed = int(seed) if seed is not None else None
    except (TypeError, ValueError, OverflowError):
        raise FaultError(f"seed must be an integer, got {seed!r}") from None
    return [FaultRule.from_dict(r) for r in raw_rules], seed


def _make_handler(proxy: FaultProxy, label: str) -> type[BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        pass

    Handler.proxy = proxy
    Handler.label = label
    return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    """One client connection (keep-alive): each request is a control call or forwarded."""

    protocol_version = "HTTP/1.1"
    #: Headers and body go out in two writes; with Nagle on, the second waits for the
    #: client's delayed ACK (40 ms on Linux) on every request.
    disable_nagle_algorithm = True
    proxy: FaultProxy
    label: str

    def log_message(self, format: str, *args: Any) -> None:  # stdlib's signature names it format
        return  # quiet: thousands of requests per second

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _reply(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        try:
            body = self._read_body()
        except ValueError:  # a Content-Length or chunk size that is not a number
            self.close_connection = True  # the rest of the stream cannot be framed
            self._json(400, {"error": "malformed Content-Length or chunk size"})
            return
        if self.path.startswith(CONTROL_PREFIX):
            self._control(body)
            return
        proxy = self.proxy
        proxy._maybe_reload_rules()
        info = classify(dict(self.headers.items()), body)
        decision = proxy.plan.decide(info, self.label)
        rule = decision.rule if decision else None
        if rule is not None and rule.kind is not FaultKind.DELAY and not rule.after:
            proxy._record(self.label, info, rule.kind)
            self._reply(*error_response(rule.kind, info))
            return
        try:
            status, headers, payload = proxy.forward(
                self.command, self.path, list(self.headers.items()), body
            )
        except (OSError, http.client.HTTPException) as exc:
            proxy._record(self.label, info, None)
            message = json.dumps({"__type": "ProxyUpstreamError", "message": str(exc)}).encode()
            self._reply(502, [("Content-Type", "application/x-amz-json-1.0")], message)
            return
        proxy._record(self.label, info, rule.kind if rule else None)
        proxy._journal_entry(self.label, info, body, status, headers, payload)
        if rule is not None and rule.kind is FaultKind.DELAY:
            time.sleep(rule.delay_ms / 1000)
        elif rule is not None:  # after=True: the request was applied; the caller sees an error
            self._reply(*error_response(rule.kind, info))
            return
        self._reply(status, headers, payload)

    def _control(self, body: bytes) -> None:
        proxy = self.proxy
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            document = json.loads(body) if body else {}
            result = self._control_route(proxy, self.command, path, document)
        except (ValueError, FaultError) as exc:
            self._json(400, {"error": str(exc)})
            return
        if result is None:
            self._json(404, {"error": f"no such endpoint: {self.command} {path}"})
            return
        self._json(200, result)

    @staticmethod
    def _control_route(
        proxy: FaultProxy, method: str, path: str, document: Any
    ) -> dict[str, Any] | None:
        state = {
            "upstream": proxy.upstream,
            "seed": proxy.plan.seed,
            "labels": list(proxy.labels),
        }
        match method, path:
            case "GET", "/_faults":
                return {**state, "rules": proxy.plan.describe()}
            case ("PUT" | "POST"), "/_faults":
                rules, seed = _parse_rules_document(document)
                proxy.set_rules(rules, seed=seed)
                return {**state, "seed": proxy.plan.seed, "rules": proxy.plan.describe()}
            case "DELETE", "/_faults":
                proxy.clear_rules()
                return {**state, "rules": []}
            case ("PUT" | "POST"), "/_faults/upstream":
                if not isinstance(document, dict):
                    raise FaultError('the body must be {"url": "http://host:port"}')
                proxy.set_upstream(str(document.get("url", "")))
                return {**state, "upstream": proxy.upstream}
            case "GET", "/_faults/stats":
                return proxy.stats().to_dict()
            case "DELETE", "/_faults/stats":
                proxy.reset_stats()
                return {"reset": True}
        return None

    def _json(self, status: int, payload: Any) -> None:
        self._reply(status, [("Content-Type", "application/json")], json.dumps(payload).encode())

    # http.server dispatches on do_<METHOD>.
    do_POST = _handle
    do_GET = _handle
    do_PUT = _handle
    do_DELETE = _handle
    do_HEAD = _handle


# =============================================================================================
# Remote control from another process
# =============================================================================================


class FaultClient:
    """Control a proxy running in another process over its ``/_faults`` endpoints.

    >>> client = FaultClient("http://127.0.0.1:4567")                  # doctest: +SKIP
    >>> client.set_rules([FaultRule(kind="503", service="sqs", probability=0.05)])  # doctest: +SKIP
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        def failed(status: int | None, reason: str, body: bytes) -> FaultError:
            detail = f"{status} {body[:200]!r}" if status is not None else reason
            return FaultError(f"{method} {path}: {detail}")

        return call_json(method, self.url + path, payload, timeout=self.timeout, failed=failed)

    def state(self) -> dict[str, Any]:
        return dict(self._call("GET", CONTROL_PREFIX))

    def set_rules(self, rules: Iterable[FaultRule], *, seed: int | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"rules": [rule.to_dict() for rule in rules]}
        if seed is not None:
            payload["seed"] = seed
        return dict(self._call("PUT", CONTROL_PREFIX, payload))

    def clear_rules(self) -> None:
        self._call("DELETE", CONTROL_PREFIX)

    def set_upstream(self, url: str) -> None:
        self._call("PUT", f"{CONTROL_PREFIX}/upstream", {"url": url})

    def stats(self) -> ProxyStats:
        return ProxyStats.from_dict(self._call("GET", f"{CONTROL_PREFIX}/stats"))

    def reset_stats(self) -> None:
        self._call("DELETE", f"{CONTROL_PREFIX}/stats")


# =============================================================================================
# The proxy as a child process, and a local fleet whose workers go through it
# =============================================================================================


class ProxyProcess(Service):
    """``python -m bench.faults`` as a child of this process (dies with it).

    A child keeps the proxy's threads off the caller's GIL, so a benchmark driver polling
    the simulator does not slow the workers' DynamoDB calls down.
    """

    def __init__(
        self,
        upstream: str | None = None,
        *,
        labels: Sequence[str] = (DEFAULT_LABEL,),
        seed: int = 0,
        log_path: Path | None = None,
        journal: Path | None = None,
        journal_table: str | None = None,
    ) -> None:
        self._argv = [sys.executable, "-m", "bench.faults", "--labels", ",".join(labels),
                      "--seed", str(seed), "--exit-on-stdin-eof"]  # fmt: skip
        if upstream:
            self._argv += ["--upstream", upstream]
        if journal is not None:
            self._argv += ["--journal", str(journal)]
        if journal_table:
            self._argv += ["--journal-table", journal_table]
        self._log_path = log_path
        self._child: Any = None
        self.urls: dict[str, str] = {}

    def start(self) -> Self:
        # ``-m bench.faults`` resolves from the repository root, where ``bench`` is a package.
        self._child = spawn(
            "fault proxy",
            self._argv,
            log_path=self._log_path,
            stdin_pipe=True,
            capture_stdout=True,
            cwd=REPO_ROOT,
        )
        ready = self._child.read_json_line(30.0)
        self.urls = dict(ready["urls"])
        return self

    @property
    def url(self) -> str:
        return next(iter(self.urls.values()))

    def url_for(self, label: str) -> str:
        return self.urls[label]

    def client(self) -> FaultClient:
        return FaultClient(self.url)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.close_stdin()
        child.stop(signal.SIGTERM, 5)


class FaultyFleet(Service):
    """A :class:`~wsfleet_local.fleet.LocalFleet` whose workers reach DynamoDB and SQS through
    a fault proxy (label ``worker``), for the chaos suite and the benchmarks.

    Built on LocalFleet's public API only: the fleet starts with no worker, the proxy is
    pointed at the fleet's backend once it exists, then the workers are added; every worker
    (restarts included) gets ``AWS_ENDPOINT_URL`` = the proxy. The Lambdas and the Streams
    poller talk to the backend directly (LocalFleet has no hook for their endpoint yet).

    Example::

        with FaultyFleet(workers=3, seed=7, timings=FleetTimings()) as faulty:
            faulty.faults.set_rules([FaultRule(kind="throttle", probability=0.05)])
            faulty.fleet.kill_worker(0)
            print(faulty.faults.stats().total(service="dynamodb"))
    """

    LABEL = "worker"

    def __init__(self, *, workers: int = 3, seed: int = 0, **fleet_options: Any) -> None:
        self.worker_count = workers
        self.seed = seed
        self._fleet_options = fleet_options
        self.proxy: ProxyProcess | None = None
        self._fleet: Any = None

    @property
    def fleet(self) -> Any:
        if self._fleet is None:
            raise FaultError("the fleet is not started")
        return self._fleet

    @property
    def faults(self) -> FaultClient:
        if self.proxy is None:
            raise FaultError("the fleet is not started")
        return self.proxy.client()

    def start(self) -> Self:
        from wsfleet_local.fleet import LocalFleet

        options = dict(self._fleet_options)
        run_dir = options.pop("run_dir", None)
        extra = dict(options.pop("extra_worker_env", None) or {})
        try:
            self.proxy = ProxyProcess(labels=(self.LABEL,), seed=self.seed).start()
            extra["AWS_ENDPOINT_URL"] = self.proxy.url_for(self.LABEL)
            self._fleet = LocalFleet(workers=0, run_dir=run_dir, extra_worker_env=extra, **options)
            self._fleet.start()
            self.faults.set_upstream(self._fleet.endpoint_url)
            for _ in range(self.worker_count):
                self._fleet.add_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Drain and stop the fleet, then the proxy. Safe to call twice."""
        fleet, self._fleet = self._fleet, None
        try:
            if fleet is not None:
                fleet.stop()
        finally:
            proxy, self.proxy = self.proxy, None
            if proxy is not None:
                proxy.stop()


# =============================================================================================
# Command line
# =============================================================================================


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--upstream", help="http://host:port of the AWS endpoint (or set later)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port of the first listener")
    parser.add_argument("--labels", default=DEFAULT_LABEL, help="comma list, one listener each")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("WSFLEET_FAULT_SEED", 0)))
    parser.add_argument("--rules-file", help="JSON rules file, re-read when it changes")
    parser.add_argument("--rules", help="JSON rules (list or {'rules': [...]})")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)"
    )
    parser.add_argument("--journal", help="append every DynamoDB request + answer (JSON lines)")
    parser.add_argument("--journal-table", help="journal only requests to tables containing this")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy in the foreground until SIGTERM/SIGINT (or stdin EOF when asked)."""
    args = _parse_args(argv)
    rules: list[FaultRule] = []
    seed = args.seed
    if args.rules:
        rules, given_seed = _parse_rules_document(json.loads(args.rules))
        seed = given_seed if given_seed is not None else seed
    labels = [label.strip() for label in args.labels.split(",") if label.strip()]
    proxy = FaultProxy(
        args.upstream, labels=labels, host=args.host, port=args.port, seed=seed, rules=rules,
        rules_file=args.rules_file, journal=args.journal, journal_table=args.journal_table,
    )  # fmt: skip
    with StopSignals() as stop, proxy:
        serve_until_stopped(
            {"url": proxy.url, "urls": proxy.urls()}, stop, exit_on_stdin_eof=args.exit_on_stdin_eof
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
