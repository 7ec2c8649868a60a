"""An in-memory :class:`~wsfleet.store.LeaseStore`, for the unit tests of the session and the
worker.

It implements every primitive of the interface over one dict of items, with the semantics of
:class:`~wsfleet.store.DynamoDBLeaseStore`: the same conditions, the same refusals turned into
the same exceptions, the same index attributes (from :func:`wsfleet.record.index_keys`) from
which the index views (:meth:`owned_by`, :meth:`unowned`, :meth:`list_connections`,
:meth:`list_worker_ids`) are computed, a checkpoint that never moves back and the same TTL
attribute on STOPPED items. One lock makes every write atomic, as a conditional write is.

It is no substitute for DynamoDB: the lease logic itself (conditions under real concurrency,
ambiguous failures, backends without ALL_OLD) is tested against the moto server, and
``tests/integration/test_lease_store_contract.py`` runs one set of scenarios against both
stores so they cannot drift apart. What this store differs in, on purpose: its indexes are
strongly consistent, and nothing here fails ambiguously.

Example::

    store = InMemoryLeaseStore(lease_ms=2_000, clock=fake_clock)
    store.start("c1", "wss://up.example/s")
    lease = Lease.of(store.acquire("CONN#c1", owner="w1"))
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .clock import Clock, now_ms
from .exceptions import StoreError, WorkerDead
from .lease import Lease
from .rebalance import FLEET_VIEW_PK, FleetView
from .record import (
    INDEX_SHARDS,
    WORKER_INDEX_VALUE,
    WORKER_PREFIX,
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
    worker_pk,
)
from .store import (
    ConnectionPage,
    IndexEntry,
    LeaseStore,
    _Refused,
)
from .task_exit import ContainerStop, ExitKill, exit_kill_outcome, ran_in

__all__ = ["InMemoryLeaseStore"]

_Item = dict[str, Any]
_Condition = Callable[[_Item], bool]
_UNOWNED_KEYS = ("unowned_shard", "unowned_since_ms")
_HINT_CLAIM = ("hinted_since_ms", "hinted_at_ms")


class _Failed(Exception):
    """A condition did not hold; ``old`` is the item as it stood (None: absent)."""

    def __init__(self, old: _Item | None) -> None:
        super().__init__("condition failed")
        self.old = old


@contextlib.contextmanager
def _refused_with_record() -> Iterator[None]:
    """A :class:`_Failed` connection write raised as the backends' primitives raise it:
    :class:`_Refused` carrying the record as it stood."""
    try:
        yield
    except _Failed as refused:
        raise _Refused(_record(refused.old)) from refused


def _is(item: _Item, name: str, value: Any) -> bool:
    """DynamoDB's ``name = :value``: false when the attribute is absent."""
    return name in item and item[name] == value


def _record(item: _Item | None) -> ConnectionRecord | None:
    return ConnectionRecord.from_item(item) if item else None


class InMemoryLeaseStore(LeaseStore):
    """:class:`LeaseStore` over a dict: same constructor as DynamoDBLeaseStore minus the
    client and the table. Thread-safe (one lock); for unit tests only."""

    def __init__(
        self, *, lease_ms: int = 20_000, stopped_retention_ms: int = 0, clock: Clock = now_ms
    ) -> None:
        super().__init__(lease_ms=lease_ms, stopped_retention_ms=stopped_retention_ms, clock=clock)
        self._lock = threading.Lock()
        self._items: dict[str, _Item] = {}

    # ------------------------------------------------------------------ the "table"
    def _update(
        self,
        pk: str,
        condition: _Condition,
        set_values: Mapping[str, Any],
        remove: Iterable[str] = (),
        *,
        add_epoch: bool = False,
    ) -> _Item:
        """One conditional UpdateItem: the new item, or :class:`_Failed` with the old one.
        The condition sees ``{}`` for an absent item (which it then creates, like DynamoDB)."""
        with self._lock:
            old = self._items.get(pk)
            if not condition(old or {}):
                raise _Failed(dict(old) if old else None)
            new = {**(old or {"pk": pk}), **set_values}
            for name in remove:
                new.pop(name, None)
            if add_epoch:
                new["lease_epoch"] = int(new.get("lease_epoch", 0)) + 1
            self._items[pk] = new
            return dict(new)

    def _read(self, pk: str) -> _Item | None:
        with self._lock:
            item = self._items.get(pk)
            return dict(item) if item else None

    def _scan(self, keep: _Condition) -> list[_Item]:
        """The items an index would hold (``keep``), in key order."""
        with self._lock:
            return [dict(self._items[pk]) for pk in sorted(self._items) if keep(self._items[pk])]

    # ------------------------------------------------------------------ reads
    def get(self, pk: str, *, consistent: bool = True) -> ConnectionRecord | None:
        return _record(self._read(pk))

    def batch_get(
        self, pks: Iterable[str], *, consistent: bool = False
    ) -> dict[str, ConnectionRecord]:
        found = {pk: self._read(pk) for pk in pks}
        return {pk: ConnectionRecord.from_item(item) for pk, item in found.items() if item}

    # ------------------------------------------------------------------ API-side writes
    def _create(self, record: ConnectionRecord) -> None:
        with self._lock:
            if record.pk in self._items:
                raise _Refused(_record(self._items[record.pk]))
            self._items[record.pk] = record.to_item()

    def _restart_write(
        self, current: ConnectionRecord, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        # Stricter than DynamoDB's condition (nothing changed since ``current`` was read),
        # which covers it: the state and the owner are part of the record.
        with _refused_with_record():
            item = self._update(current.pk, lambda old: _record(old) == current, set_values, remove)
        return ConnectionRecord.from_item(item)

    def _stop_write(
        self, pk: str, set_values: Mapping[str, Any], remove: tuple[str, ...]
    ) -> ConnectionRecord:
        def condition(old: _Item) -> bool:
            return bool(old) and old["desired_state"] != DesiredState.STOPPED.value

        with _refused_with_record():
            return ConnectionRecord.from_item(self._update(pk, condition, set_values, remove))

    def list_connections(
        self, state: DesiredState, *, limit: int = 50, start_key: Mapping[str, Any] | None = None
    ) -> ConnectionPage:
        """Shard by shard, in key order within a shard; ``next_key`` has the DynamoDB store's
        shape (``{"shard": n, "key": {"pk": ...} or None}``)."""
        shard = int((start_key or {}).get("shard", 0))
        after = ((start_key or {}).get("key") or {}).get("pk")
        records: list[ConnectionRecord] = []
        next_key: dict[str, Any] | None = None
        while shard < INDEX_SHARDS and len(records) < limit:
            in_shard = self._scan(_in_state_shard(f"{state.value}#{shard:02d}", after))
            page = in_shard[: limit - len(records)]
            records.extend(ConnectionRecord.from_item(item) for item in page)
            if len(page) < len(in_shard):
                next_key = {"shard": shard, "key": {"pk": page[-1]["pk"]}}
                break
            shard, after = shard + 1, None
            next_key = {"shard": shard, "key": None} if shard < INDEX_SHARDS else None
        if len(records) < limit:
            next_key = None
        return ConnectionPage(records, next_key)

    # ------------------------------------------------------------------ holder writes
    def _take_write(
        self, pk: str, owner: str, expected_owner: str, expected_epoch: int
    ) -> ConnectionRecord:
        def condition(old: _Item) -> bool:
            if not _is(old, "desired_state", DesiredState.STARTED.value):
                return False
            if expected_owner:
                return _is(old, "lease_owner", expected_owner) and _is(
                    old, "lease_epoch", expected_epoch
                )
            return "lease_owner" not in old

        with _refused_with_record():
            item = self._update(
                pk,
                condition,
                {"lease_owner": owner, "updated_at_ms": self._clock()},
                (*_UNOWNED_KEYS, *_HINT_CLAIM),
                add_epoch=True,
            )
        return ConnectionRecord.from_item(item)

    def _holder_update(
        self,
        lease: Lease,
        set_values: Mapping[str, Any],
        remove: tuple[str, ...],
        last_seq: int | None,
        started_only: bool,
    ) -> ConnectionRecord:
        def condition(old: _Item) -> bool:
            return (
                _is(old, "lease_owner", lease.owner)
                and _is(old, "lease_epoch", lease.epoch)
                and (not started_only or _is(old, "desired_state", DesiredState.STARTED.value))
                and (last_seq is None or int(old.get("last_seq", last_seq)) <= last_seq)
            )

        values = dict(set_values) if last_seq is None else {**set_values, "last_seq": last_seq}
        with _refused_with_record():
            return ConnectionRecord.from_item(self._update(lease.pk, condition, values, remove))

    # ------------------------------------------------------------------ worker items
    def register_worker(self, worker: WorkerRecord) -> None:
        with self._lock:
            if worker.pk in self._items:
                if self._items[worker.pk] == worker.to_item():
                    return
                raise StoreError(f"worker id {worker.worker_id!r} is already registered")
            self._items[worker.pk] = worker.to_item()

    def renew_worker(
        self,
        worker_id: str,
        *,
        expires_at_ms: int,
        connection_count: int,
        movable_count: int | None = None,
    ) -> None:
        values = {
            "heartbeat_at_ms": self._clock(),
            "expires_at_ms": expires_at_ms,
            "connection_count": connection_count,
        }
        if movable_count is not None:
            values["movable_count"] = movable_count
        try:
            self._update(worker_pk(worker_id), _alive_item, values)
        except _Failed as refused:
            raise WorkerDead(f"worker {worker_id!r} was killed or deleted") from refused

    def retire_worker(self, worker_id: str) -> None:
        now = self._clock()
        with contextlib.suppress(_Failed):  # already dead or gone: nothing left to end
            values = {"dead_at_ms": now, "expires_at_ms": now}
            self._update(worker_pk(worker_id), _alive_item, values)

    def kill_worker(self, worker_id: str) -> bool:
        now = self._clock()
        try:
            self._update(
                worker_pk(worker_id),
                lambda old: _alive_item(old) and int(old.get("expires_at_ms", now)) < now,
                {"dead_at_ms": now},
            )
        except _Failed as refused:
            return refused.old is None or WorkerRecord.from_item(refused.old).dead
        return True

    def kill_exited_worker(self, worker_id: str, stop: ContainerStop) -> ExitKill:
        now = self._clock()

        def condition(old: _Item) -> bool:
            return _alive_item(old) and ran_in(WorkerRecord.from_item(old), stop)

        with self._lock:  # the condition reads the item as a record: one step, as in DynamoDB
            old = self._items.get(worker_pk(worker_id))
            if old is None or not condition(old):
                return exit_kill_outcome(WorkerRecord.from_item(old) if old else None, stop)
            old.update(dead_at_ms=now, expires_at_ms=now, hinted_expiry_ms=now, hinted_at_ms=now)
        return ExitKill.KILLED

    def get_worker(self, worker_id: str, *, consistent: bool = False) -> WorkerRecord | None:
        item = self._read(worker_pk(worker_id))
        return WorkerRecord.from_item(item) if item else None

    def get_workers(self, worker_ids: Iterable[str]) -> dict[str, WorkerRecord]:
        found = {worker_id: self.get_worker(worker_id) for worker_id in worker_ids}
        return {worker_id: worker for worker_id, worker in found.items() if worker}

    def list_worker_ids(self) -> list[str]:
        items = self._scan(lambda item: _is(item, "worker_index", WORKER_INDEX_VALUE))
        return [str(item["pk"])[len(WORKER_PREFIX):] for item in items]

    def delete_worker(self, worker_id: str, *, dead_before_ms: int) -> bool:
        with self._lock:
            item = self._items.get(worker_pk(worker_id))
            if item is None or int(item.get("expires_at_ms", dead_before_ms)) >= dead_before_ms:
                return False
            del self._items[worker_pk(worker_id)]
            return True

    # ------------------------------------------------------------------ the fleet view
    def put_fleet_view(self, view: FleetView) -> None:
        with self._lock:
            self._items[FLEET_VIEW_PK] = view.to_item()

    def get_fleet_view(self, *, consistent: bool = False) -> FleetView | None:
        return FleetView.parse(self._read(FLEET_VIEW_PK))

    # ------------------------------------------------------------------ indexes
    def owned_by(self, owner: str, *, page_size: int = 1000) -> Iterator[IndexEntry]:
        for item in self._scan(lambda item: _is(item, "lease_owner", owner)):
            yield IndexEntry.from_owner_index(item)

    def unowned(self, shard: int, before_ms: int, *, page_size: int = 500) -> Iterator[IndexEntry]:
        items = self._scan(
            lambda item: _is(item, "unowned_shard", f"{shard:02d}")
            and int(item["unowned_since_ms"]) < before_ms
        )
        for item in sorted(items, key=lambda item: int(item["unowned_since_ms"])):
            yield IndexEntry.from_unowned_index(item)

    def claim_worker_hints(self, worker: WorkerRecord, *, rehint_after_ms: int) -> bool:
        now = self._clock()
        expiry = worker.expires_at_ms

        def condition(old: _Item) -> bool:
            return _is(old, "expires_at_ms", expiry) and (
                "hinted_at_ms" not in old
                or old.get("hinted_expiry_ms") != expiry
                or int(old["hinted_at_ms"]) < now - rehint_after_ms
            )

        values = {"hinted_expiry_ms": expiry, "hinted_at_ms": now}
        return self._claims(worker.pk, condition, values)

    def claim_hint(self, entry: IndexEntry, *, rehint_after_ms: int) -> bool:
        now = self._clock()
        since = entry.unowned_since_ms

        def condition(old: _Item) -> bool:
            return (
                _is(old, "unowned_since_ms", since)
                and "lease_owner" not in old
                and (
                    "hinted_at_ms" not in old
                    or old.get("hinted_since_ms") != since
                    or int(old["hinted_at_ms"]) < now - rehint_after_ms
                )
            )

        return self._claims(entry.pk, condition, {"hinted_since_ms": since, "hinted_at_ms": now})

    def withdraw_hint_claim(self, entry: IndexEntry) -> bool:
        since = entry.unowned_since_ms
        return self._claims(
            entry.pk, lambda old: _is(old, "hinted_since_ms", since), {}, _HINT_CLAIM
        )

    def _claims(
        self, pk: str, condition: _Condition, values: Mapping[str, Any], remove: Iterable[str] = ()
    ) -> bool:
        try:
            self._update(pk, condition, values, remove)
        except _Failed:
            return False
        return True


def _in_state_shard(value: str, after: str | None) -> _Condition:
    """gsi_state's query: the items of one ``state_shard`` after the key ``after``."""
    return lambda item: _is(item, "state_shard", value) and (after is None or item["pk"] > after)


def _alive_item(old: _Item) -> bool:
    """``attribute_exists(pk) AND attribute_not_exists(dead_at_ms)`` of a worker item."""
    return bool(old) and "dead_at_ms" not in old
