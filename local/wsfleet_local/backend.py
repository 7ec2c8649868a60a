"""Embedded local AWS backend: moto in server mode, made safe for racing conditional writes.

wsfleet's correctness rests on DynamoDB conditional writes: when 32 workers race for one lease,
exactly one may win. moto's stock threaded server (``moto_server``, ``ThreadedMotoServer``)
serves requests on many threads against unsynchronised in-memory backends, so racing
conditional updates can each see the item before any of them writes it (measured with moto
5.2: rounds with 2-3 winners, and an occasional HTTP 500 "dictionary changed size during
iteration"). A single-threaded server is atomic but then one SQS long poll (up to 20 s)
stalls every other caller.

This module keeps the threads and serialises the backend instead:

* every request runs under one global lock (:class:`SerializedMotoApp`), which makes each
  API call atomic, as it is on AWS;
* an SQS ``ReceiveMessage`` long poll is the one exception: moto serves it as scans of the
  queue with a wait in between, and that wait is made to release the lock until an SQS
  write lands (or 100 ms pass), so each scan is atomic and a waiting
  poll blocks nobody;
* connections are kept alive (werkzeug's dev server closes each one after a response), so
  a boto3 call costs no TCP handshake and no new server thread.

moto's own cost dominates: a conditional UpdateItem takes ~5 ms of server CPU in moto 5.2
(a GetItem ~3 ms), and the GIL makes the server one core's worth of Python, so it peaks near
200 such calls/s on an idle core however many clients it has (fewer on a busy machine).

:class:`EmbeddedBackend` runs that server in a child process (moto's global state then
dies with it, and a hung test cannot wedge the server) and creates the stack's tables and
queues from ``template.yaml`` itself, so local resources cannot drift from the deployed
ones. Command line::

    python -m wsfleet_local.backend [--host 127.0.0.1] [--port 0] [--create-resources PREFIX]
                                    [--seed-samples]

prints one JSON line (``{"endpoint_url": ...}`` plus ``"env"``/``"resources"`` when asked)
to stdout once the server listens, then serves until SIGTERM/SIGINT
(:func:`wsfleet_local.procs.serve_until_stopped`, which every local child uses).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml

from wsfleet.exceptions import WsfleetError

from .procs import (
    ChildFailed,
    ChildProcess,
    Service,
    StopSignals,
    serve_until_stopped,
    spawn,
)
from .serving import ServerThread
from .stack import StackResolver, Unresolvable, cfn_string

__all__ = [
    "HEALTH_PATH",
    "BackendError",
    "EmbeddedBackend",
    "Resources",
    "SerializedMotoApp",
    "TemplateError",
    "find_template",
    "load_template",
    "local_client",
    "main",
    "provision_resources",
    "serve",
]

logger = logging.getLogger(__name__)

#: Answered by the wrapper itself (never reaches moto): the readiness probe.
HEALTH_PATH = "/_wsfleet/health"

DEFAULT_REGION = "us-east-1"
#: moto accepts any credentials; these keep boto3 from looking for real ones.
LOCAL_ACCESS_KEY = "testing"
LOCAL_SECRET_KEY = "testing"

#: A waiting long poll re-scans its queue at once when an SQS write lands (see
#: SerializedMotoApp) and otherwise every this often, for messages that become visible by
#: themselves (DelaySeconds, an expired visibility timeout).
LONG_POLL_INTERVAL_SECONDS = 0.1

#: How long start() waits for the child's ready line (cold moto imports take 1-3 s).
START_TIMEOUT_SECONDS = 60.0
#: How long stop() waits after SIGTERM before it SIGKILLs the child.
STOP_TIMEOUT_SECONDS = 10.0

TABLE_TYPE = "AWS::DynamoDB::Table"
QUEUE_TYPE = "AWS::SQS::Queue"

#: Logical ids the rest of wsfleet relies on, mapped onto Resources fields.
CONNECTIONS_TABLE_ID = "ConnectionsTable"
MESSAGES_TABLE_ID = "MessagesTable"
HINT_QUEUE_ID = "HintQueue"
HINT_DLQ_ID = "HintDeadLetterQueue"


class BackendError(WsfleetError):
    """The embedded backend could not be started, reached or provisioned."""


class TemplateError(BackendError):
    """template.yaml holds something the local provisioner cannot turn into resources."""


# =============================================================================================
# The server: moto behind one lock, released while a long poll waits.
# =============================================================================================

WSGIEnviron = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[WSGIEnviron, StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class _Reply:
    """A fully materialised WSGI response, so nothing of moto runs after the lock is released."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


def _materialise(app: WSGIApp, environ: WSGIEnviron) -> _Reply:
    """Run a WSGI app to completion: status, headers and the whole body."""
    captured: dict[str, Any] = {}
    chunks: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        captured["status"], captured["headers"] = status, headers
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return _Reply(captured["status"], captured["headers"], b"".join(chunks))


def _read_body(environ: WSGIEnviron) -> bytes:
    """Read the request body and put an identical, re-readable stream back in its place."""
    stream = environ["wsgi.input"]
    body: bytes
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > 0:
        body = stream.read(length)
    elif environ.get("wsgi.input_terminated"):  # chunked: werkzeug's stream ends at the body end
        body = stream.read()
    else:
        body = b""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body


def _is_sqs_request(environ: WSGIEnviron) -> bool:
    """An SQS call in either protocol (JSON target, or a query-protocol form post)."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        return target.startswith("AmazonSQS.")
    return environ.get("REQUEST_METHOD") == "POST" and environ.get("CONTENT_TYPE", "").startswith(
        "application/x-www-form-urlencoded"
    )


class _Dispatcher(Protocol):
    """moto's DomainDispatcherApplication as used here: routes a request to a service's app."""

    def get_application(self, environ: WSGIEnviron) -> WSGIApp: ...


class SerializedMotoApp:
    """WSGI middleware: each request runs alone against moto; long polls wait outside the lock.

    Holding one lock per request is what makes a conditional write atomic (moto's backends
    are plain dicts). The response is read to the end inside the lock, because WSGI bodies
    may be lazy. Picking moto's per-service app (routing, thread-safe on its own) happens
    before the lock, so the lock covers moto's work only.

    moto serves an SQS long poll itself (both wire protocols, the queue's default wait, the
    20 s cap): it scans the queue and, finding nothing, calls ``Queue.wait_for_messages``
    between scans. Making an app replaces that one method (process-wide): it releases the lock,
    sleeps until an SQS write lands or the poll interval passes, and takes the lock back, so
    every scan is atomic and a waiting poll blocks nobody.

    Example (in-process; :func:`serve` does this for you)::

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        app = SerializedMotoApp(DomainDispatcherApplication(create_backend_app))
    """

    def __init__(
        self,
        dispatcher: _Dispatcher,
        *,
        poll_interval_seconds: float = LONG_POLL_INTERVAL_SECONDS,
    ) -> None:
        from moto.sqs.models import Queue

        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._poll_interval_seconds = poll_interval_seconds
        # Bumped after every SQS request, so a waiting long poll re-scans right after a send
        # (or a message made visible again) instead of spinning: idle workers cost nearly nothing.
        self._sqs_changed = threading.Condition()
        self._sqs_generation = 0

        wait_unlocked = self._wait_unlocked

        # Named as moto names it (``self`` is the Queue), so it types as the method it replaces.
        def wait_for_messages(self: Queue, timeout: float) -> None:
            wait_unlocked(timeout)

        # moto calls it between two scans of a long poll, with our lock held (in __call__).
        # Without it (another moto), a long poll would hold the lock for its whole wait.
        if not callable(getattr(Queue, "wait_for_messages", None)):
            raise BackendError("moto.sqs Queue has no wait_for_messages to release the lock in")
        # The patch is process-wide: a second app would make the first one's long polls
        # release (and take back) the second one's lock.
        if getattr(Queue, "_wsfleet_serialized", False):
            raise BackendError("one SerializedMotoApp per process (it patches moto's Queue)")
        Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]
        Queue._wsfleet_serialized = True  # type: ignore[attr-defined]

    def __call__(self, environ: WSGIEnviron, start_response: StartResponse) -> list[bytes]:
        if environ.get("PATH_INFO") == HEALTH_PATH:
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
            return [b"ok"]
        service_app = self._dispatcher.get_application(environ)
        with self._lock:
            reply = _materialise(service_app, environ)
        if _is_sqs_request(environ):
            with self._sqs_changed:
                self._sqs_generation += 1
                self._sqs_changed.notify_all()
        start_response(reply.status, reply.headers)
        return [reply.body]

    def _wait_unlocked(self, timeout: float) -> None:
        """Wait for an SQS write without the lock. The generation is read before the lock is
        released, so a write that lands in between still ends the wait."""
        generation = self._sqs_generation
        self._lock.release()
        try:
            with self._sqs_changed:
                self._sqs_changed.wait_for(
                    lambda: self._sqs_generation != generation,
                    timeout=min(self._poll_interval_seconds, timeout),
                )
        finally:
            self._lock.acquire()


_NO_BODY_STATUSES = frozenset({204, 304})


def _keep_alive_request_handler() -> type[Any]:
    """moto's request handler, with keep-alive connections and without per-request log lines.

    werkzeug's dev server closes every connection after one response (it drains unread
    request bytes, which would eat a pipelined next request), so each boto3 call would pay
    a TCP handshake and a new server thread. This handler reads each request body whole
    before the app runs, so the stream always ends where the next request begins, and sends
    each fully built response with a Content-Length: the connection can stay open.
    Errors are still logged; the per-request access line is not.
    """
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class KeepAliveMotoRequestHandler(MotoRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        wbufsize = 64 * 1024  # headers and body leave in one send (flushed per request)

        def run_wsgi(self) -> None:
            if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            self.environ = environ = self.make_environ()
            _read_body(environ)
            failed = False
            try:
                reply = _materialise(self.server.app, environ)
            except Exception:
                logger.exception("error on %s %s", self.command, self.path)
                reply = _Reply("500 INTERNAL SERVER ERROR", [], b"internal error")
                failed = True
            code, _, reason = reply.status.partition(" ")
            self.send_response(int(code), reason)
            names: set[str] = set()
            for name, value in reply.headers:
                if name.lower() not in ("connection", "transfer-encoding"):
                    self.send_header(name, value)
                    names.add(name.lower())
            if "content-length" not in names and int(code) not in _NO_BODY_STATUSES:
                self.send_header("Content-Length", str(len(reply.body)))
            if failed:
                self.send_header("Connection", "close")  # http.server then closes the socket
            self.end_headers()
            if self.command != "HEAD" and reply.body:
                self.wfile.write(reply.body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            return None

    return KeepAliveMotoRequestHandler


def _warm_up(dispatcher: Any) -> None:
    """Build the Flask apps wsfleet uses now, so the first real call is not a 0.5 s outlier."""
    from moto.moto_server.werkzeug_app import create_backend_app

    for service in ("dynamodb", "dynamodbstreams", "sqs"):
        if service not in dispatcher.app_instances:
            dispatcher.app_instances[service] = create_backend_app(service)


def serve(host: str = "127.0.0.1", port: int = 0) -> ServerThread:
    """Serve moto (serialised, see :class:`SerializedMotoApp`) on a daemon thread of this process.

    Returns it bound but not started: ``with serve() as server:`` serves (``server.port`` is
    the bound port) until the block ends. The moto state is this process's global state;
    prefer :class:`EmbeddedBackend` unless you need everything in one process.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    dispatcher = DomainDispatcherApplication(create_backend_app)
    _warm_up(dispatcher)
    server = make_server(
        host,
        port,
        SerializedMotoApp(dispatcher),
        threaded=True,
        request_handler=_keep_alive_request_handler(),
    )
    return ServerThread(server, name="wsfleet-backend")


# =============================================================================================
# The template: CloudFormation YAML -> table and queue definitions (pure).
# =============================================================================================


class _CfnLoader(yaml.SafeLoader):
    """A SafeLoader that reads CloudFormation short-form tags as their long JSON form."""


def _construct_intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _construct_intrinsic)


def load_template(path: Path) -> dict[str, Any]:
    """Parse a CloudFormation/SAM YAML template; ``!Ref X`` becomes ``{"Ref": "X"}`` and so on.

    Example::

        >>> template = load_template(find_template())
        >>> template["Resources"]["ConnectionsTable"]["Type"]
        'AWS::DynamoDB::Table'
    """
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_CfnLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"cannot read template {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path} has no Resources section")
    return document


def find_template() -> Path:
    """The repository's template.yaml: $WSFLEET_TEMPLATE if set, else the nearest one above here.

    Example::

        >>> find_template().name
        'template.yaml'
    """
    override = os.environ.get("WSFLEET_TEMPLATE")
    if override:
        path = Path(override)
        if not path.is_file():
            raise TemplateError(f"WSFLEET_TEMPLATE={override} is not a file")
        return path
    for directory in Path(__file__).resolve().parents:
        candidate = directory / "template.yaml"
        if candidate.is_file():
            return candidate
    raise TemplateError(f"no template.yaml above {Path(__file__).parent}; set WSFLEET_TEMPLATE")


def _referenced_ids(value: Any) -> set[str]:
    """Logical ids a property value points at through Ref, GetAtt or Sub."""
    found: set[str] = set()
    if isinstance(value, list):
        for item in value:
            found |= _referenced_ids(item)
    elif isinstance(value, dict):
        for key, argument in value.items():
            if key == "Ref" and isinstance(argument, str):
                found.add(argument)
            elif key == "Fn::GetAtt":
                found.add(argument[0] if isinstance(argument, list) else argument.split(".")[0])
            elif key == "Fn::Sub":
                text = argument if isinstance(argument, str) else argument[0]
                found |= {m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)}
                if not isinstance(argument, str):
                    found |= _referenced_ids(argument[1:])
            else:
                found |= _referenced_ids(argument)
    return found


def _creation_order(resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Logical ids in an order where every resource comes after the ones it refers to."""
    graph = {
        logical_id: _referenced_ids(definition.get("Properties") or {}) & resources.keys()
        for logical_id, definition in resources.items()
    }
    try:
        return list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise TemplateError(f"circular reference through {exc.args[1][0]}") from exc


_INDEX_KEYS = ("IndexName", "KeySchema", "Projection", "ProvisionedThroughput")


def _table_request(name: str, properties: Mapping[str, Any]) -> dict[str, Any]:
    """CreateTable arguments from AWS::DynamoDB::Table properties (resolved).

    Properties moto has no use for locally (SSE, PITR, tags, contributor insights, the
    template's own TableName) are left out; TTL is applied by a separate call.
    """
    request: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": properties["AttributeDefinitions"],
        "KeySchema": properties["KeySchema"],
        "BillingMode": properties.get("BillingMode", "PROVISIONED"),
    }
    if "ProvisionedThroughput" in properties:
        request["ProvisionedThroughput"] = properties["ProvisionedThroughput"]
    for indexes in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
        if properties.get(indexes):
            request[indexes] = [
                {key: index[key] for key in _INDEX_KEYS if key in index}
                for index in properties[indexes]
            ]
    stream = properties.get("StreamSpecification")
    if stream and stream.get("StreamViewType"):
        request["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": stream["StreamViewType"],
        }
    return request


_QUEUE_ATTRIBUTES = (
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "DelaySeconds",
    "FifoQueue",
    "FifoThroughputLimit",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "RedriveAllowPolicy",
    "RedrivePolicy",
    "VisibilityTimeout",
)


def _queue_attributes(properties: Mapping[str, Any]) -> dict[str, str]:
    """CreateQueue attributes from AWS::SQS::Queue properties (resolved), as SQS strings."""
    return {
        key: json.dumps(value) if isinstance(value, dict) else cfn_string(value)
        for key, value in properties.items()
        if key in _QUEUE_ATTRIBUTES
    }


_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
_SQS_MAX_NAME_LENGTH = 80


def _physical_name(prefix: str, logical_id: str, *, fifo: bool = False) -> str:
    name = f"{prefix}-{logical_id}" + (".fifo" if fifo else "")
    if len(name) > _SQS_MAX_NAME_LENGTH:
        raise ValueError(f"prefix {prefix!r} is too long: {name!r} exceeds 80 characters")
    return name


# =============================================================================================
# Provisioning over HTTP (boto3).
# =============================================================================================


@dataclass(frozen=True)
class Resources:
    """The stack's tables and queues as created on a local endpoint.

    ``tables``/``queues`` map every AWS::DynamoDB::Table / AWS::SQS::Queue of the template by
    logical id (table names / queue URLs), including any the named fields do not cover;
    ``attributes`` holds what ``!GetAtt`` returns for each, keyed ``"LogicalId.Attribute"``
    (the ARNs as the backend reported them: nobody needs to format one).

    Example::

        >>> resources = backend.create_resources("docs1")  # backend: a running EmbeddedBackend
        >>> resources.connections_table
        'docs1-ConnectionsTable'
        >>> resources.env()["CONNECTIONS_TABLE"]  # with AWS_ENDPOINT_URL, HINT_QUEUE_URL, ...
        'docs1-ConnectionsTable'
    """

    endpoint_url: str
    region: str
    connections_table: str
    messages_table: str
    hint_queue_url: str
    hint_dlq_url: str
    stream_arn: str  # ConnectionsTable's LatestStreamArn
    tables: dict[str, str]
    queues: dict[str, str]
    attributes: dict[str, str] = field(default_factory=dict)

    def get_att(self) -> dict[tuple[str, str], str]:
        """``attributes`` keyed ``(logical_id, attribute)``, as StackResolver takes them."""
        return {
            (logical_id, attribute): value
            for key, value in self.attributes.items()
            for logical_id, attribute in [key.split(".", 1)]
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point wsfleet code (and boto3) at these resources."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "CONNECTIONS_TABLE": self.connections_table,
            "MESSAGES_TABLE": self.messages_table,
            "HINT_QUEUE_URL": self.hint_queue_url,
        }


def local_client(service: str, endpoint_url: str, region: str = DEFAULT_REGION) -> Any:
    """A boto3 client for ``service`` on a local endpoint: the local dummy credentials, an own
    session (so the caller's environment and profile play no part) and wsfleet's
    :func:`~wsfleet.aws.client_config` (timeouts, "standard" retries).

    Example::

        >>> resources = backend.create_resources("docs2")
        >>> names = local_client("dynamodb", resources.endpoint_url).list_tables()["TableNames"]
        >>> sorted(name for name in names if name.startswith("docs2-"))
        ['docs2-ConnectionsTable', 'docs2-MessagesTable']
    """
    import boto3

    from wsfleet.aws import client_config

    session = boto3.session.Session(
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
        region_name=region,
    )
    # boto3-stubs overloads client() per literal service name, with no fallback for a plain str.
    return session.client(service, endpoint_url=endpoint_url, config=client_config())  # type: ignore[call-overload]


def provision_resources(
    endpoint_url: str,
    prefix: str,
    *,
    region: str = DEFAULT_REGION,
    template_path: Path | None = None,
) -> Resources:
    """Create every table and queue of the template on ``endpoint_url``, named ``<prefix>-<Id>``.

    Names are deterministic, so pass a prefix unique to the caller (e.g. one per test) to get
    isolated resources; reusing a prefix on the same server raises :class:`BackendError`.

    Example::

        >>> url = provision_resources(backend.endpoint_url, "docs3").hint_queue_url
        >>> url.removeprefix(backend.endpoint_url)
        '/123456789012/docs3-HintQueue'
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if not _PREFIX_PATTERN.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r} may hold only letters, digits, '-' and '_'")
    template = load_template(template_path or find_template())
    wanted = {
        logical_id: definition
        for logical_id, definition in template["Resources"].items()
        if isinstance(definition, dict) and definition.get("Type") in (TABLE_TYPE, QUEUE_TYPE)
    }
    parameters = template.get("Parameters") or {}
    dynamodb = local_client("dynamodb", endpoint_url, region)
    sqs = local_client("sqs", endpoint_url, region)
    tables: dict[str, str] = {}
    queues: dict[str, str] = {}
    attributes: dict[tuple[str, str], str] = {}  # GetAtt values of what exists so far
    try:
        for logical_id in _creation_order(wanted):
            definition = wanted[logical_id]
            # A resource may refer to any created before it (creation order sees to that).
            resolver = StackResolver(
                stack_name=prefix,
                region=region,
                names={**tables, **queues},
                parameters=parameters,
                attributes=dict(attributes),
                conditions=template.get("Conditions") or {},
            )
            try:
                properties = resolver.resolve(definition.get("Properties") or {})
            except Unresolvable as exc:
                raise TemplateError(f"{logical_id}: {exc}") from exc
            if definition["Type"] == TABLE_TYPE:
                name = _physical_name(prefix, logical_id)
                table = dynamodb.create_table(**_table_request(name, properties))
                description = table["TableDescription"]
                ttl = properties.get("TimeToLiveSpecification")
                if ttl and ttl.get("Enabled"):
                    dynamodb.update_time_to_live(
                        TableName=name,
                        TimeToLiveSpecification={
                            "Enabled": True,
                            "AttributeName": ttl["AttributeName"],
                        },
                    )
                tables[logical_id] = name
                attributes[(logical_id, "Arn")] = description["TableArn"]
                if description.get("LatestStreamArn"):
                    attributes[(logical_id, "StreamArn")] = description["LatestStreamArn"]
            else:
                name = _physical_name(
                    prefix, logical_id, fifo=str(properties.get("FifoQueue")).lower() == "true"
                )
                url = sqs.create_queue(QueueName=name, Attributes=_queue_attributes(properties))[
                    "QueueUrl"
                ]
                arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
                    "Attributes"
                ]["QueueArn"]
                queues[logical_id] = url
                attributes[(logical_id, "Arn")] = arn
                attributes[(logical_id, "QueueName")] = name
                attributes[(logical_id, "QueueUrl")] = url
    except (BotoCoreError, ClientError) as exc:
        raise BackendError(f"creating resources with prefix {prefix!r} failed: {exc}") from exc
    finally:
        dynamodb.close()
        sqs.close()

    required = {
        CONNECTIONS_TABLE_ID: tables,
        MESSAGES_TABLE_ID: tables,
        HINT_QUEUE_ID: queues,
        HINT_DLQ_ID: queues,
    }
    missing = [logical_id for logical_id, made in required.items() if logical_id not in made]
    stream_arn = attributes.get((CONNECTIONS_TABLE_ID, "StreamArn"))
    if missing or stream_arn is None:
        raise TemplateError(f"template lacks {missing or 'a stream on ConnectionsTable'}")
    return Resources(
        endpoint_url=endpoint_url,
        region=region,
        connections_table=tables[CONNECTIONS_TABLE_ID],
        messages_table=tables[MESSAGES_TABLE_ID],
        hint_queue_url=queues[HINT_QUEUE_ID],
        hint_dlq_url=queues[HINT_DLQ_ID],
        stream_arn=stream_arn,
        tables=tables,
        queues=queues,
        attributes={f"{key[0]}.{key[1]}": value for key, value in attributes.items()},
    )


# =============================================================================================
# The child process and its handle.
# =============================================================================================


class EmbeddedBackend(Service):
    """A serialised moto server in a child process, plus the stack's resources on demand.

    The child exits on SIGTERM (what :meth:`stop` sends) and also when this process goes away
    (it watches its stdin pipe), so an interrupted test run leaves no server behind.

    Example::

        with EmbeddedBackend() as backend:
            resources = backend.create_resources("demo")
            os.environ.update(resources.env())
            ...  # boto3 clients now talk to backend.endpoint_url
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        template_path: Path | None = None,
        region: str = DEFAULT_REGION,
    ) -> None:
        self.host = host
        self.port = port
        self.region = region
        self.template_path = template_path
        self._child: ChildProcess | None = None
        self._endpoint_url: str | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running server; BackendError before start()."""
        if self._endpoint_url is None:
            raise BackendError("backend not started")
        return self._endpoint_url

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else None."""
        return self._child.pid if self._child is not None else None

    def start(self) -> EmbeddedBackend:
        """Start the child, wait for its ready line, and return self (also usable later)."""
        if self._child is not None:
            raise BackendError("backend already started")
        command = [
            sys.executable, "-m", "wsfleet_local.backend",
            "--host", self.host, "--port", str(self.port), "--exit-on-stdin-eof",
        ]  # fmt: skip
        self._child = spawn(
            "backend", command, stdin_pipe=True, capture_stdout=True, inherit_stderr=True
        )
        try:
            ready = self._child.read_json_line(START_TIMEOUT_SECONDS)
            self._endpoint_url = str(ready["endpoint_url"])
        except BaseException as exc:
            self.stop()
            if isinstance(exc, (ChildFailed, KeyError)):
                raise BackendError(f"backend did not start: {exc}") from exc
            raise
        self.port = urlsplit(self._endpoint_url).port or self.port
        return self

    def stop(self) -> None:
        """Terminate the child and reap it (SIGKILL after a grace period). Safe to call twice."""
        child, self._child, self._endpoint_url = self._child, None, None
        if child is not None:
            child.close_stdin()
            child.stop(signal.SIGTERM, STOP_TIMEOUT_SECONDS)

    def create_resources(self, prefix: str = "wsfleet") -> Resources:
        """Create the template's tables and queues named ``<prefix>-<LogicalId>``.

        Use a distinct prefix per caller for isolated resources (see :func:`provision_resources`).
        """
        return provision_resources(
            self.endpoint_url, prefix, region=self.region, template_path=self.template_path
        )


#: The workers the stream samples in events/ name (README, "Invoke one function with sam
#: local"): worker-a with its control queue, worker-b registered but its queue gone (a worker
#: mid-restart), both alive until 2100 so the samples show their path any day.
SAMPLE_WORKERS = (("worker-a", True), ("worker-b", False))
SAMPLE_LEASE_UNTIL_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z


def seed_sample_workers(resources: Resources) -> dict[str, str]:
    """Register :data:`SAMPLE_WORKERS` in ``resources``' connections table (control queues
    named as the stack names them, ``<prefix>-ctl-<worker>``); their control queue URLs."""
    from wsfleet.control import WORKER_ID_TAG, control_queue_name
    from wsfleet.record import WorkerRecord
    from wsfleet.store import DynamoDBLeaseStore

    prefix = resources.connections_table.removesuffix("-ConnectionsTable")
    sqs = local_client("sqs", resources.endpoint_url, resources.region)
    store = DynamoDBLeaseStore(
        local_client("dynamodb", resources.endpoint_url, resources.region),
        resources.connections_table,
    )
    urls = {}
    for worker_id, with_queue in SAMPLE_WORKERS:
        name = control_queue_name(f"{prefix}-ctl-", worker_id)
        url = str(sqs.create_queue(QueueName=name, tags={WORKER_ID_TAG: worker_id})["QueueUrl"])
        if not with_queue:
            sqs.delete_queue(QueueUrl=url)
        store.register_worker(WorkerRecord(
            worker_id=worker_id, control_queue_url=url, started_at_ms=0,
            heartbeat_at_ms=SAMPLE_LEASE_UNTIL_MS, expires_at_ms=SAMPLE_LEASE_UNTIL_MS,
        ))  # fmt: skip
        urls[worker_id] = url
    return urls


def main(argv: Iterator[str] | list[str] | None = None) -> int:
    """``python -m wsfleet_local.backend``: serve in the foreground until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m wsfleet_local.backend",
        description="Serve a serialised moto backend for wsfleet on loopback.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--region", default=DEFAULT_REGION)
    parser.add_argument("--template", type=Path, default=None, help="default: find_template()")
    parser.add_argument(
        "--create-resources", metavar="PREFIX", help="also create the template's resources"
    )
    parser.add_argument(
        "--seed-samples", action="store_true",
        help="with --create-resources: register the workers the stream samples in events/ name "
        "(worker-a; worker-b without its control queue)",
    )  # fmt: skip
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (parent died)"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    # Start-up (moto's warm-up, provisioning) runs on a thread: a signal then ends the process
    # at once instead of waiting for it. make_server has bound and listens: a request sent
    # after the ready line is queued by the kernel and served once the thread runs.
    with StopSignals() as stop:
        server = stop.run(lambda: serve(args.host, args.port), name="backend-warm-up")
        if server is None:
            return 0
        with server:
            endpoint_url = f"http://{args.host}:{server.port}"
            ready: dict[str, Any] = {"endpoint_url": endpoint_url, "pid": os.getpid()}
            if args.create_resources:
                prefix = args.create_resources
                resources = stop.run(
                    lambda: provision_resources(
                        endpoint_url, prefix, region=args.region, template_path=args.template
                    ),
                    name="backend-provisioning",
                )
                if resources is None:
                    return 0
                ready["env"] = resources.env()
                ready["resources"] = asdict(resources)
                if args.seed_samples:
                    ready["sample_workers"] = seed_sample_workers(resources)
            elif args.seed_samples:
                parser.error("--seed-samples needs --create-resources")
            # stdout carries exactly one line: anything printed later (moto prints) goes to
            # stderr.
            serve_until_stopped(ready, stop, exit_on_stdin_eof=args.exit_on_stdin_eof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
