"""Lambda event builders: the exact shapes AWS hands the handlers, built from local inputs.

The handlers must not know they run locally, so what the local API, the scheduler and the
streams poller pass them has to be indistinguishable from what API Gateway (REST proxy
integration), EventBridge Scheduler and the DynamoDB Streams event source mapping send.
These builders are pure (the clock and ids are arguments), so unit tests can compare them
field by field with the samples in ``events/``.

Example::

    >>> event = api_gateway_event(
    ...     method="GET", path="/connections/abc", resource="/connections/{id}",
    ...     path_parameters={"id": "abc"}, headers=[("Host", "127.0.0.1")], query="", body=b"",
    ...     stage="dev", request_id="r-1", source_ip="127.0.0.1", now=0.0)
    >>> event["pathParameters"], event["requestContext"]["stage"]
    ({'id': 'abc'}, 'dev')
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from .stack import LOCAL_ACCOUNT_ID

__all__ = [
    "LOCAL_API_ID",
    "api_gateway_event",
    "lambda_stream_record",
    "scheduler_event",
    "stream_batch_event",
]

#: The REST API id local events carry (10 lowercase characters, like a real one).
LOCAL_API_ID = "wsfleetloc"

_TEXT_TYPES = ("text/", "application/json", "application/x-www-form-urlencoded", "application/xml")


def _multi(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for key, value in pairs:
        grouped.setdefault(key, []).append(value)
    return grouped


def _is_text(content_type: str | None) -> bool:
    return (
        not content_type or content_type.lower().startswith(_TEXT_TYPES) or "json" in content_type
    )


def api_gateway_event(
    *,
    method: str,
    path: str,
    resource: str,
    path_parameters: Mapping[str, str] | None,
    headers: Iterable[tuple[str, str]],
    query: str,
    body: bytes,
    stage: str,
    request_id: str,
    source_ip: str,
    now: float,
) -> dict[str, Any]:
    """An API Gateway REST (v1) proxy event, as the Lambda proxy integration sends it.

    ``path`` is the resource path without the stage; a single-value map keeps the last value
    of a repeated header/query key, as API Gateway does. Bodies that are not text are sent
    base64-encoded with ``isBase64Encoded`` set; an empty body is ``null``.
    """
    header_pairs = list(headers)
    query_pairs = parse_qsl(query, keep_blank_values=True)
    header_map = {key: value for key, value in header_pairs}
    content_type = next((v for k, v in header_pairs if k.lower() == "content-type"), None)
    if not body:
        body_text, encoded = None, False
    elif _is_text(content_type):
        try:
            body_text, encoded = body.decode("utf-8"), False
        except UnicodeDecodeError:
            body_text, encoded = base64.b64encode(body).decode("ascii"), True
    else:
        body_text, encoded = base64.b64encode(body).decode("ascii"), True
    when = dt.datetime.fromtimestamp(now, tz=dt.UTC)
    user_agent = next((v for k, v in header_pairs if k.lower() == "user-agent"), None)
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method.upper(),
        "headers": header_map or None,
        "multiValueHeaders": _multi(header_pairs) or None,
        "queryStringParameters": {key: value for key, value in query_pairs} or None,
        "multiValueQueryStringParameters": _multi(query_pairs) or None,
        "pathParameters": dict(path_parameters) if path_parameters else None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local",
            "resourcePath": resource,
            "httpMethod": method.upper(),
            "extendedRequestId": request_id,
            "requestTime": when.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "path": f"/{stage}{path}",
            "accountId": LOCAL_ACCOUNT_ID,
            "protocol": "HTTP/1.1",
            "stage": stage,
            "domainPrefix": LOCAL_API_ID,
            "requestTimeEpoch": int(now * 1000),
            "requestId": request_id,
            "identity": {
                "cognitoIdentityPoolId": None,
                "accountId": None,
                "cognitoIdentityId": None,
                "caller": None,
                "sourceIp": source_ip,
                "principalOrgId": None,
                "accessKey": None,
                "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None,
                "userArn": None,
                "userAgent": user_agent,
                "user": None,
            },
            "domainName": header_map.get("Host") or header_map.get("host") or "127.0.0.1",
            "apiId": LOCAL_API_ID,
        },
        "body": body_text,
        "isBase64Encoded": encoded,
    }


def scheduler_event(
    *,
    schedule_name: str,
    event_id: str,
    now: float,
    region: str = "us-east-1",
    template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What EventBridge Scheduler delivers to a Lambda target for one scheduled run.

    With a ``template`` (a sample from ``events/``), its fields are kept and the per-run ones
    (id, time, schedule ARN) are filled in, so the local event follows the checked-in sample.
    """
    time_text = dt.datetime.fromtimestamp(int(now), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    arn = f"arn:aws:scheduler:{region}:{LOCAL_ACCOUNT_ID}:schedule/default/{schedule_name}"
    event: dict[str, Any] = {
        "version": "0",
        "id": event_id,
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": LOCAL_ACCOUNT_ID,
        "time": time_text,
        "region": region,
        "resources": [arn],
        "detail": {},
    }
    if template is None:
        return event
    filled = json.loads(json.dumps(template))  # a deep copy of plain JSON
    for key in ("id", "time", "region", "account"):
        if key in filled:
            filled[key] = event[key]
    if isinstance(filled.get("resources"), list):
        filled["resources"] = [arn]
    return filled


def _attribute_json(value: Any) -> Any:
    """A DynamoDB AttributeValue with boto3's bytes turned back into base64 text (wire form)."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {key: _attribute_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [_attribute_json(item) for item in value]
    return value


def _epoch_seconds(value: Any) -> int | float:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp())
    return value  # type: ignore[no-any-return]


def lambda_stream_record(
    record: Mapping[str, Any], *, event_source_arn: str, region: str
) -> dict[str, Any]:
    """A DynamoDB Streams record (from ``GetRecords``) in the shape Lambda delivers it.

    GetRecords (through boto3) returns the creation time as a datetime and binary attributes as
    bytes; Lambda sends epoch seconds and base64 text, and adds ``eventSourceARN``.
    """
    source = record.get("dynamodb") or {}
    dynamodb: dict[str, Any] = {}
    if "ApproximateCreationDateTime" in source:
        dynamodb["ApproximateCreationDateTime"] = _epoch_seconds(
            source["ApproximateCreationDateTime"]
        )
    for key in ("Keys", "NewImage", "OldImage"):
        if key in source:
            dynamodb[key] = _attribute_json(source[key])
    for key in ("SequenceNumber", "SizeBytes", "StreamViewType"):
        if key in source:
            dynamodb[key] = source[key]
    lambda_record: dict[str, Any] = {
        "eventID": record.get("eventID"),
        "eventName": record.get("eventName"),
        "eventVersion": record.get("eventVersion", "1.1"),
        "eventSource": record.get("eventSource", "aws:dynamodb"),
        "awsRegion": record.get("awsRegion", region),
        "dynamodb": dynamodb,
        "eventSourceARN": event_source_arn,
    }
    if "userIdentity" in record:
        lambda_record["userIdentity"] = dict(record["userIdentity"])
    return lambda_record


def stream_batch_event(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The event of one DynamoDB Streams invocation: ``{"Records": [...]}``."""
    return {"Records": [dict(record) for record in records]}
