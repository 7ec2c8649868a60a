"""boto3 clients configured the way wsfleet needs them.

* Retries use botocore's own modes, not a loop of ours: ``adaptive`` for DynamoDB (standard
  retries plus client-side rate limiting when throttled, which is what a heartbeat storm
  needs) and ``standard`` for SQS.
* Timeouts are short and explicit. A heartbeat that hangs for botocore's default 60 s read
  timeout would outlive the lease it is renewing.
* The endpoint is never passed here: boto3 reads the standard ``AWS_ENDPOINT_URL`` (and
  ``AWS_ENDPOINT_URL_<SERVICE>``) itself, which is how the embedded moto backend is selected.
"""

from __future__ import annotations

from typing import Any, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionError as BotoConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "READ_TIMEOUT_SECONDS",
    "THROTTLING_CODES",
    "RetryMode",
    "client_config",
    "dynamodb_client",
    "firehose_client",
    "is_ambiguous",
    "is_throttling",
    "kinesis_client",
    "sqs_client",
]

#: botocore's retry modes (``Config(retries={"mode": ...})``).
RetryMode = Literal["legacy", "standard", "adaptive"]
#: Default timeouts of every wsfleet client (SQS long polls raise the read timeout).
CONNECT_TIMEOUT_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 5.0


def client_config(
    *,
    retry_mode: RetryMode = "standard",
    max_attempts: int = 4,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    max_pool_connections: int = 50,
) -> Config:
    """botocore Config with wsfleet's timeouts and a botocore retry mode."""
    return Config(
        retries={"mode": retry_mode, "max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        tcp_keepalive=True,
    )


def dynamodb_client(session: boto3.session.Session | None = None, **config: Any) -> Any:
    """A DynamoDB client with adaptive retries (backs off on throttling)."""
    config.setdefault("retry_mode", "adaptive")
    return (session or boto3).client("dynamodb", config=client_config(**config))


def sqs_client(session: boto3.session.Session | None = None, **config: Any) -> Any:
    """An SQS client with standard retries. Long polls need a read timeout above 20 s."""
    config.setdefault("read_timeout", 25.0)
    return (session or boto3).client("sqs", config=client_config(**config))


def kinesis_client(session: boto3.session.Session | None = None, **config: Any) -> Any:
    """A Kinesis client with standard retries (a throttled PutRecords as a whole is retried by
    botocore; per-record failures are the sink's, :mod:`wsfleet.sinks.records`)."""
    return (session or boto3).client("kinesis", config=client_config(**config))


def firehose_client(session: boto3.session.Session | None = None, **config: Any) -> Any:
    """A Firehose client with standard retries (per-record failures: the sink's)."""
    return (session or boto3).client("firehose", config=client_config(**config))


THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "Throttling",
    "TooManyRequestsException",
    "RequestThrottled",
    "RequestThrottledException",
})


def is_throttling(exc: BaseException) -> bool:
    """DynamoDB/SQS asked us to slow down."""
    return (
        isinstance(exc, ClientError)
        and exc.response.get("Error", {}).get("Code") in THROTTLING_CODES
    )


def is_ambiguous(exc: BaseException) -> bool:
    """The write may or may not have happened: timeouts, dropped connections, 5xx.

    After such a failure the only honest next step is to read the item and look. Throttling
    is not ambiguous: a throttled request was refused before it was applied.
    """
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, BotoConnectionError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500
    return False
