"""Every error wsfleet raises on purpose.

One root, so callers can catch "anything wsfleet said" in one place::

    WsfleetError
    ├── ConfigurationError        a setting is missing or inconsistent
    ├── StoreError                DynamoDB/SQS failed in a way we could not classify
    ├── ConnectionNotFound        no connection item with that pk
    ├── InvalidUpstreamUrl        ws_url refused (scheme, host, SSRF guard); also a ValueError
    ├── InvalidUpstreamOptions    a START's ``upstream`` object refused; also a ValueError
    ├── UpstreamRefused           the worker refused a redirect hop or a resolved address
    ├── WorkerDead                this worker's lease was killed or deleted: never renew again
    └── LeaseError                a conditional lease write was refused; carries `current`
        ├── LeaseConflict         acquire: a live worker holds it (``retry_in_ms``: lapses soon)
        ├── LeaseLost             release/checkpoint: owner or epoch changed (we are fenced)
        └── ConnectionStopped     desired_state is not STARTED any more

Lease errors carry the record DynamoDB returned with the failed condition
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``), so the caller learns *why* without a re-read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .record import ConnectionRecord

__all__ = [
    "ConfigurationError",
    "ConnectionNotFound",
    "ConnectionStopped",
    "InvalidUpstreamOptions",
    "InvalidUpstreamUrl",
    "LeaseConflict",
    "LeaseError",
    "LeaseLost",
    "StoreError",
    "UpstreamRefused",
    "WorkerDead",
    "WsfleetError",
]


class WsfleetError(Exception):
    """Root of every wsfleet error."""


class ConfigurationError(WsfleetError):
    """A setting is missing, malformed, or inconsistent with another one."""


class StoreError(WsfleetError):
    """A DynamoDB or SQS call failed for a reason that is not a domain outcome.

    The original botocore exception is chained (``raise ... from exc``).
    """


class ConnectionNotFound(WsfleetError):
    """There is no connection item for ``pk``."""

    def __init__(self, pk: str) -> None:
        super().__init__(f"connection {pk} not found")
        self.pk = pk


class InvalidUpstreamUrl(WsfleetError, ValueError):
    """``ws_url`` was refused; the message says why (and never repeats the query string).

    Subclasses ValueError too, so a pydantic validator may raise it directly.
    """

    field = "ws_url"


class InvalidUpstreamOptions(WsfleetError, ValueError):
    """A START's ``upstream`` object was refused (:mod:`wsfleet.upstream_options`).

    ``field`` is the offending path (``upstream.headers``, ``upstream.credential.ref``), for
    the router's 422. The message never repeats a header value or a secret reference's tail.
    """

    def __init__(self, message: str, field: str = "upstream") -> None:
        super().__init__(f"{field}: {message}" if not message.startswith(field) else message)
        self.field = field


class UpstreamRefused(WsfleetError):
    """The worker refused to connect: a redirect hop or a resolved address failed the SSRF
    policy (:func:`wsfleet.upstream_url.validate_redirect`,
    :func:`wsfleet.upstream_url.refused_resolution_reason`).

    Not a ValueError on purpose: the URL the router accepted was fine as text; what it led to
    was not. The message names the host and the rule, never a query string.
    """


class WorkerDead(WsfleetError):
    """This worker's lease is over for good: a peer killed it (it had expired) or its item is
    gone. Every session is fenced already or must be now; the process starts over."""


class LeaseError(WsfleetError):
    """A conditional write on a lease was refused.

    ``current`` is the item as DynamoDB saw it when the condition failed (``None`` if absent).
    """

    def __init__(self, message: str, current: ConnectionRecord | None) -> None:
        super().__init__(message)
        self.current = current


class LeaseConflict(LeaseError):
    """Acquire refused: the owner's worker lease is live.

    ``retry_in_ms`` is set when that lease lapses within the early-hint wait budget: trying
    again after that long may take the connection over.
    """

    def __init__(
        self, message: str, current: ConnectionRecord | None, *, retry_in_ms: int | None = None
    ) -> None:
        super().__init__(message, current)
        self.retry_in_ms = retry_in_ms


class LeaseLost(LeaseError):
    """Our lease is gone: the owner or the epoch changed. Stop writing at once (fenced)."""


class ConnectionStopped(LeaseError):
    """The connection's desired_state is STOPPED; the holder must close it."""
