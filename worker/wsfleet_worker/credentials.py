"""Upstream credentials by reference: resolve a secret's value at connect time.

A connection record names a secret (:class:`wsfleet.upstream_options.Credential`: a Secrets
Manager secret ARN or an SSM SecureString parameter ARN), never its value. A session asks
:class:`SecretResolver` for the value at each connect:

* through Powertools' parameters providers (``SecretsProvider``; ``SSMProvider`` with
  ``decrypt=True``), with boto3 clients built like the worker's others (``AWS_ENDPOINT_URL``
  honoured by boto3 itself, short timeouts, botocore's ``standard`` retry mode), one per
  service and region of the ARN;
* cached for ``WORKER_SECRET_CACHE_SECONDS`` (the providers' ``max_age``), so a thousand
  reconnects after a network blip cost one read, and a rotated secret is used from the first
  connect after the cached value aged out;
* concurrent connects for the same reference share one request (a takeover of a dead worker's
  connections opens many sessions that name the same secret at once);
* read in the worker's I/O thread pool (the providers are blocking);
* read again at once, bypassing the cache, when the upstream refuses a handshake that carried
  it with 401 or 403 (:meth:`SecretResolver.refresh`): the secret may have been rotated, and
  waiting for the cached value to age out would cost up to ``WORKER_SECRET_CACHE_SECONDS`` of
  refused handshakes. At most one such read per reference every
  :data:`REFRESH_INTERVAL_SECONDS` (:func:`refresh_due`), so a wrong secret cannot turn every
  reconnect into a Secrets Manager or SSM request.

A value that cannot be had raises :class:`CredentialUnavailable`, whose message names the
reference and the AWS error code, never the value (nor anything derived from it). The session
treats it as a failed connect that counts toward the crash-loop breaker.

Example::

    resolver = SecretResolver(offloader.io, ttl_seconds=60)
    value = await resolver.resolve(credential)   # the header value is credential.render(value)
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aws_lambda_powertools.utilities.parameters import SecretsProvider, SSMProvider
from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.aws import client_config
from wsfleet.exceptions import WsfleetError
from wsfleet.upstream_options import Credential, CredentialPlacement

__all__ = [
    "REFRESH_INTERVAL_SECONDS",
    "CredentialUnavailable",
    "SecretResolver",
    "parameter_name",
    "refresh_due",
    "secret_value",
]

#: A header value (after ``format``): visible ASCII, space and tab, so a secret with a line
#: break cannot inject a header of its own.
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: Largest value used (Secrets Manager allows 64 KiB; no header or token needs more than this).
MAX_SECRET_CHARS = 16 * 1024

#: A reference whose handshake was refused is re-read at most this often (per worker).
REFRESH_INTERVAL_SECONDS = 30.0

#: ``run(fn, *args)`` runs a blocking call off the event loop (the worker's Offloader.io).
Runner = Callable[..., Awaitable[Any]]


class CredentialUnavailable(WsfleetError):
    """The secret a connection names could not be read or used. Names the reference only."""

    def __init__(self, ref: str, why: str) -> None:
        super().__init__(f"credential {ref} unavailable: {why}")
        self.ref = ref


def parameter_name(arn: str) -> str:
    """The SSM parameter name of a parameter ARN (hierarchical names start with ``/``).

    >>> parameter_name("arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/feed/token")
    '/wsfleet/feed/token'
    >>> parameter_name("arn:aws:ssm:eu-west-1:123456789012:parameter/token")
    'token'
    """
    rest = arn.split(":parameter/", 1)[1]
    return "/" + rest if "/" in rest else rest


def _region(arn: str) -> str:
    return arn.split(":")[3]


def secret_value(credential: Credential, raw: object) -> str:
    """The usable secret from what the provider returned: ``json_key`` picked, checked for
    its placement. Pure; errors never quote the value.

    >>> from wsfleet.upstream_options import Credential, CredentialPlacement as P
    >>> ref = "arn:aws:secretsmanager:us-east-1:123456789012:secret:feed"
    >>> secret_value(Credential(ref, P.HEADER, "Authorization", json_key="t"), '{"t": "abc"}')
    'abc'
    """
    ref = credential.ref
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CredentialUnavailable(ref, "the secret is binary, not UTF-8 text") from None
    if not isinstance(raw, str):
        raise CredentialUnavailable(ref, "the secret has no text value")
    value = raw
    if credential.json_key is not None:
        try:
            document = json.loads(raw)
        except ValueError:
            raise CredentialUnavailable(ref, "json_key is set but the secret is not JSON") from None
        picked = document.get(credential.json_key) if isinstance(document, dict) else None
        if not isinstance(picked, str):
            raise CredentialUnavailable(
                ref, f"the secret has no string at json_key {credential.json_key!r}"
            )
        value = picked
    if not value:
        raise CredentialUnavailable(ref, "the secret is empty")
    if len(value) > MAX_SECRET_CHARS:
        raise CredentialUnavailable(ref, f"the secret is longer than {MAX_SECRET_CHARS} characters")
    if credential.placement is CredentialPlacement.HEADER and not _HEADER_VALUE.fullmatch(
        credential.render(value)
    ):
        raise CredentialUnavailable(
            ref, "the secret is not a valid header value (printable ASCII, no line breaks)"
        )
    return value


def refresh_due(last_refresh: float | None, now: float, interval: float) -> bool:
    """May a refused handshake re-read the secret now? Once per ``interval`` per reference.

    >>> refresh_due(None, 5.0, 30.0), refresh_due(5.0, 34.9, 30.0), refresh_due(5.0, 35.0, 30.0)
    (True, False, True)
    """
    return last_refresh is None or now - last_refresh >= interval


def _why(exc: BaseException) -> str:
    """The AWS error code (or exception type) behind a provider failure: never its text,
    which for some services quotes what was sent."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ClientError):
            return str(cause.response.get("Error", {}).get("Code") or "ClientError")
        if isinstance(cause, BotoCoreError):
            return type(cause).__name__
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


class SecretResolver:
    """Resolves credential references for one worker (see the module docstring).

    :param run: runs a blocking call off the loop (``Offloader.io``).
    :param ttl_seconds: ``WORKER_SECRET_CACHE_SECONDS``; 0 reads at every connect.
    :param client_factory: ``(service, region) -> boto3 client``; tests may pass their own.
    :param refresh_interval_seconds: at most one :meth:`refresh` read per reference this often.
    :param clock: monotonic seconds (tests may pass their own).
    """

    def __init__(
        self,
        run: Runner,
        *,
        ttl_seconds: float,
        client_factory: Callable[[str, str], Any] | None = None,
        refresh_interval_seconds: float = REFRESH_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self._ttl = max(0, int(ttl_seconds))
        self._client_factory = client_factory or _default_client
        self._providers: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()  # providers are built in I/O threads
        self._inflight: dict[str, asyncio.Future[object]] = {}
        self._refresh_interval = refresh_interval_seconds
        self._clock = clock
        self._refreshed_at: dict[str, float] = {}
        self.reads = 0  # provider calls made (cache hits included), for tests and the bench
        self.refreshes = 0  # reads that bypassed the cache after a refused handshake

    async def resolve(self, credential: Credential) -> str:
        """The secret's value for ``credential``; raises :class:`CredentialUnavailable`."""
        ref = credential.ref
        shared = self._inflight.get(ref)
        if shared is None:
            shared = asyncio.ensure_future(self._run(self._fetch, credential))
            self._inflight[ref] = shared
            shared.add_done_callback(lambda f: self._forget(ref, f))
        # shield: one waiter being cancelled (its session ended) must not cancel the others'.
        raw = await asyncio.shield(shared)
        return secret_value(credential, raw)

    async def refresh(self, credential: Credential) -> bool:
        """A handshake carrying ``credential`` was refused (401/403): read the secret again,
        bypassing the cache, so the next connect presents a rotated value. Skipped (False)
        when this reference was re-read less than the refresh interval ago; concurrent
        refreshes share one read. Raises :class:`CredentialUnavailable` like :meth:`resolve`.
        """
        ref = credential.ref
        now = self._clock()
        if not refresh_due(self._refreshed_at.get(ref), now, self._refresh_interval):
            return False
        self._refreshed_at[ref] = now
        self.refreshes += 1
        # The forced read replaces the cached value; a resolve() in flight shares it.
        shared = asyncio.ensure_future(self._run(self._fetch, credential, True))
        self._inflight[ref] = shared
        shared.add_done_callback(lambda f: self._forget(ref, f))
        secret_value(credential, await asyncio.shield(shared))
        return True

    def _forget(self, ref: str, future: asyncio.Future[object]) -> None:
        if self._inflight.get(ref) is future:
            del self._inflight[ref]

    def _provider(self, service: str, region: str) -> Any:
        with self._lock:
            provider = self._providers.get((service, region))
            if provider is None:
                client = self._client_factory(service, region)
                provider = (
                    SSMProvider(boto3_client=client)
                    if service == "ssm"
                    else SecretsProvider(boto3_client=client)
                )
                self._providers[(service, region)] = provider
            return provider

    def _fetch(self, credential: Credential, force: bool = False) -> object:
        """Blocking: one provider call (answered from its cache while the value is young,
        unless ``force``)."""
        ref, service = credential.ref, credential.service
        self.reads += 1
        try:
            provider = self._provider(service, _region(ref))
            if service == "ssm":
                return provider.get(
                    parameter_name(ref), max_age=self._ttl, decrypt=True, force_fetch=force
                )
            return provider.get(ref, max_age=self._ttl, force_fetch=force)
        except Exception as exc:  # the providers wrap everything in GetParameterError
            raise CredentialUnavailable(ref, _why(exc)) from None


def _default_client(service: str, region: str) -> Any:
    import boto3

    session: Any = boto3.session.Session()
    return session.client(
        service, region_name=region, config=client_config(retry_mode="standard", max_attempts=3)
    )
