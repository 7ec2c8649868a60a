"""Talk to a wsfleet deployment, local or on AWS: the REST API, or the connections table directly.

:class:`ApiClient` calls the router's routes. A loopback URL (the local API) is called as is;
any other URL is a deployed API Gateway REST API with IAM auth, so each request is signed with
SigV4 (service ``execute-api``) using the caller's normal AWS credentials (profile, env, SSO),
the region taken from the ``*.execute-api.<region>.amazonaws.com`` host unless given.

:class:`ConnectionRow` is one line of ``wsfleet status``, built from either source:
:meth:`ConnectionRow.from_api` (the router's JSON view, whose ``lease`` the router already
worked out) or :func:`read_table` (a scan of the table, for ``--table``, which needs only
``dynamodb:Scan`` and so also works when the API is down). A connection item carries no expiry
(lease model v2): its lease state comes from its owner's ``WORKER#`` item, which the same
scan returns, and the row is built from the very view the router answers with
(:func:`wsfleet.views.connection_view`), so both sources show the same thing.

:func:`build_upstream` turns ``wsfleet start``'s options (``-H``, ``--secret-ref``,
``--subscribe``, ...) into a START's ``upstream`` object and checks it with the router's own
schema before anything is sent, so a typo is a clear local error (:class:`UpstreamUsageError`).

Example::

    api = ApiClient("http://127.0.0.1:8080/dev")
    api.start("s1", "ws://127.0.0.1:9000/s1")
    rows = [ConnectionRow.from_api(view) for view in api.list_connections()]
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wsfleet.exceptions import InvalidUpstreamOptions, WsfleetError
from wsfleet.record import (
    CONNECTION_PREFIX,
    WORKER_PREFIX,
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
)
from wsfleet.upstream_options import parse_upstream_options
from wsfleet.views import connection_view

from .serving import call_json

__all__ = [
    "ApiClient",
    "ApiError",
    "ConnectionRow",
    "TableError",
    "UpstreamUsageError",
    "build_upstream",
    "is_loopback_url",
    "read_connections_table",
    "read_table",
    "scan_table",
]

_EXECUTE_API_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
DEFAULT_TIMEOUT_SECONDS = 15.0


class ApiError(WsfleetError):
    """The API answered with an error status (its JSON ``message`` is kept) or not at all."""

    def __init__(self, status: int | None, message: str, body: Any = None) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.body = body


def is_loopback_url(url: str) -> bool:
    """True for http(s) URLs on localhost / 127.0.0.0/8 / ::1 (the local API: no signing)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _region_of(url: str) -> str | None:
    match = _EXECUTE_API_HOST.search(urllib.parse.urlsplit(url).hostname or "")
    return match.group(1) if match else None


class ApiClient:
    """The router's REST API. ``base_url`` includes the stage (``.../dev``)."""

    def __init__(
        self,
        base_url: str,
        *,
        region: str | None = None,
        api_key: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """``api_key``: a deployment with ``ApiAuth=API_KEY``; every request carries it in
        ``x-api-key`` and nothing is signed. Otherwise a non-loopback URL is SigV4-signed."""
        try:
            parts = urllib.parse.urlsplit(base_url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # e.g. an unclosed "[" of an IPv6 host
            valid = False
        if not valid:
            raise ApiError(None, f"the API URL must be http(s)://host/stage, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or None
        self.sign = self.api_key is None and not is_loopback_url(base_url)
        self.region = region or _region_of(base_url)
        self.timeout_seconds = timeout_seconds
        self._credentials: Any = None

    # -- routes ------------------------------------------------------------------------------

    def start(
        self,
        connection_id: str,
        ws_url: str,
        *,
        resume: bool = True,
        upstream: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """PUT /connections/{id}: START (idempotent; a live connection is not moved).
        ``upstream`` is the per-connection options object (README "Real upstreams")."""
        body: dict[str, Any] = {"ws_url": ws_url, "resume": resume}
        if upstream is not None:
            body["upstream"] = dict(upstream)
        return self._call("PUT", f"/connections/{_quote(connection_id)}", body)

    def stop(self, connection_id: str) -> dict[str, Any]:
        """DELETE /connections/{id}: STOP (idempotent)."""
        return self._call("DELETE", f"/connections/{_quote(connection_id)}")

    def get(self, connection_id: str) -> dict[str, Any]:
        return self._call("GET", f"/connections/{_quote(connection_id)}")

    def list_connections(self, state: str = "STARTED", *, page_size: int = 100) -> Iterator[dict]:
        """Every connection in ``state``, following ``next_token`` to the end."""
        token: str | None = None
        while True:
            query = {"state": state, "limit": str(page_size)}
            if token:
                query["next_token"] = token
            page = self._call("GET", "/connections?" + urllib.parse.urlencode(query))
            yield from page.get("items", [])
            token = page.get("next_token")
            if not token:
                return

    # -- transport ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        url = self.base_url + path

        def failed(status: int | None, reason: str, answer: bytes) -> ApiError:
            if status is None:
                return ApiError(None, f"{method} {url} failed: {reason}")
            payload = _json_body(answer)
            return ApiError(status, str(payload.get("message", reason)), payload)

        result: dict[str, Any] = call_json(
            method,
            url,
            body,
            timeout=self.timeout_seconds,
            failed=failed,
            sign=self._request_headers,
            decode=_json_body,
        )
        return result

    def _request_headers(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str]
    ) -> dict[str, str]:
        """SigV4-signed (``ApiAuth=IAM``), with the API key (``ApiAuth=API_KEY``), or as
        they are (the local API)."""
        if self.sign:
            return self._signed_headers(method, url, data, headers)
        if self.api_key:
            return {**headers, "x-api-key": self.api_key}
        return dict(headers)

    def _signed_headers(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str]
    ) -> dict[str, str]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        if self._credentials is None:
            session = boto3.session.Session()
            credentials = session.get_credentials()
            if credentials is None:
                raise ApiError(None, "no AWS credentials found to sign the request (SigV4)")
            self._credentials = credentials
            self.region = self.region or session.region_name
        if not self.region:
            raise ApiError(None, "cannot tell the API's region; pass --region")
        request = AWSRequest(method=method, url=url, data=data, headers=dict(headers))
        SigV4Auth(self._credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(
            request
        )
        return dict(request.headers.items())


class UpstreamUsageError(WsfleetError, ValueError):
    """``wsfleet start``'s upstream options cannot make a valid START; ``option`` names the
    command-line option (or the ``upstream.*`` field) to fix."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message if message.startswith(option) else f"{option}: {message}")
        self.option = option
        self.message = message


#: Each field of the upstream object and the options that set it, named when it is refused;
#: the first one is also named when the field is given twice.
_FIELD_OPTIONS = {
    "headers": "--header",
    "subprotocols": "--subprotocol",
    "credential": "--secret-ref/--secret-in/--secret-format/--secret-json-key",
    "subscribe": "--subscribe",
    "seq_pointer": "--seq-pointer",
    "resume": "--resume",
}
#: A placeholder prefix for the local check: which prefixes a deployment accepts only the
#: router knows (UPSTREAM_SECRET_PREFIXES), so the CLI checks everything else.
_ANY_REF_PREFIX = ("arn:",)


def parse_header(line: str) -> tuple[str, str]:
    """``'Name: value'`` (curl's ``-H`` form) -> ``("Name", "value")``.

    >>> parse_header("X-Client:  acme ")
    ('X-Client', 'acme')
    """
    name, colon, value = line.partition(":")
    if not colon or not name.strip() or name != name.strip():
        raise UpstreamUsageError(f"expected 'Name: value', got {line[:40]!r}", "--header")
    return name, value.strip()


def parse_secret_in(text: str) -> dict[str, Any]:
    """Where ``--secret-ref``'s value goes, as the ``credential`` fields besides ``ref``:
    ``header:NAME``, ``query:NAME`` or ``subscribe`` (the ``{{secret}}`` of the message).

    >>> parse_secret_in("header:Authorization"), parse_secret_in("subscribe")
    ({'header': 'Authorization'}, {'subscribe': True})
    """
    kind, colon, name = text.partition(":")
    if kind == "subscribe" and not name:
        return {"subscribe": True}
    if kind in ("header", "query") and colon and name:
        return {kind: name}
    raise UpstreamUsageError(
        f"expected header:NAME, query:NAME or subscribe, got {text[:40]!r}", "--secret-in"
    )


def _subscribe_value(text: str) -> Any:
    """A JSON object or array is sent as JSON (placeholders rendered JSON-aware); anything
    else, including a bare JSON string or number, is sent as the text given."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (dict, list)) else text


def read_upstream_json(text: str | None, path: str | Path | None) -> dict[str, Any] | None:
    """The ``--upstream JSON`` or ``--upstream-file PATH`` object (at most one of them)."""
    if text is not None and path is not None:
        raise UpstreamUsageError("give --upstream or --upstream-file, not both", "--upstream")
    option = "--upstream" if text is not None else "--upstream-file"
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc.__class__.__name__
            raise UpstreamUsageError(f"cannot read {path}: {reason}", option) from None
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UpstreamUsageError(f"not JSON ({exc.msg} at character {exc.pos})", option) from None
    except (ValueError, RecursionError) as exc:
        # Valid syntax the decoder still refuses: a plain ValueError (an integer past Python's
        # 4300-digit limit) has no .msg/.pos, and deep nesting exhausts the recursion limit.
        raise UpstreamUsageError(f"not JSON ({exc})", option) from None
    if not isinstance(value, dict):
        raise UpstreamUsageError("must be a JSON object", option)
    return value


def build_upstream(
    base: Mapping[str, Any] | None = None,
    *,
    headers: Sequence[str] = (),
    subprotocols: Sequence[str] = (),
    secret_ref: str | None = None,
    secret_in: str | None = None,
    secret_format: str | None = None,
    secret_json_key: str | None = None,
    subscribe: str | None = None,
    seq_pointer: str | None = None,
    resume: str | None = None,
) -> dict[str, Any] | None:
    """A START's ``upstream`` object from ``wsfleet start``'s options, checked with the
    router's schema (:func:`wsfleet.upstream_options.parse_upstream_options`); None when no
    option is given (today's dialogue). ``base`` is ``--upstream``/``--upstream-file``; an
    option may add to its ``headers`` but not set a field it already sets.

    >>> build_upstream(headers=["X-Client: acme"], resume="none")
    {'headers': {'X-Client': 'acme'}, 'resume': 'none'}
    >>> build_upstream(secret_ref="arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/k",
    ...                secret_in="query:api_key")["credential"]
    {'ref': 'arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/k', 'query': 'api_key'}
    """
    upstream: dict[str, Any] = dict(base or {})

    def put(field: str, value: Any) -> None:
        if field in upstream:
            option = _FIELD_OPTIONS[field].partition("/")[0]
            raise UpstreamUsageError(f"{field} is also set by --upstream; give it once", option)
        upstream[field] = value

    if headers:
        if not isinstance(upstream.get("headers", {}), dict):
            raise UpstreamUsageError("upstream.headers must be an object", "--upstream")
        merged = dict(upstream.get("headers") or {})
        for line in headers:
            name, value = parse_header(line)
            if any(name.lower() == known.lower() for known in merged):
                raise UpstreamUsageError(f"header {name} is given twice", "--header")
            merged[name] = value
        upstream["headers"] = merged
    if subprotocols:
        put("subprotocols", list(subprotocols))
    if secret_ref is None:
        for option, given in (
            ("--secret-in", secret_in),
            ("--secret-format", secret_format),
            ("--secret-json-key", secret_json_key),
        ):
            if given is not None:
                raise UpstreamUsageError("needs --secret-ref", option)
    else:
        if secret_in is None:
            raise UpstreamUsageError(
                "needs --secret-in header:NAME, query:NAME or subscribe", "--secret-ref"
            )
        credential: dict[str, Any] = {"ref": secret_ref, **parse_secret_in(secret_in)}
        if secret_format is not None:
            credential["format"] = secret_format
        if secret_json_key is not None:
            credential["json_key"] = secret_json_key
        put("credential", credential)
    if subscribe is not None:
        put("subscribe", _subscribe_value(subscribe))
    if seq_pointer is not None:
        put("seq_pointer", seq_pointer)
    if resume is not None:
        put("resume", resume)
    if base is None and not upstream:
        return None
    try:
        parse_upstream_options(upstream, secret_prefixes=_ANY_REF_PREFIX)
    except InvalidUpstreamOptions as exc:
        # The schema's message starts with the field; say which option sets it.
        hint = _FIELD_OPTIONS.get(exc.field.removeprefix("upstream.").partition(".")[0])
        message = str(exc) + (f" (see {hint})" if hint else "")
        raise UpstreamUsageError(message, exc.field) from None
    return upstream


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _json_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace")[:200]}
    return value if isinstance(value, dict) else {"value": value}


@dataclass(frozen=True)
class ConnectionRow:
    """What ``wsfleet status`` shows for one connection."""

    connection_id: str
    desired_state: str
    owner: str | None
    epoch: int
    lease_state: str  # free | held | expired
    lease_left_ms: int | None
    last_seq: int
    stop_reason: str | None = None
    last_error: str | None = None
    failures: int = 0  # crash-loop breaker count (FAILED once it reached the threshold)
    gap_resumes: int = 0  # resumes after which the upstream skipped frames (resume: none)
    gap_frames: int = 0  # the frames they skipped

    @classmethod
    def from_api(cls, view: Mapping[str, Any]) -> ConnectionRow:
        """From a connection view: the router's (GET /connections[/id]) or one built from a
        scanned record with the same function (:func:`read_table`)."""
        lease = view.get("lease") or {}
        return cls(
            connection_id=str(view["connection_id"]),
            desired_state=str(view.get("desired_state", "")),
            owner=lease.get("owner"),
            epoch=int(lease.get("epoch") or 0),
            lease_state=str(lease.get("state", "free")),
            lease_left_ms=lease.get("expires_in_ms"),
            last_seq=int(view.get("last_seq") or 0),
            stop_reason=view.get("stop_reason"),
            last_error=view.get("last_error"),
            failures=int((view.get("failures") or {}).get("count") or 0),
            gap_resumes=int((view.get("gaps") or {}).get("resumes") or 0),
            gap_frames=int((view.get("gaps") or {}).get("frames") or 0),
        )

    @property
    def streaming(self) -> bool:
        return self.desired_state == DesiredState.STARTED and self.lease_state == "held"

    @property
    def failed(self) -> bool:
        """Ended by the crash-loop breaker: needs an operator (a new START restarts it)."""
        return self.desired_state == DesiredState.FAILED

    @property
    def note(self) -> str:
        """One line for ``wsfleet status``: the error (with the breaker count) or stop reason.

        >>> ConnectionRow("c", "FAILED", None, 3, "free", None, 7, "crashed", "crashed", 5).note
        'crashed (5 failures at one checkpoint)'
        """
        text = self.last_error or self.stop_reason or ""
        if self.failures:
            text += f" ({self.failures} failures at one checkpoint)"
        return text


class TableError(WsfleetError):
    """``wsfleet status --table`` could not read the table. ``input_error``: the fix is on the
    caller's side (region, credentials, endpoint, the table's name or permissions), not a
    failure of the service (unreachable, throttled, 5xx)."""

    def __init__(self, message: str, *, input_error: bool) -> None:
        super().__init__(message)
        self.input_error = input_error


def read_connections_table(
    table: str, *, region: str | None, endpoint_url: str | None, now_ms: int
) -> list[ConnectionRow]:
    """:func:`read_table` with the caller's AWS configuration (``region`` and
    ``endpoint_url`` override it); every AWS failure becomes one :class:`TableError` line."""
    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    from wsfleet.aws import client_config

    where = f" at {endpoint_url}" if endpoint_url else ""
    try:
        session = boto3.session.Session(region_name=region)
        client = session.client("dynamodb", endpoint_url=endpoint_url, config=client_config())
        return read_table(client, table, now_ms)[0]
    except NoRegionError:
        raise TableError(
            "no AWS region: pass --region or set AWS_DEFAULT_REGION (or configure one with "
            "`aws configure`)", input_error=True,
        ) from None  # fmt: skip
    except (NoCredentialsError, PartialCredentialsError):
        raise TableError(
            "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or `aws sso login`)", input_error=True,
        ) from None  # fmt: skip
    except ValueError as exc:  # botocore: "Invalid endpoint: ..."
        raise TableError(f"--endpoint: {exc}", input_error=True) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "error"))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code == "ResourceNotFoundException":
            place = f"region {client.meta.region_name}{where}"
            raise TableError(f"table {table!r} not found in {place}", input_error=True) from None
        throttled = "Throttl" in code or code in ("ProvisionedThroughputExceededException",
                                                  "RequestLimitExceeded")  # fmt: skip
        message = f"{code}: {error.get('Message', '')}".rstrip(": ")
        raise TableError(f"cannot read table {table!r}: {message}",
                         input_error=status < 500 and not throttled) from None  # fmt: skip
    except BotoCoreError as exc:  # unreachable endpoint, timeouts, ...
        raise TableError(f"cannot read table {table!r}{where}: {exc}", input_error=False) from None


def read_table(
    client: Any, table: str, now_ms: int
) -> tuple[list[ConnectionRow], dict[str, WorkerRecord]]:
    """One row per connection item of ``table`` and the worker records by id (one consistent
    scan), each row's lease judged by its owner's worker item as of ``now_ms``."""
    connection_items, worker_items = scan_table(client, table)
    workers = {w.worker_id: w for w in map(WorkerRecord.from_item, worker_items)}
    rows = []
    for item in connection_items:
        record = ConnectionRecord.from_item(item)
        view = connection_view(record, workers.get(record.lease_owner), now_ms)
        rows.append(ConnectionRow.from_api(view))
    return rows, workers


def scan_table(client: Any, table: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(connection items, worker items) of a connections table, deserialised (consistent scan)."""
    from boto3.dynamodb.types import TypeDeserializer

    deserializer = TypeDeserializer()
    connections: list[dict[str, Any]] = []
    workers: list[dict[str, Any]] = []
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for raw in page.get("Items", []):
            item = {key: deserializer.deserialize(value) for key, value in raw.items()}
            pk = str(item.get("pk", ""))
            if pk.startswith(CONNECTION_PREFIX):
                connections.append(item)
            elif pk.startswith(WORKER_PREFIX):
                workers.append(item)
    return connections, workers
