"""Router Lambda: the START/STOP API in front of the connections table.

The router only records intent. START writes (or keeps) a STARTED connection item and sends an
SQS hint so an idle worker picks it up at once; STOP flips the item to STOPPED and the owning
worker learns of it through its control queue (or, should that message be lost, its next sweep
of the connections it owns). DynamoDB is the source of
truth: a lost hint only delays pickup until the reconciler's next pass, so a hint that cannot
be sent is logged and counted (``HintSendFailed``) but never fails the request.

Routes (REST API, IAM-authorised; request and response bodies are JSON):

* ``POST /events`` with the article's body ``{"event_type": "START"|"STOP", "connection_id",
  "ws_url"}`` (``event_type`` is case-insensitive; ``ws_url`` is required for START and
  ignored for STOP). START answers 201 when it created the connection, 200 when it was already
  STARTED or has been restarted (from STOPPED, or FAILED: the crash-loop breaker is reset);
  STOP answers 200 (also when already STOPPED) or 404.
* ``PUT /connections/{id}`` ``{"ws_url", "resume": bool = true}``: START for that id.
* ``DELETE /connections/{id}``: STOP for that id.
* ``GET /connections/{id}``: the connection view (200) or 404.
* ``GET /connections?state=STARTED|STOPPED|FAILED&limit=1..100&next_token=...``: one page,
  ``{"items": [view, ...], "next_token": str | null}``.

A view's ``lease`` is ``{"state": "free"|"held"|"expired", "owner", "epoch",
"expires_in_ms"}``. Connection items carry no expiry (lease model v2): a connection is held
while its owner's worker lease is, so a view of an owned connection costs one more read (the
owner's worker item; one BatchGetItem for a whole page).

Decisions worth knowing:

* **START never moves a live stream.** A START for a connection that is already STARTED writes
  nothing and answers 200 with the current record; its ``ws_url`` and ``resume`` are *not*
  changed (STOP, then START, to point a connection elsewhere). It sends a hint only if nobody
  holds a live lease (a nudge for a stuck connection); a hint for a held lease would only cost
  a refused acquire somewhere.
* **Errors are always JSON** ``{"message", "field", "errors": [...]}`` naming the offending
  field: 400 unreadable request (body not JSON as :func:`parse_json` reads it, malformed
  ``next_token``), 404 unknown connection or route, 413 body over 16 KiB, 415 non-JSON
  ``Content-Type`` or non-UTF-8 charset, 422 well-formed but invalid (missing/extra/mistyped
  fields, unknown ``event_type``, bad ``connection_id`` in the body or the path, a START id
  of only dots, refused ``ws_url``, bad
  ``state``/``limit``), 503 the store is unavailable (retry), 500 only for a misconfigured or
  broken router.
* **Upstream URLs are secrets-bearing.** They often carry a token in the query string, so
  responses and logs only ever show :func:`wsfleet.upstream_url.redact_url` (query values masked).
"""

# No ``from __future__ import annotations``: Powertools reads the route signatures at runtime
# to build its validation models.
import base64
import binascii
import decimal
import functools
import json
import re
import warnings
from dataclasses import dataclass
from decimal import Decimal
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from boto3.dynamodb.types import DYNAMODB_CONTEXT
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
)
from pydantic_core import PydanticCustomError

from wsfleet import lease as lease_rules
from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.bodies import connection_pk_field, json_nesting_depth
from wsfleet.clock import now_ms
from wsfleet.exceptions import ConfigurationError, ConnectionNotFound, StoreError
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.record import (
    CONNECTION_ID_PATTERN,
    INDEX_SHARDS,
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
    connection_id_from_pk,
    connection_pk,
    is_startable_connection_id,
    is_valid_connection_id,
)
from wsfleet.settings import Settings
from wsfleet.store import LeaseStore
from wsfleet.upstream_options import InvalidUpstreamOptions, parse_upstream_options
from wsfleet.upstream_url import InvalidUpstreamUrl, redact_url, validate_ws_url
from wsfleet.views import connection_view

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "ApiError",
    "ConnectionOutcome",
    "ConnectionPageView",
    "ConnectionView",
    "Dependencies",
    "EventRequest",
    "FailuresView",
    "LeaseView",
    "StartRequest",
    "UnreadableJson",
    "app",
    "decode_next_token",
    "dependencies",
    "encode_next_token",
    "lambda_handler",
    "parse_json",
    "read_request",
    "reset_dependencies",
]

MAX_BODY_BYTES = 16 * 1024
MAX_PAGE_SIZE = 100
_MAX_TOKEN_CHARS = 4096
#: Deepest nesting of arrays/objects a body or page token may have. No accepted request nests
#: deeper than 1; the bound keeps the parser (and Powertools after it) far from RecursionError.
MAX_JSON_DEPTH = 32

# Reads and refusals publish no metric; that is expected, not worth a warning per request.
warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)

logger = Logger()
metrics = Metrics()
tracer = Tracer()
app = APIGatewayRestResolver(enable_validation=True)

#: What every route returns (Powertools reads route return annotations; it needs the generic).
JsonResponse = Response[dict[str, Any]]


# ---------------------------------------------------------------------- dependencies
@dataclass(frozen=True)
class Dependencies:
    """What the routes talk to; built once per container (clients are reused across requests)."""

    settings: Settings
    store: LeaseStore
    hints: HintSender


@functools.cache
def dependencies() -> Dependencies:
    """Settings and clients, created on first use and then cached for the container's life.

    Built lazily rather than at import so a configuration error becomes a logged JSON 500 on
    the request instead of an init crash, and so tests can point the environment at fresh
    resources and call :func:`reset_dependencies`. Tests may also monkeypatch this function.
    """
    settings = Settings.from_env()
    return Dependencies(
        settings=settings,
        store=LeaseStore.from_settings(settings, dynamodb_client()),
        # No long polls here: a short read timeout and two tries keep a sick queue from
        # holding the API request; the reconciler covers any hint that does not get out.
        hints=HintSender(
            sqs_client(read_timeout=5.0), settings.require_hint_queue_url(), attempts=2
        ),
    )


def reset_dependencies() -> None:
    """Forget the cached settings and clients (the next request behaves like a cold start)."""
    dependencies.cache_clear()


# ---------------------------------------------------------------------- request models
#: The id rule as every 422 on ``connection_id`` words it (body field or path segment).
_ID_RULE = "must be 1-128 characters from A-Z a-z 0-9 . _ : -"
_ID_NOT_ONLY_DOTS = "must not be only dots (clients drop . and .. from a URL path)"
#: ``/connections/<one segment>``: where an id that Powertools' route pattern cannot match
#: (``#``, NUL, emoji, bidi marks: it only matches word characters and URI punctuation) lands.
_CONNECTION_PATH = re.compile(r"/connections/[^/]+/*", re.DOTALL)
_CONNECTION_METHODS = frozenset({"GET", "PUT", "DELETE"})


def _connection_id(value: str) -> str:
    if not is_valid_connection_id(value):
        raise PydanticCustomError("connection_id", _ID_RULE)
    return value


def _new_connection_id(value: str) -> str:
    if not is_startable_connection_id(value):
        raise PydanticCustomError("connection_id", _ID_NOT_ONLY_DOTS)
    return value


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


ConnectionId = Annotated[StrictStr, AfterValidator(_connection_id)]
#: A START's id: :data:`ConnectionId` and not only dots (wsfleet.record.is_startable_connection_id).
NewConnectionId = Annotated[
    StrictStr, AfterValidator(_connection_id), AfterValidator(_new_connection_id)
]
#: The rules as docs/openapi.json states them (checked by the validators above, so the 422
#: names the rule instead of repeating a regular expression).
_ID_SCHEMA = {"pattern": f"^{CONNECTION_ID_PATTERN.pattern}$", "maxLength": 128, "minLength": 1}
_PATH_ID = Path(
    description="1-128 characters from A-Z a-z 0-9 . _ : - (any other is a 422 on connection_id)",
    json_schema_extra=_ID_SCHEMA,
)
_NEW_PATH_ID = Path(
    description=(
        "1-128 characters from A-Z a-z 0-9 . _ : -, not only dots (a 422 on connection_id "
        "otherwise: clients drop . and .. from a URL path)"
    ),
    json_schema_extra={**_ID_SCHEMA, "pattern": f"^(?!\\.+$){CONNECTION_ID_PATTERN.pattern}$"},
)
EventType = Annotated[Literal["START", "STOP"], BeforeValidator(_upper)]
StateFilter = Annotated[DesiredState, BeforeValidator(_upper)]


class EventRequest(BaseModel):
    """``POST /events``: the article's body, unchanged. ``ws_url`` is required for START."""

    model_config = ConfigDict(extra="forbid")

    event_type: EventType
    connection_id: Annotated[
        ConnectionId,
        Field(description="1-128 characters from A-Z a-z 0-9 . _ : -; START: not only dots"),
    ]
    ws_url: StrictStr | None = None
    #: Per-connection upstream options (wsfleet.upstream_options), START only.
    upstream: dict[str, Any] | None = None


class StartRequest(BaseModel):
    """``PUT /connections/{id}``. ``resume=false`` asks the worker not to resume from last_seq."""

    model_config = ConfigDict(extra="forbid")

    ws_url: StrictStr
    resume: StrictBool = True
    #: Headers, subprotocols, a credential by reference, a subscribe message, the seq pointer
    #: and the resume mode (wsfleet.upstream_options; README "Real upstreams").
    upstream: dict[str, Any] | None = None


# ---------------------------------------------------------------------- response models
# Documentation only (docs/openapi.json): the routes build plain dicts (wsfleet.views), and
# tests/integration/test_router.py checks that every view validates against these models.
class LeaseView(BaseModel):
    """Who holds the connection. A connection has no expiry of its own: it is ``held`` while
    its owner's worker lease runs, ``expired`` once that lease is over (a peer may take it
    over), ``free`` when nobody owns it. ``expires_in_ms``: until the owner's worker lease
    lapses (0 once it has), null while free. ``epoch`` counts acquisitions (kept when free)."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["free", "held", "expired"]
    owner: str | None
    epoch: int
    expires_in_ms: int | None


class FailuresView(BaseModel):
    """Crash-loop breaker: failures counted at checkpoint ``at_seq``."""

    model_config = ConfigDict(extra="forbid")

    count: int
    at_seq: int | None


class GapsView(BaseModel):
    """Resumes after which the upstream's first frame skipped past the checkpoint, and the
    frames skipped in all (an upstream with ``resume: none`` cannot replay what was sent
    while nobody listened)."""

    model_config = ConfigDict(extra="forbid")

    resumes: int
    frames: int


class ReplayedView(BaseModel):
    """At-least-once sinks (kinesis, firehose): takeovers that inherited frames the previous
    holder may have sent above the checkpoint, the frames the new holders re-sent inside those
    windows (no fewer than the duplicates consumers see), and the last window's seqs (inclusive;
    null before the first). Always 0 with the idempotent dynamodb sink."""

    model_config = ConfigDict(extra="forbid")

    takeovers: int
    frames: int
    from_seq: int | None
    to_seq: int | None


class ConnectionView(BaseModel):
    """One connection (``ws_url`` with query values masked, ``upstream`` with header values
    masked; a credential is only ever a reference)."""

    model_config = ConfigDict(extra="forbid")

    connection_id: str
    desired_state: DesiredState
    ws_url: str
    resume: bool
    last_seq: int
    lease: LeaseView
    stop_reason: str | None
    last_error: str | None
    failures: FailuresView
    upstream: dict[str, Any]
    gaps: GapsView
    replayed: ReplayedView
    created_at_ms: int
    updated_at_ms: int


class ConnectionOutcome(ConnectionView):
    """A START or STOP answer: the connection and what this request did."""

    outcome: Literal["created", "restarted", "already_started", "stopped", "already_stopped"]


class ConnectionPageView(BaseModel):
    """``GET /connections``: follow ``next_token`` until it is null."""

    model_config = ConfigDict(extra="forbid")

    items: list[ConnectionView]
    next_token: str | None


def _documents(status: HTTPStatus, model: type[BaseModel]) -> dict[int, OpenAPIResponse]:
    return {
        status.value: {
            "description": model.__doc__ or "",
            "content": {"application/json": {"model": model}},
        }
    }


_OUTCOME = {**_documents(HTTPStatus.OK, ConnectionOutcome)}
_CREATED_OR_OUTCOME = {**_documents(HTTPStatus.CREATED, ConnectionOutcome), **_OUTCOME}


class ApiError(Exception):
    """A refusal with its HTTP status, message and the request field it is about."""

    def __init__(self, status: HTTPStatus, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


# ---------------------------------------------------------------------- views
# The views themselves are pure and shared with the CLI (wsfleet.views); the router only reads
# the owner's worker item they need.
def _owner_of(store: LeaseStore, record: ConnectionRecord) -> WorkerRecord | None:
    """The owner's worker item: one GetItem, and only when the connection is owned."""
    return store.get_worker(record.lease_owner) if record.lease_owner else None


# ---------------------------------------------------------------------- JSON reading
class UnreadableJson(ValueError):
    """Text that is not JSON this API reads; the message says why (never echoes the input)."""


def parse_json(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The one JSON reader for everything a client sends (bodies and page tokens).

    Bytes must be UTF-8. Nesting is bounded by ``max_depth`` (checked before parsing, so a
    ``"[" * 5000`` body never reaches the recursive parser); ``NaN``/``Infinity`` are refused;
    every number must fit DynamoDB's number type (38 significant digits, the exponent range),
    checked with the context boto3's serializer uses, so a parsed value can never fail in
    boto3 later; strings must be encodable as UTF-8 (no unpaired surrogate escapes).
    Raises :class:`UnreadableJson` otherwise.

    >>> parse_json(b'{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> parse_json("[" * 40)
    Traceback (most recent call last):
    ...
    UnreadableJson: JSON nests deeper than 32 levels
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnreadableJson("JSON must be UTF-8 text") from None
    else:
        text = data
    if json_nesting_depth(text) > max_depth:
        raise UnreadableJson(f"JSON nests deeper than {max_depth} levels")
    try:
        value = json.loads(
            text,
            parse_int=_int_within_dynamodb_range,
            parse_float=_float_within_dynamodb_range,
            parse_constant=_refuse_constant,
        )
    except UnreadableJson:
        raise
    except ValueError:  # JSONDecodeError, and the BOM check of json.loads
        raise UnreadableJson("not valid JSON") from None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UnreadableJson("JSON strings must be valid Unicode") from None
    return value


def _dynamodb_number(literal: str) -> decimal.Decimal:
    # DYNAMODB_CONTEXT traps Inexact, Rounded, Overflow and Underflow: a literal it accepts is
    # one boto3 can serialise (10**40 is what raised decimal.Rounded inside the store before).
    try:
        return DYNAMODB_CONTEXT.create_decimal(literal)
    except decimal.DecimalException:
        raise UnreadableJson("numbers must fit DynamoDB's number type") from None


def _int_within_dynamodb_range(literal: str) -> int:
    _dynamodb_number(literal)
    return int(literal)


def _float_within_dynamodb_range(literal: str) -> float:
    _dynamodb_number(literal)
    return float(literal)


def _refuse_constant(literal: str) -> None:
    raise UnreadableJson(f"{literal} is not a JSON number")


def encode_next_token(next_key: dict[str, Any], state: DesiredState) -> str:
    """An opaque page token: where the listing of ``state`` stopped (the store's ``next_key``:
    the gsi_state shard and that shard's LastEvaluatedKey, or None to start the shard from its
    beginning) as unpadded urlsafe base64 JSON."""
    payload = {"state": state.value, "shard": next_key["shard"], "key": next_key.get("key")}
    raw = json.dumps(payload, default=_json_number, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _json_number(value: object) -> int:
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    raise TypeError(f"cannot encode {type(value).__name__} in a page token")


def decode_next_token(token: str, state: DesiredState) -> dict[str, Any]:
    """The store's start key inside ``token``; ApiError(400) unless it is one this API issued
    for ``state``. Checked field by field so a forged token cannot reach DynamoDB as a bad
    key: ``shard`` an int in 0..INDEX_SHARDS-1, ``key`` null or exactly the gsi_state key of
    a connection in that shard (``{"pk": "CONN#<id>", "state_shard": "<STATE>#<nn>"}``).
    """
    malformed = ApiError(HTTPStatus.BAD_REQUEST, "next_token is malformed", "next_token")
    if len(token) > _MAX_TOKEN_CHARS:
        raise malformed
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        payload = parse_json(raw)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII token text, UnreadableJson
        raise malformed from None
    if not isinstance(payload, dict) or set(payload) != {"state", "shard", "key"}:
        raise malformed
    token_state, shard, key = payload["state"], payload["shard"], payload["key"]
    if token_state not in {s.value for s in DesiredState}:
        raise malformed
    if type(shard) is not int or not 0 <= shard < INDEX_SHARDS:
        raise malformed
    if key is not None:
        if not isinstance(key, dict) or set(key) != {"pk", "state_shard"}:
            raise malformed
        try:
            connection_pk_field(key, what="next_token")
        except ValueError:
            raise malformed from None
        if key["state_shard"] != f"{token_state}#{shard:02d}":
            raise malformed
    if token_state != state.value:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"next_token belongs to another state than {state}",
            "next_token",
        )
    return {"shard": shard, "key": key}


# ---------------------------------------------------------------------- routes
@app.post("/events", responses=_CREATED_OR_OUTCOME)
def post_event(body: EventRequest) -> JsonResponse:
    """The article's single endpoint: START or STOP by ``event_type``."""
    if body.event_type == "STOP":
        if body.upstream is not None:
            raise ApiError(
                HTTPStatus.UNPROCESSABLE_ENTITY, "upstream applies to START only", "upstream"
            )
        return _stop(body.connection_id)
    if body.ws_url is None:
        raise ApiError(HTTPStatus.UNPROCESSABLE_ENTITY, "ws_url is required for START", "ws_url")
    if not is_startable_connection_id(body.connection_id):
        message = f"connection_id: {_ID_NOT_ONLY_DOTS}"
        raise ApiError(HTTPStatus.UNPROCESSABLE_ENTITY, message, "connection_id")
    return _start(body.connection_id, body.ws_url, resume=True, upstream=body.upstream)


@app.put("/connections/<connection_id>", responses=_CREATED_OR_OUTCOME)
def put_connection(
    connection_id: Annotated[NewConnectionId, _NEW_PATH_ID], body: StartRequest
) -> JsonResponse:
    return _start(connection_id, body.ws_url, resume=body.resume, upstream=body.upstream)


@app.delete("/connections/<connection_id>", responses=_OUTCOME)
def delete_connection(connection_id: Annotated[ConnectionId, _PATH_ID]) -> JsonResponse:
    return _stop(connection_id)


@app.get("/connections/<connection_id>", responses=_documents(HTTPStatus.OK, ConnectionView))
def get_connection(connection_id: Annotated[ConnectionId, _PATH_ID]) -> JsonResponse:
    store = dependencies().store
    record = store.get(connection_pk(connection_id))
    if record is None:
        raise ConnectionNotFound(connection_pk(connection_id))
    owner = _owner_of(store, record)
    return _json(HTTPStatus.OK, connection_view(record, owner, now_ms()))


@app.get("/connections", responses=_documents(HTTPStatus.OK, ConnectionPageView))
def list_connections(
    state: Annotated[StateFilter, Query()] = DesiredState.STARTED,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
    next_token: Annotated[str | None, Query()] = None,
) -> JsonResponse:
    """One page of connections in ``state`` (in no particular order).

    Follow ``next_token`` until it is null; a page may be short (even empty) before the end.
    The lease state of the whole page costs one BatchGetItem of its distinct owners' worker
    items.
    """
    start_key = decode_next_token(next_token, state) if next_token else None
    store = dependencies().store
    page = store.list_connections(state, limit=limit, start_key=start_key)
    owner_ids = sorted({record.lease_owner for record in page.records if record.lease_owner})
    owners = store.get_workers(owner_ids) if owner_ids else {}
    now = now_ms()
    return _json(
        HTTPStatus.OK,
        {
            "items": [
                connection_view(record, owners.get(record.lease_owner), now)
                for record in page.records
            ],
            "next_token": encode_next_token(page.next_key, state) if page.next_key else None,
        },
    )


def _start(
    connection_id: str, ws_url: str, *, resume: bool, upstream: dict[str, Any] | None
) -> Response:
    deps = dependencies()
    validate_ws_url(
        ws_url,
        allowed_hosts=deps.settings.allowed_upstream_hosts,
        allow_insecure=deps.settings.allow_insecure_ws,
    )
    options = parse_upstream_options(
        upstream,
        secret_prefixes=deps.settings.upstream_secret_prefixes,
        default_seq_field=deps.settings.seq_field,
    )
    try:
        result = deps.store.start(connection_id, ws_url, resume=resume, upstream=options)
    except ConnectionNotFound:  # deleted (TTL) while a concurrent START restarted it
        raise ApiError(
            HTTPStatus.CONFLICT, "connection changed concurrently; retry", "connection_id"
        ) from None
    record = result.record
    owner = _owner_of(deps.store, record)
    now = now_ms()
    lease_state = lease_rules.lease_state(record, owner, now)
    if result.created or result.restarted:
        outcome = "created" if result.created else "restarted"
        metrics.add_metric(name="ConnectionsStarted", unit=MetricUnit.Count, value=1)
    else:
        outcome = "already_started"
    # A nudge for an already STARTED connection only if no live worker holds it (free, or its
    # owner's lease lapsed): a hint for a held one would only cost a refused acquire.
    needs_hint = (
        result.created or result.restarted or lease_state is not lease_rules.LeaseState.HELD
    )
    logger.info(
        "start",
        extra={
            "connection_id": connection_id,
            "outcome": outcome,
            "ws_url": redact_url(record.ws_url),
            "lease_state": lease_state.value,
            "hint": needs_hint,
        },
    )
    if needs_hint:
        _send_hint(deps.hints, record)
    status = HTTPStatus.CREATED if result.created else HTTPStatus.OK
    return _json(status, {**connection_view(record, owner, now), "outcome": outcome})


def _send_hint(sender: HintSender, record: ConnectionRecord) -> None:
    """Best effort: the record is already written and the reconciler is the safety net."""
    try:
        sent = sender.send(Hint(record.pk))
    except Exception:  # a hint must never fail the request, whatever went wrong
        logger.exception("hint send raised", extra={"connection_id": record.connection_id})
        sent = False
    if not sent:
        logger.warning(
            "hint not sent; the reconciler will pick the connection up",
            extra={"connection_id": record.connection_id},
        )
        metrics.add_metric(name="HintSendFailed", unit=MetricUnit.Count, value=1)


def _stop(connection_id: str) -> Response:
    store = dependencies().store
    result = store.stop(connection_pk(connection_id))
    record, stopped_now = result.record, result.stopped
    if stopped_now:
        metrics.add_metric(name="ConnectionsStopped", unit=MetricUnit.Count, value=1)
    outcome = "stopped" if stopped_now else "already_stopped"
    logger.info("stop", extra={"connection_id": connection_id, "outcome": outcome})
    view = connection_view(record, _owner_of(store, record), now_ms())
    return _json(HTTPStatus.OK, {**view, "outcome": outcome})


# ---------------------------------------------------------------------- errors
def _json(status: HTTPStatus, body: dict[str, Any]) -> Response:
    return Response(
        status_code=status.value, content_type=content_types.APPLICATION_JSON, body=body
    )


def _error(
    status: HTTPStatus, message: str, field: str | None, errors: list[dict[str, Any]] | None = None
) -> Response:
    detail = errors if errors is not None else [{"field": field, "message": message}]
    return _json(status, {"message": message, "field": field, "errors": detail})


def _field_name(loc: tuple[Any, ...]) -> str:
    """``("body", "ws_url")`` -> ``ws_url``; ``("query", "limit")`` -> ``limit``; ``("body",)``
    -> ``body``. Positions (JSON parse offsets, list indexes) are dropped."""
    names = [str(part) for part in loc[1:] if isinstance(part, str)]
    if not loc:
        return "body"
    return ".".join(names) or str(loc[0])


def _describe(error: dict[str, Any]) -> dict[str, Any]:
    field = _field_name(tuple(error.get("loc", ())))
    kind = error.get("type", "")
    if kind == "missing":
        message = f"{field} is required"
    elif kind == "extra_forbidden":
        message = f"{field} is not an accepted field"
    elif kind == "json_invalid":
        field, message = "body", "body is not valid JSON"
    elif kind == "model_attributes_type":
        message = f"{field} must be a JSON object"
    else:
        message = f"{field}: {error.get('msg', 'is invalid')}"
    return {"field": field, "message": message, "unreadable": kind == "json_invalid"}


@app.exception_handler(RequestValidationError)
def _on_validation_error(exc: RequestValidationError) -> Response:
    """Powertools' 422 hides which field failed; name it (pydantic messages carry no input)."""
    described = [_describe(error) for error in exc.errors()] or [
        {"field": "body", "message": "invalid request", "unreadable": False}
    ]
    unreadable = any([error.pop("unreadable") for error in described])  # pop from every one
    status = HTTPStatus.BAD_REQUEST if unreadable else HTTPStatus.UNPROCESSABLE_ENTITY
    fields = [error["field"] for error in described]
    logger.info("request refused", extra={"status": status.value, "fields": fields})
    return _error(status, described[0]["message"], described[0]["field"], described)


@app.exception_handler(RequestUnsupportedContentType)
def _on_content_type(exc: RequestUnsupportedContentType) -> Response:
    return _error(
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json", "Content-Type"
    )


@app.exception_handler(ApiError)
def _on_api_error(exc: ApiError) -> Response:
    logger.info("request refused", extra={"status": exc.status.value, "fields": [exc.field]})
    return _error(exc.status, exc.message, exc.field)


@app.exception_handler(InvalidUpstreamUrl)
def _on_invalid_url(exc: InvalidUpstreamUrl) -> Response:
    logger.info("request refused", extra={"status": 422, "fields": ["ws_url"]})
    return _error(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc), "ws_url")


@app.exception_handler(InvalidUpstreamOptions)
def _on_invalid_options(exc: InvalidUpstreamOptions) -> Response:
    logger.info("request refused", extra={"status": 422, "fields": [exc.field]})
    return _error(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc), exc.field)


@app.exception_handler(ConnectionNotFound)
def _on_not_found(exc: ConnectionNotFound) -> Response:
    connection_id = connection_id_from_pk(exc.pk)
    return _error(HTTPStatus.NOT_FOUND, f"connection {connection_id} not found", "connection_id")


@app.not_found
def _on_unknown_route(exc: NotFoundError) -> Response:
    event = app.current_event
    if event.http_method in _CONNECTION_METHODS and _CONNECTION_PATH.fullmatch(event.path or ""):
        # The route exists; the id is what Powertools' path pattern could not match. The
        # contract answers a bad id with 422, whichever character made it bad.
        logger.info("request refused", extra={"status": 422, "fields": ["connection_id"]})
        message = f"connection_id: {_ID_RULE}"
        return _error(HTTPStatus.UNPROCESSABLE_ENTITY, message, "connection_id")
    return _error(HTTPStatus.NOT_FOUND, f"no route for {event.http_method} {event.path}", None)


@app.exception_handler(StoreError)
def _on_store_error(exc: StoreError) -> Response:
    logger.exception("connection store unavailable")
    return _error(
        HTTPStatus.SERVICE_UNAVAILABLE, "the connection store is unavailable; retry", None
    )


@app.exception_handler(ConfigurationError)
def _on_configuration_error(exc: ConfigurationError) -> Response:
    logger.exception("router misconfigured")
    return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "the router is misconfigured", None)


@app.exception_handler(Exception)
def _on_unexpected(exc: Exception) -> Response:
    logger.exception("unexpected error")
    return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error", None)


# ---------------------------------------------------------------------- entry point
def read_request(event: dict[str, Any]) -> dict[str, Any]:
    """The event Powertools resolves, its body checked and rewritten as canonical JSON text.

    The one place a request body is read; it runs before :meth:`app.resolve` because
    Powertools' validation parses the body before any middleware. In order: 413 over
    :data:`MAX_BODY_BYTES` (base64 bodies measured decoded), 415 a non-JSON ``Content-Type`` or
    a charset other than UTF-8, 400 invalid base64, bytes that are not UTF-8 or a body
    :func:`parse_json` refuses. The returned event is a copy whose body is the parsed value
    re-serialised (``isBase64Encoded`` false, ``Content-Type: application/json``), so
    Powertools only ever parses text this function has already parsed. An empty body is left
    alone (the routes that need one answer 422). Raises :class:`ApiError`.

    >>> read_request({"body": "[" * 40})
    Traceback (most recent call last):
    ...
    ApiError: body is not readable JSON: JSON nests deeper than 32 levels
    """
    body = event.get("body") or ""
    is_base64 = bool(event.get("isBase64Encoded"))
    if is_base64:
        size = len(body) * 3 // 4 - body[-2:].count("=")  # decoded size, without decoding
    else:
        size = len(body.encode("utf-8", errors="surrogatepass"))
    too_large = ApiError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body is larger than {MAX_BODY_BYTES} bytes", "body"
    )
    if size > MAX_BODY_BYTES:
        raise too_large
    if not body:
        return event
    media_type, _, parameters = _content_type(event).partition(";")
    media_type = media_type.strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        raise ApiError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
            "Content-Type",
        )
    charset = _charset(parameters)
    if charset not in (None, "utf-8", "utf8"):
        raise ApiError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "Content-Type charset must be utf-8", "Content-Type"
        )
    if is_base64:
        try:
            data = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
            raise ApiError(HTTPStatus.BAD_REQUEST, "body is not valid base64", "body") from None
        if len(data) > MAX_BODY_BYTES:
            raise too_large
    else:
        try:
            data = body.encode("utf-8")
        except UnicodeEncodeError:  # unpaired surrogates: not text API Gateway could send
            raise ApiError(HTTPStatus.BAD_REQUEST, "body is not UTF-8 text", "body") from None
    try:
        value = parse_json(data)
    except UnreadableJson as exc:
        message = f"body is not readable JSON: {exc}"
        raise ApiError(HTTPStatus.BAD_REQUEST, message, "body") from None
    headers = _without_content_type(event.get("headers"))
    multi_headers = _without_content_type(event.get("multiValueHeaders"))
    return {
        **event,
        "body": json.dumps(value, separators=(",", ":")),
        "isBase64Encoded": False,
        "headers": {**headers, "Content-Type": content_types.APPLICATION_JSON},
        "multiValueHeaders": {**multi_headers, "Content-Type": [content_types.APPLICATION_JSON]},
    }


def _without_content_type(headers: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}


def _content_type(event: dict[str, Any]) -> str:
    """The request's Content-Type (header names are case-insensitive; the last one wins)."""
    found = ""
    for source in ("headers", "multiValueHeaders"):
        for name, value in (event.get(source) or {}).items():
            if name.lower() != "content-type":
                continue
            values = value if isinstance(value, list) else [value]
            found = str(values[-1]) if values else found
    return found


def _charset(parameters: str) -> str | None:
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def _proxy_error(status: HTTPStatus, message: str, field: str) -> dict[str, Any]:
    logger.info("request refused", extra={"status": status.value, "fields": [field]})
    body = {"message": message, "field": field, "errors": [{"field": field, "message": message}]}
    return {
        "statusCode": status.value,
        "multiValueHeaders": {"Content-Type": [content_types.APPLICATION_JSON]},
        "body": json.dumps(body, separators=(",", ":")),
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics(capture_cold_start_metric=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """API Gateway REST proxy entry point."""
    try:
        checked = read_request(event)
    except ApiError as exc:
        return _proxy_error(exc.status, exc.message, exc.field or "body")
    return app.resolve(checked, context)
