"""LeaseStore: the only place that speaks DynamoDB for the connections table.

Every lease rule in :mod:`wsfleet.lease` has its conditional-write twin here. Writes that can be
refused ask for ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` so a refusal arrives with the
item that caused it and is turned into a domain error from :mod:`wsfleet.exceptions` carrying
that record; no second read is needed to tell "STOPPED" from "lost to another owner".

The store is synchronous (boto3). The worker calls it from a bounded thread pool so the event
loop never blocks; Lambdas call it directly. It takes its client, so tests hand it one that
talks to the embedded moto server.

Example::

    store = LeaseStore(dynamodb_client(), "wsfleet-connections", lease_ms=20_000)
    record = store.acquire("CONN#abc", owner="worker-1")
    lease = Lease.of(record)
    lease = store.renew(lease, last_seq=42)      # heartbeat + checkpoint in one write
    store.release(lease)                         # graceful hand-off: expiry 0
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from .backoff import backoff, is_ambiguous
from .clock import Clock, now_ms
from .exceptions import (
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseLost,
    StoreError,
)
from .lease import (
    Lease,
    RefusalReason,
    is_ours,
    is_own_acquire,
    is_stale_checkpoint,
    refusal_reason,
)
from .record import ConnectionRecord, DesiredState, WorkerRecord, worker_pk

__all__ = ["GSI_NAME", "ConnectionPage", "LeaseStore", "StartResult", "StopResult"]

GSI_NAME = "gsi_desired_state_lease"
_MAX_ERROR_CHARS = 1024
_BATCH_GET_LIMIT = 100
#: Checkpoints only move forward (see LeaseStore._holder_write).
_MONOTONIC_SEQ = "(attribute_not_exists(last_seq) OR last_seq <= :seq)"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _dump(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in item.items()}


def _load(item: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not item:
        return None
    return {k: _deserializer.deserialize(v) for k, v in item.items()}


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": _serializer.serialize(v) for k, v in values.items()}


def _may_have_landed(exc: StoreError) -> bool:
    """The failed write may have been applied anyway (a timeout, a 5xx): only a read tells."""
    return exc.__cause__ is not None and is_ambiguous(exc.__cause__)


def _is_condition_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


@dataclass(frozen=True)
class StartResult:
    """Outcome of :meth:`LeaseStore.start`: the record as it now stands and what happened."""

    record: ConnectionRecord
    created: bool = False
    restarted: bool = False


@dataclass(frozen=True)
class StopResult:
    """Outcome of :meth:`LeaseStore.stop`: the record and whether this call stopped it."""

    record: ConnectionRecord
    stopped: bool


@dataclass(frozen=True)
class ConnectionPage:
    """One page of :meth:`LeaseStore.list_connections`; ``next_key`` is None on the last."""

    records: list[ConnectionRecord]
    next_key: dict[str, Any] | None


class LeaseStore:
    """Conditional reads and writes of connection and worker items.

    :param client: a boto3 DynamoDB client (see :func:`wsfleet.aws.dynamodb_client`).
    :param table_name: the connections table.
    :param lease_ms: how far ahead acquire and renew push the expiry.
    :param stopped_retention_ms: TTL given to STOPPED items (``expires_at``); 0 keeps them.
    :param clock: wall clock in epoch ms, injectable for tests.
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        lease_ms: int = 20_000,
        stopped_retention_ms: int = 0,
        clock: Clock = now_ms,
    ) -> None:
        self._client = client
        self.table_name = table_name
        self.lease_ms = lease_ms
        self.stopped_retention_ms = stopped_retention_ms
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Any, client: Any = None) -> LeaseStore:
        """Build from :class:`wsfleet.settings.Settings`, creating a client if none is given."""
        if client is None:
            from .aws import dynamodb_client

            client = dynamodb_client()
        return cls(
            client,
            settings.connections_table,
            lease_ms=settings.lease_ms,
            stopped_retention_ms=int(settings.stopped_retention_days * 86_400_000),
        )

    # ------------------------------------------------------------------ low level
    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response: dict[str, Any] = getattr(self._client, operation)(
                TableName=self.table_name, **kwargs
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise
            raise StoreError(f"{operation} on {self.table_name} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"{operation} on {self.table_name} failed: {exc}") from exc
        return response

    def _pages(self, operation: str, *, page_size: int, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every page of ``operation`` (a boto3 paginator, ``page_size`` items per call),
        fetched lazily: a caller that stops early issues no further calls."""
        pages = self._client.get_paginator(operation).paginate(
            TableName=self.table_name, PaginationConfig={"PageSize": page_size}, **kwargs
        )
        try:
            yield from pages
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"{operation} on {self.table_name} failed: {exc}") from exc

    def _conditional_update(self, pk: str, **kwargs: Any) -> dict[str, Any]:
        """UpdateItem returning ALL_NEW; a refusal raises ClientError with ``Item`` = ALL_OLD."""
        response = self._call(
            "update_item",
            Key=_dump({"pk": pk}),
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **kwargs,
        )
        return _load(response.get("Attributes")) or {}

    def _refused_record(self, exc: ClientError, pk: str) -> ConnectionRecord | None:
        """The item that made a conditional write fail.

        DynamoDB returns it with the refusal (ALL_OLD). A refusal without it means the item is
        absent, or the backend ignores ReturnValuesOnConditionCheckFailure (dynalite does), so
        a consistent read settles which.
        """
        old_item = exc.response.get("Item")  # DynamoDB adds it to the common error shape
        item = _load(old_item) if isinstance(old_item, Mapping) else None
        if item:
            return ConnectionRecord.from_item(item)
        return self.get(pk, consistent=True)

    def _stopped_ttl(self, now: int) -> dict[str, Any]:
        if self.stopped_retention_ms <= 0:
            return {}
        return {"expires_at": (now + self.stopped_retention_ms) // 1000}

    # ------------------------------------------------------------------ reads
    def get(self, pk: str, *, consistent: bool = True) -> ConnectionRecord | None:
        """The connection item for ``pk``, or None."""
        response = self._call("get_item", Key=_dump({"pk": pk}), ConsistentRead=consistent)
        item = _load(response.get("Item"))
        return ConnectionRecord.from_item(item) if item else None

    def batch_get(
        self, pks: Iterable[str], *, consistent: bool = False
    ) -> dict[str, ConnectionRecord]:
        """Many connection items in as few BatchGetItem calls as possible (100 keys each).

        Unprocessed keys are retried with jittered backoff; missing items are simply absent
        from the result.
        """
        return {
            pk: ConnectionRecord.from_item(item)
            for pk, item in self._batch_get_items(pks, consistent=consistent).items()
        }

    def _batch_get_items(
        self, pks: Iterable[str], *, consistent: bool
    ) -> dict[str, dict[str, Any]]:
        unique = list(dict.fromkeys(pks))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(unique), _BATCH_GET_LIMIT):
            request: dict[str, Any] = {
                self.table_name: {
                    "Keys": [_dump({"pk": pk}) for pk in unique[start:start + _BATCH_GET_LIMIT]],
                    "ConsistentRead": consistent,
                }
            }
            delays = backoff()
            while request:
                try:
                    response = self._client.batch_get_item(RequestItems=request)
                except (ClientError, BotoCoreError) as exc:
                    raise StoreError(f"batch_get_item on {self.table_name} failed: {exc}") from exc
                for raw in response.get("Responses", {}).get(self.table_name, []):
                    item = _load(raw)
                    assert item is not None
                    found[str(item["pk"])] = item
                request = response.get("UnprocessedKeys") or {}
                if request:
                    time.sleep(next(delays))
        return found

    # ------------------------------------------------------------------ API-side writes
    def start(self, connection_id: str, ws_url: str, *, resume: bool = True) -> StartResult:
        """Create a STARTED connection, or leave a live one exactly as it is.

        * New id: the item is created with no lease (``created=True``).
        * Already STARTED: nothing is written. Re-sending START must never reset a live lease,
          which would move a healthy stream to another worker.
        * STOPPED or FAILED: flipped back to STARTED (``restarted=True``). ``last_seq`` is kept
          when the URL is unchanged, so the stream resumes where it stopped; a new URL starts
          from 0. The crash-loop breaker's count is reset.
        """
        now = self._clock()
        record = ConnectionRecord.new(connection_id, ws_url, now).with_changes(resume=resume)
        try:
            self._call(
                "put_item",
                Item=_dump(record.to_item()),
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
            return StartResult(record, created=True)
        except ClientError as exc:
            current = self._refused_record(exc, record.pk)
        if current is None:  # only if it was deleted between our write and our read
            raise StoreError(f"start of {record.pk} refused, but the item is gone; retry")
        if current.desired_state is DesiredState.STARTED:
            return StartResult(current)
        try:
            item = self._conditional_update(
                current.pk,
                UpdateExpression=(
                    "SET desired_state = :started, ws_url = :url, updated_at_ms = :now, "
                    "#resume = :resume, last_seq = :seq "
                    "REMOVE stop_reason, last_error, expires_at, failure_count, failure_seq"
                ),
                ConditionExpression="desired_state IN (:stopped, :failed)",
                ExpressionAttributeNames={"#resume": "resume"},
                ExpressionAttributeValues=_values(
                    started=DesiredState.STARTED.value,
                    stopped=DesiredState.STOPPED.value,
                    failed=DesiredState.FAILED.value,
                    url=ws_url,
                    now=now,
                    resume=resume,
                    seq=current.last_seq if current.ws_url == ws_url else 0,
                ),
            )
        except ClientError as exc:  # a concurrent START won the restart: report its result
            winner = self._refused_record(exc, current.pk)
            if winner is None:
                raise ConnectionNotFound(current.pk) from exc
            return StartResult(winner)
        return StartResult(ConnectionRecord.from_item(item), restarted=True)

    def stop(self, pk: str, *, reason: str = "stopped") -> StopResult:
        """Set desired_state to STOPPED (idempotent). Raises ConnectionNotFound for unknown pk.

        ``stopped`` is False when the connection was already STOPPED (nothing was written).

        The lease is left alone: its holder learns of the STOP from its control channel or its
        next renewal, closes, and releases.
        """
        now = self._clock()
        ttl = self._stopped_ttl(now)
        set_ttl = ", expires_at = :ttl" if ttl else ""
        try:
            item = self._conditional_update(
                pk,
                UpdateExpression=(
                    "SET desired_state = :stopped, stop_reason = :reason, updated_at_ms = :now"
                    + set_ttl
                ),
                ConditionExpression="attribute_exists(pk) AND desired_state <> :stopped",
                ExpressionAttributeValues=_values(
                    stopped=DesiredState.STOPPED.value,
                    reason=reason,
                    now=now,
                    **({"ttl": ttl["expires_at"]} if ttl else {}),
                ),
            )
        except ClientError as exc:
            current = self._refused_record(exc, pk)
            if current is None:
                raise ConnectionNotFound(pk) from exc
            return StopResult(current, stopped=False)
        return StopResult(ConnectionRecord.from_item(item), stopped=True)

    def list_connections(
        self,
        state: DesiredState,
        *,
        limit: int = 50,
        start_key: Mapping[str, Any] | None = None,
    ) -> ConnectionPage:
        """One page of connections in ``state`` (via the GSI, oldest lease expiry first)."""
        kwargs: dict[str, Any] = {}
        if start_key:
            kwargs["ExclusiveStartKey"] = _dump(start_key)
        response = self._call(
            "query",
            IndexName=GSI_NAME,
            KeyConditionExpression="desired_state = :state",
            ExpressionAttributeValues=_values(state=state.value),
            Limit=limit,
            **kwargs,
        )
        records = [
            ConnectionRecord.from_item(_load(raw) or {}) for raw in response.get("Items", [])
        ]
        return ConnectionPage(records, _load(response.get("LastEvaluatedKey")))

    # ------------------------------------------------------------------ holder writes
    def acquire(self, pk: str, owner: str) -> ConnectionRecord:
        """Take the lease if the connection is STARTED and nobody holds a live lease.

        Bumps ``lease_epoch`` so every later write of the previous holder is fenced.
        Raises LeaseConflict (live lease elsewhere), ConnectionStopped, or ConnectionNotFound.
        An attempt whose answer was lost but whose write landed is recognised by the expiry it
        wrote (:func:`~wsfleet.lease.is_own_acquire`), whether botocore's retry was refused
        or the call failed ambiguously: the caller holds that lease, so it is returned.
        """
        now = self._clock()
        expires = now + self.lease_ms
        try:
            item = self._conditional_update(
                pk,
                UpdateExpression=(
                    "SET lease_owner = :owner, lease_expires_at_ms = :expires, "
                    "updated_at_ms = :now ADD lease_epoch :one"
                ),
                ConditionExpression=(
                    "attribute_exists(pk) AND desired_state = :started AND "
                    "(attribute_not_exists(lease_expires_at_ms) OR lease_expires_at_ms < :now)"
                ),
                ExpressionAttributeValues=_values(
                    owner=owner,
                    expires=expires,
                    now=now,
                    one=1,
                    started=DesiredState.STARTED.value,
                ),
            )
        except StoreError as exc:
            if not _may_have_landed(exc):
                raise
            return self._settle_ambiguous_acquire(pk, owner, expires, exc)
        except ClientError as exc:
            current = self._refused_record(exc, pk)
            if is_own_acquire(current, owner, expires):
                return current
            if current is None:
                raise ConnectionNotFound(pk) from exc
            if current.desired_state is DesiredState.STOPPED:
                raise ConnectionStopped(f"{pk} is STOPPED", current) from exc
            raise LeaseConflict(f"{pk} is held by {current.lease_owner!r}", current) from exc
        return ConnectionRecord.from_item(item)

    def renew(self, lease: Lease, *, last_seq: int | None = None) -> Lease:
        """Extend our lease; optionally checkpoint ``last_seq`` in the same write.

        Raises ConnectionStopped (still ours, but STOP was requested) or LeaseLost (fenced).
        An ambiguous failure (timeout, 5xx) re-reads the item: if owner and epoch are still
        ours the lease is accepted with the expiry actually stored, since the write may or may
        not have landed. Anything else raises StoreError; the caller keeps its old lease and
        its self-fence deadline.
        """
        now = self._clock()
        set_seq = ", last_seq = :seq" if last_seq is not None else ""
        seq_guard = f" AND {_MONOTONIC_SEQ}" if last_seq is not None else ""
        values: dict[str, Any] = {
            "owner": lease.owner,
            "epoch": lease.epoch,
            "expires": now + self.lease_ms,
            "now": now,
            "started": DesiredState.STARTED.value,
        }
        if last_seq is not None:
            values["seq"] = last_seq
        try:
            self._conditional_update(
                lease.pk,
                UpdateExpression=(
                    "SET lease_expires_at_ms = :expires, updated_at_ms = :now" + set_seq
                ),
                ConditionExpression=(
                    "lease_owner = :owner AND lease_epoch = :epoch AND desired_state = :started"
                    + seq_guard
                ),
                ExpressionAttributeValues=_values(**values),
            )
        except ClientError as exc:
            current = self._refused_record(exc, lease.pk)
            if last_seq is not None and is_stale_checkpoint(current, lease, last_seq):
                return self.renew(lease)  # a later checkpoint of ours landed first: keep it
            self._raise_refusal(lease, current, exc)
        except StoreError as exc:
            if not _may_have_landed(exc):
                raise
            return self._settle_ambiguous_renew(lease, exc)
        return lease.extended_to(values["expires"])

    def _settle_ambiguous_acquire(
        self, pk: str, owner: str, expires: int, original: StoreError
    ) -> ConnectionRecord:
        try:
            current = self.get(pk, consistent=True)
        except StoreError:
            raise original from None
        if is_own_acquire(current, owner, expires):
            return current
        raise original

    def _settle_ambiguous_renew(self, lease: Lease, original: StoreError) -> Lease:
        try:
            current = self.get(lease.pk, consistent=True)
        except StoreError:
            raise original from None
        if current is not None and current.desired_state is DesiredState.STARTED and is_ours(
            current, lease
        ):
            return lease.extended_to(current.lease_expires_at_ms)
        self._raise_refusal(lease, current, original)

    @staticmethod
    def _raise_refusal(
        lease: Lease, current: ConnectionRecord | None, cause: BaseException
    ) -> NoReturn:
        reason = refusal_reason(current, lease)
        if reason is RefusalReason.STOPPED:
            raise ConnectionStopped(f"{lease.pk} was stopped", current) from cause
        raise LeaseLost(
            f"{lease.pk} lease epoch {lease.epoch} of {lease.owner!r} is no longer held ({reason})",
            current,
        ) from cause

    def _holder_write(
        self, lease: Lease, assignments: str, *, last_seq: int | None = None, **values: Any
    ) -> ConnectionRecord:
        """An UpdateItem allowed only while owner and epoch are ours (STOPPED or not).

        ``last_seq``, when given, is written only if it does not move the checkpoint back: two
        writes of one holder can land out of order (a retried request, a paused process), and
        the checkpoint must never regress. If a later checkpoint of ours already landed, the
        write goes ahead without the stale one.
        """
        update, condition = "SET " + assignments, "lease_owner = :owner AND lease_epoch = :epoch"
        if last_seq is not None:
            update += ", last_seq = :seq"
            condition += f" AND {_MONOTONIC_SEQ}"
            values["seq"] = last_seq
        try:
            item = self._conditional_update(
                lease.pk,
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues=_values(owner=lease.owner, epoch=lease.epoch, **values),
            )
        except ClientError as exc:
            current = self._refused_record(exc, lease.pk)
            if last_seq is not None and is_stale_checkpoint(current, lease, last_seq):
                values.pop("seq")
                return self._holder_write(lease, assignments, **values)
            raise LeaseLost(
                f"{lease.pk} lease epoch {lease.epoch} of {lease.owner!r} is no longer held",
                current,
            ) from exc
        return ConnectionRecord.from_item(item)

    def checkpoint(self, lease: Lease, last_seq: int) -> None:
        """Record ``last_seq`` as durable (never backwards). Fenced by owner and epoch."""
        self._holder_write(lease, "updated_at_ms = :now", last_seq=last_seq, now=self._clock())

    def release(self, lease: Lease, *, last_seq: int | None = None) -> ConnectionRecord:
        """Give the lease up now (owner "", expiry 0; the epoch is kept so it keeps counting).

        The final checkpoint can ride along. Raises LeaseLost if it was not ours any more.
        """
        return self._holder_write(
            lease,
            "lease_owner = :empty, lease_expires_at_ms = :zero, updated_at_ms = :now",
            last_seq=last_seq,
            empty="",
            zero=0,
            now=self._clock(),
        )

    def mark_stopped(
        self, lease: Lease, reason: str, *, last_seq: int | None = None
    ) -> ConnectionRecord:
        """The holder ends the connection for good (e.g. the upstream closed normally).

        STOPPED + stop_reason + release, in one write conditional on owner and epoch.
        """
        now = self._clock()
        ttl = self._stopped_ttl(now)
        extra: dict[str, Any] = {"ttl": ttl["expires_at"]} if ttl else {}
        return self._holder_write(
            lease,
            "desired_state = :stopped, stop_reason = :reason, lease_owner = :empty, "
            "lease_expires_at_ms = :zero, updated_at_ms = :now"
            + (", expires_at = :ttl" if ttl else ""),
            last_seq=last_seq,
            stopped=DesiredState.STOPPED.value,
            reason=reason,
            empty="",
            zero=0,
            now=now,
            **extra,
        )

    def record_error(self, lease: Lease, message: str) -> None:
        """Note the latest upstream trouble on the record (truncated), fenced by owner+epoch."""
        self._holder_write(
            lease,
            "last_error = :error, updated_at_ms = :now",
            error=message[:_MAX_ERROR_CHARS],
            now=self._clock(),
        )

    def note_failure(self, lease: Lease, error: str, *, count: int, at_seq: int) -> None:
        """Count a crash-loop failure on the item (survives hand-overs), with ``last_error``.

        Fenced by owner+epoch: only the holder counts, so two workers never count one failure.
        ``count``/``at_seq`` come from :func:`wsfleet.lease.breaker_verdict`.
        """
        self._holder_write(
            lease,
            "failure_count = :count, failure_seq = :at, last_error = :error, updated_at_ms = :now",
            count=count,
            at=at_seq,
            error=error[:_MAX_ERROR_CHARS],
            now=self._clock(),
        )

    def mark_failed(
        self, lease: Lease, reason: str, *, count: int, at_seq: int, last_seq: int | None = None
    ) -> ConnectionRecord:
        """The breaker tripped: FAILED + reason + release, in one write fenced by owner+epoch.

        FAILED is terminal until a new START (``LeaseStore.start``). It is out of the orphan
        GSI query (``desired_state = STARTED``), so the reconciler never re-hints it, and it gets
        no TTL: an operator must be able to find it (``GET /connections?state=FAILED``).
        """
        return self._holder_write(
            lease,
            "desired_state = :failed, stop_reason = :reason, last_error = :reason, "
            "failure_count = :count, failure_seq = :at, lease_owner = :empty, "
            "lease_expires_at_ms = :zero, updated_at_ms = :now",
            last_seq=last_seq,
            failed=DesiredState.FAILED.value,
            reason=reason[:_MAX_ERROR_CHARS],
            count=count,
            at=at_seq,
            empty="",
            zero=0,
            now=self._clock(),
        )

    # ------------------------------------------------------------------ reconciler
    def query_orphans(self, before_ms: int, *, page_size: int = 500) -> Iterator[ConnectionRecord]:
        """Every STARTED connection whose lease expires before ``before_ms``, all GSI pages.

        With ``before_ms = now`` these are orphans; with ``now + pass interval`` the reconciler
        also sees leases that will lapse before its next pass (early hints).
        """
        pages = self._pages(
            "query",
            page_size=page_size,
            IndexName=GSI_NAME,
            KeyConditionExpression="desired_state = :started AND lease_expires_at_ms < :before",
            ExpressionAttributeValues=_values(started=DesiredState.STARTED.value, before=before_ms),
        )
        for page in pages:
            for raw in page.get("Items", []):
                yield ConnectionRecord.from_item(_load(raw) or {})

    def claim_hint(self, record: ConnectionRecord, *, rehint_after_ms: int) -> bool:
        """Mark that a hint is going out for this lease; False if one already did.

        Keeps the hint queue to at most one pending hint per orphan: a hint is claimed once per
        lease state ``(lease_epoch, lease_expires_at_ms)`` and again only after
        ``rehint_after_ms`` (a lost hint must not strand a connection forever). The epoch is
        part of the key because every released lease has expiry 0: without it, a connection
        released twice within ``rehint_after_ms`` would look already hinted. The condition also
        re-checks that the lease is the one the caller saw, so a lease renewed or acquired
        meanwhile is not hinted.
        """
        now = self._clock()
        try:
            self._conditional_update(
                record.pk,
                UpdateExpression=(
                    "SET hinted_expiry_ms = :expiry, hinted_epoch = :epoch, hinted_at_ms = :now"
                ),
                ConditionExpression=(
                    "desired_state = :started AND lease_expires_at_ms = :expiry AND "
                    "lease_epoch = :epoch AND (attribute_not_exists(hinted_at_ms) "
                    "OR hinted_expiry_ms <> :expiry OR hinted_epoch <> :epoch "
                    "OR hinted_at_ms < :stale)"
                ),
                ExpressionAttributeValues=_values(
                    expiry=record.lease_expires_at_ms,
                    epoch=record.lease_epoch,
                    now=now,
                    stale=now - rehint_after_ms,
                    started=DesiredState.STARTED.value,
                ),
            )
        except ClientError:
            return False
        return True

    def withdraw_hint_claim(self, record: ConnectionRecord) -> bool:
        """Undo :meth:`claim_hint` for a hint that could not be sent, so the next pass sends
        it instead of waiting ``rehint_after_ms``. Only our claim of this lease state is
        removed (a newer claim, or a lease that moved on, is left alone); False if none was.
        """
        try:
            self._conditional_update(
                record.pk,
                UpdateExpression="REMOVE hinted_expiry_ms, hinted_epoch, hinted_at_ms",
                ConditionExpression="hinted_expiry_ms = :expiry AND hinted_epoch = :epoch",
                ExpressionAttributeValues=_values(
                    expiry=record.lease_expires_at_ms, epoch=record.lease_epoch
                ),
            )
        except ClientError:
            return False
        return True

    # ------------------------------------------------------------------ worker items
    def register_worker(self, worker: WorkerRecord) -> None:
        """Create or replace this worker's item (control queue URL, liveness expiry)."""
        self._call("put_item", Item=_dump(worker.to_item()))

    def heartbeat_worker(
        self, worker_id: str, *, expires_at_ms: int, connection_count: int
    ) -> None:
        """Keep the worker item alive; refused (StoreError-free) if it was cleaned up meanwhile."""
        try:
            self._call(
                "update_item",
                Key=_dump({"pk": worker_pk(worker_id)}),
                UpdateExpression=(
                    "SET heartbeat_at_ms = :now, expires_at_ms = :expires, connection_count = :n"
                ),
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=_values(
                    now=self._clock(), expires=expires_at_ms, n=connection_count
                ),
            )
        except ClientError as exc:
            raise StoreError(f"worker item {worker_id} is gone") from exc

    def deregister_worker(self, worker_id: str) -> None:
        self._call("delete_item", Key=_dump({"pk": worker_pk(worker_id)}))

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        response = self._call(
            "get_item", Key=_dump({"pk": worker_pk(worker_id)}), ConsistentRead=False
        )
        item = _load(response.get("Item"))
        return WorkerRecord.from_item(item) if item else None

    def get_workers(self, worker_ids: Iterable[str]) -> dict[str, WorkerRecord]:
        """Worker items by id (absent ids are missing from the result)."""
        items = self._batch_get_items((worker_pk(w) for w in worker_ids), consistent=False)
        return {
            str(item["worker_id"]): WorkerRecord.from_item(item) for item in items.values()
        }

