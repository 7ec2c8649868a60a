"""The scale model: how hot each partition key of the connections table and its indexes gets,
and the fleet size at which the hottest one reaches DynamoDB's per-partition limits.

Pure functions (no boto3, no clock, no I/O): the recorder (:mod:`bench.scale_record`) feeds
them the request stream of a local run, they return per-key loads, ceilings and SCALE.md.

**What a request costs, per key.** DynamoDB serves one partition-key value from one partition,
and one partition at most 1,000 write units/s and 3,000 read units/s (the developer guide's
"partition limits"; adaptive capacity can split a partition by *sort* key, never a single
partition-key value of a GSI that has none or an item collection hammered in order). So the
model sums, per (table or index, partition-key value):

* **writes** from the table's stream images (old and new item of every successful write) and
  from the request journal (conditional writes that failed still cost units): a base-table
  write costs ceil(max(old, new item size) / 1 KB); an index write happens when the item
  enters or leaves the index, changes its index key (a delete under the old key plus a put
  under the new one) or changes a projected attribute (ALL, the INCLUDE list, or only keys for
  KEYS_ONLY), and costs ceil(index entry size / 1 KB), the entry being what the index
  projects;
* **reads** from the journal: GetItem / BatchGetItem per key, Query per partition value of its
  key condition, Scan on a pseudo-key ``*``; units ceil(bytes / 4 KB), half of that when
  eventually consistent (every GSI read is), at least one unit per request. Bytes are the
  *stored* item or index entry (what DynamoDB charges for), not what a projection expression
  returned.

**How keys grow with the fleet** (N connections, C per worker, so N / C workers). Every
recorded unit is attributed to the *kind of item* it comes from (a connection item or a
worker item) and every key to a class:

* ``connection``: a key per connection (``CONN#<id>``): its load does not depend on N;
* ``worker``: a key per worker (``WORKER#<id>``, ``lease_owner=<id>``): its load from
  connection items grows with C (measured per connection, times C), from the worker item it
  is per worker; none of it depends on N;
* ``fleet``: a key whose values do not grow with N (``desired_state=STARTED``,
  ``worker_index=WORKER``, 16 shards of ``unowned_shard``): load from connection items grows
  with N, from worker items with N / C, and read requests by workers with N / C; requests by
  the Lambdas (one reconcile pass, whatever the fleet) stay per pass, while the bytes they
  read grow as above.

Loads are affine in N, so the fleet size at which a key reaches a fraction of a limit is one
division; the hottest key is the one that reaches it first. A read's rounding to whole units
is kept as up to one extra unit per request (an upper bound). Rates come from a run with every
cadence divided by ``factor`` (time compression): each request rate is linear in 1 / interval,
so measured rates / factor are the production rates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .request_cost import dynamodb_item_size

__all__ = [
    "READ_LIMIT",
    "TABLE",
    "WRITE_LIMIT",
    "Affine",
    "IndexDef",
    "KeyLoad",
    "KeyRead",
    "KeyWrite",
    "Run",
    "TableDef",
    "ceiling",
    "failed_write",
    "index_entry",
    "key_class",
    "model",
    "reads_of_request",
    "render_markdown",
    "table_def",
    "writes_of_change",
]

#: Target name of the base table (indexes are named by IndexName).
TABLE = "table"
#: DynamoDB's documented per-partition throughput (units per second).
WRITE_LIMIT = 1000.0
READ_LIMIT = 3000.0
WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
CONNECTION_PREFIX = "CONN#"
WORKER_PREFIX = "WORKER#"
#: The v2 target: 1,000,000 connections with the hottest key under half its limit.
TARGET_CONNECTIONS = 1_000_000
TARGET_FRACTION = 0.5


@dataclass(frozen=True)
class IndexDef:
    """A global secondary index: its key and what it projects."""

    name: str
    hash_key: str
    range_key: str | None = None
    projection: str = "ALL"  # ALL | KEYS_ONLY | INCLUDE
    non_key: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TableDef:
    hash_key: str
    range_key: str | None = None
    indexes: tuple[IndexDef, ...] = ()

    def index(self, name: str) -> IndexDef:
        for index in self.indexes:
            if index.name == name:
                return index
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for index in data["indexes"]:
            index["non_key"] = sorted(index["non_key"])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableDef:
        return cls(
            data["hash_key"],
            data.get("range_key"),
            tuple(
                IndexDef(i["name"], i["hash_key"], i.get("range_key"), i["projection"],
                         frozenset(i.get("non_key", ())))
                for i in data.get("indexes", ())
            ),
        )  # fmt: skip


def _keys(schema: Iterable[Mapping[str, Any]]) -> tuple[str, str | None]:
    hash_key = range_key = None
    for element in schema:
        if element["KeyType"] == "HASH":
            hash_key = element["AttributeName"]
        else:
            range_key = element["AttributeName"]
    if hash_key is None:
        raise ValueError("a key schema without a HASH key")
    return hash_key, range_key


def table_def(template: Mapping[str, Any], logical_id: str = "ConnectionsTable") -> TableDef:
    """The table's key and its GSIs, parsed from a loaded template.yaml.

    >>> t = table_def({"Resources": {"T": {"Properties": {
    ...     "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
    ...     "GlobalSecondaryIndexes": [{"IndexName": "g",
    ...         "KeySchema": [{"AttributeName": "s", "KeyType": "HASH"}],
    ...         "Projection": {"ProjectionType": "KEYS_ONLY"}}]}}}}, "T")
    >>> t.hash_key, t.indexes[0].name, t.indexes[0].projection
    ('pk', 'g', 'KEYS_ONLY')
    """
    properties = template["Resources"][logical_id]["Properties"]
    hash_key, range_key = _keys(properties["KeySchema"])
    indexes = []
    for index in properties.get("GlobalSecondaryIndexes", ()):
        index_hash, index_range = _keys(index["KeySchema"])
        projection = index.get("Projection", {})
        indexes.append(IndexDef(
            index["IndexName"], index_hash, index_range,
            projection.get("ProjectionType", "KEYS_ONLY"),
            frozenset(projection.get("NonKeyAttributes", ())),
        ))  # fmt: skip
    return TableDef(hash_key, range_key, tuple(indexes))


def _value(attribute: Mapping[str, Any]) -> str:
    ((_kind, raw),) = attribute.items()
    return str(raw)


def index_entry(
    item: Mapping[str, Any] | None, table: TableDef, index: IndexDef
) -> dict[str, Any] | None:
    """The entry ``item`` has in ``index`` (None: not in it; a GSI is sparse on its keys)."""
    if item is None or index.hash_key not in item:
        return None
    if index.range_key is not None and index.range_key not in item:
        return None
    if index.projection == "ALL":
        return dict(item)
    names = {table.hash_key, index.hash_key} | {
        n for n in (table.range_key, index.range_key) if n is not None
    }
    if index.projection == "INCLUDE":
        names |= index.non_key
    return {name: value for name, value in item.items() if name in names}


def _entry_key(entry: Mapping[str, Any], index: IndexDef) -> tuple[str, str | None]:
    range_value = entry.get(index.range_key) if index.range_key else None
    return _value(entry[index.hash_key]), _value(range_value) if range_value else None


def _source(pk: str) -> str:
    return "worker" if pk.startswith(WORKER_PREFIX) else "connection"


def _write_units(size: int) -> int:
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


@dataclass(frozen=True)
class KeyWrite:
    """One write to one partition-key value of the table or of an index."""

    target: str
    key: str
    units: int
    source: str  # connection | worker: the kind of item written


@dataclass(frozen=True)
class KeyRead:
    """One read request's share of one partition-key value."""

    target: str
    key: str
    factor: float  # 0.5 eventually consistent, 1.0 strongly
    connection_bytes: int = 0
    worker_bytes: int = 0
    by_worker: bool = False  # issued by a worker process (else a Lambda)

    @property
    def units(self) -> float:
        total = self.connection_bytes + self.worker_bytes
        return self.factor * max(1, math.ceil(total / READ_UNIT_BYTES))


def writes_of_change(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, table: TableDef
) -> list[KeyWrite]:
    """The base-table and index writes of one item change (a stream record's two images).

    >>> t = TableDef("pk", indexes=(IndexDef("g", "s", "e", "ALL"),))
    >>> old = {"pk": {"S": "CONN#a"}, "s": {"S": "STARTED"}, "e": {"N": "1"}}
    >>> [(w.target, w.key) for w in writes_of_change(old, {**old, "e": {"N": "2"}}, t)]
    [('table', 'CONN#a'), ('g', 'STARTED'), ('g', 'STARTED')]
    """
    item = new if new is not None else old
    if item is None:
        return []
    pk = _value(item[table.hash_key])
    source = _source(pk)
    size = max(dynamodb_item_size(dict(old or {})), dynamodb_item_size(dict(new or {})))
    writes = [KeyWrite(TABLE, pk, _write_units(size), source)]
    for index in table.indexes:
        before, after = index_entry(old, table, index), index_entry(new, table, index)
        if before is None and after is None:
            continue
        if before is not None and (
            after is None or _entry_key(before, index) != _entry_key(after, index)
        ):
            key = _entry_key(before, index)[0]
            writes.append(
                KeyWrite(index.name, key, _write_units(dynamodb_item_size(before)), source)
            )
            before = None
        if after is not None and after != before:
            key = _entry_key(after, index)[0]
            writes.append(
                KeyWrite(index.name, key, _write_units(dynamodb_item_size(after)), source)
            )
    return writes


_WRITE_OPERATIONS = frozenset({"PutItem", "UpdateItem", "DeleteItem"})


def failed_write(
    entry: Mapping[str, Any], table: TableDef, images: Mapping[str, Mapping[str, Any]]
) -> KeyWrite | None:
    """A journalled conditional write that failed: it still costs the item's write units."""
    response = entry.get("response") or {}
    if entry.get("operation") not in _WRITE_OPERATIONS or entry.get("status") != 400:
        return None
    if not str(response.get("__type", "")).endswith("ConditionalCheckFailedException"):
        return None
    request = entry.get("request") or {}
    key = request.get("Key") or request.get("Item") or {}
    if table.hash_key not in key:
        return None
    pk = _value(key[table.hash_key])
    size = dynamodb_item_size(dict(images.get(pk, {})))
    return KeyWrite(TABLE, pk, _write_units(size), _source(pk))


_EQUALS = re.compile(r"(#?[A-Za-z_][\w.]*)\s*=\s*(:[\w]+)")


def _partition_value(request: Mapping[str, Any], hash_key: str) -> str | None:
    names = request.get("ExpressionAttributeNames") or {}
    values = request.get("ExpressionAttributeValues") or {}
    for name, placeholder in _EQUALS.findall(str(request.get("KeyConditionExpression", ""))):
        if names.get(name, name) == hash_key and placeholder in values:
            return _value(values[placeholder])
    conditions = request.get("KeyConditions") or {}
    if hash_key in conditions:
        return _value(conditions[hash_key]["AttributeValueList"][0])
    return None


def _entry_bytes(
    items: Sequence[Mapping[str, Any]],
    table: TableDef,
    index: IndexDef | None,
    images: Mapping[str, Mapping[str, Any]],
) -> tuple[int, int]:
    """(connection bytes, worker bytes) of the stored entries behind returned items."""
    by_source = {"connection": 0, "worker": 0}
    for item in items:
        if table.hash_key not in item:
            continue
        pk = _value(item[table.hash_key])
        stored = images.get(pk) or item
        entry = index_entry(stored, table, index) if index is not None else stored
        by_source[_source(pk)] += dynamodb_item_size(dict(entry or item))
    return by_source["connection"], by_source["worker"]


def reads_of_request(
    entry: Mapping[str, Any],
    table: TableDef,
    table_name: str,
    images: Mapping[str, Mapping[str, Any]],
) -> list[KeyRead]:
    """The per-key reads of one journalled request (``images``: latest item per pk).

    >>> t = TableDef("pk", indexes=(IndexDef("g", "s"),))
    >>> entry = {"operation": "Query", "status": 200, "label": "reconciler",
    ...          "request": {"TableName": "c", "IndexName": "g",
    ...                      "KeyConditionExpression": "#s = :v",
    ...                      "ExpressionAttributeNames": {"#s": "s"},
    ...                      "ExpressionAttributeValues": {":v": {"S": "X"}}},
    ...          "response": {"Items": [], "Count": 0, "ScannedCount": 0}}
    >>> [(r.target, r.key, r.units) for r in reads_of_request(entry, t, "c", {})]
    [('g', 'X', 0.5)]
    """
    if entry.get("status") != 200:
        return []
    operation = entry.get("operation")
    request = entry.get("request") or {}
    response = entry.get("response") or {}
    by_worker = entry.get("label") == "worker"
    if operation == "GetItem":
        pk = _value(request["Key"][table.hash_key])
        factor = 1.0 if request.get("ConsistentRead") else 0.5
        found = response.get("Item")
        conn, work = _entry_bytes([found], table, None, images) if found else (0, 0)
        return [KeyRead(TABLE, pk, factor, conn, work, by_worker)]
    if operation == "BatchGetItem":
        asked = (request.get("RequestItems") or {}).get(table_name) or {}
        factor = 1.0 if asked.get("ConsistentRead") else 0.5
        returned = {
            _value(item[table.hash_key]): item
            for item in (response.get("Responses") or {}).get(table_name, ())
        }
        reads = []
        for key in asked.get("Keys", ()):
            pk = _value(key[table.hash_key])
            found = returned.get(pk)
            conn, work = _entry_bytes([found], table, None, images) if found else (0, 0)
            reads.append(KeyRead(TABLE, pk, factor, conn, work, by_worker))
        return reads
    if operation not in ("Query", "Scan"):
        return []
    index = table.index(request["IndexName"]) if request.get("IndexName") else None
    target = index.name if index else TABLE
    factor = 1.0 if request.get("ConsistentRead") and index is None else 0.5
    items = list(response.get("Items") or ())
    conn, work = _entry_bytes(items, table, index, images)
    scanned = int(response.get("ScannedCount", len(items)))
    if scanned > len(items) and items:  # filtered out: read (and charged) all the same
        scale = scanned / len(items)
        conn, work = round(conn * scale), round(work * scale)
    if operation == "Scan":
        key = "*"
    else:
        key = _partition_value(request, index.hash_key if index else table.hash_key) or "?"
    return [KeyRead(target, key, factor, conn, work, by_worker)]


def key_class(target: str, key: str, worker_ids: Iterable[str]) -> str:
    """``connection``, ``worker`` or ``fleet``: how the key's values grow with the fleet.

    >>> key_class("table", "CONN#a", []), key_class("gsi_owner", "w0", ["w0"])
    ('connection', 'worker')
    >>> key_class("gsi_desired_state_lease", "STARTED", ["w0"])
    'fleet'
    """
    if key.startswith(WORKER_PREFIX) or key in set(worker_ids):
        return "worker"
    if key.startswith(CONNECTION_PREFIX) or (target == TABLE and key != "*"):
        return "connection"
    return "fleet"


@dataclass
class KeyLoad:
    """Everything a recorded window did to one partition-key value (units, not rates)."""

    target: str
    key: str
    key_class: str
    write_requests: int = 0
    write_units_connection: float = 0.0
    write_units_worker: float = 0.0
    read_requests: int = 0
    read_units_measured: float = 0.0
    #: the per-request part of reads (factor per request), by who asked
    read_request_units_worker: float = 0.0
    read_request_units_other: float = 0.0
    #: the per-byte part of reads (factor x bytes / 4 KB), by the kind of item read
    read_byte_units_connection: float = 0.0
    read_byte_units_worker: float = 0.0

    def add_write(self, write: KeyWrite) -> None:
        self.write_requests += 1
        if write.source == "worker":
            self.write_units_worker += write.units
        else:
            self.write_units_connection += write.units

    def add_read(self, read: KeyRead) -> None:
        self.read_requests += 1
        self.read_units_measured += read.units
        if read.by_worker:
            self.read_request_units_worker += read.factor
        else:
            self.read_request_units_other += read.factor
        self.read_byte_units_connection += read.factor * read.connection_bytes / READ_UNIT_BYTES
        self.read_byte_units_worker += read.factor * read.worker_bytes / READ_UNIT_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyLoad:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Run:
    """What the load shape was measured on."""

    connections: int
    workers: int
    window_seconds: float  # wall-clock length of the recorded window
    factor: float  # every cadence was divided by this

    @property
    def seconds(self) -> float:
        """The window in production seconds (rates measured / factor)."""
        return self.window_seconds * self.factor


@dataclass(frozen=True)
class Affine:
    """load(N) = constant + per_connection * N, in units per second."""

    constant: float
    per_connection: float

    def at(self, n: float) -> float:
        return self.constant + self.per_connection * n


def _scales(load: KeyLoad, run: Run, per_worker: int) -> tuple[Affine, Affine]:
    """(writes, reads) of one key as affine functions of the fleet size N."""
    seconds = run.seconds
    conn_per_worker_run = run.connections / run.workers
    wc, ww = load.write_units_connection / seconds, load.write_units_worker / seconds
    rqw, rqo = load.read_request_units_worker / seconds, load.read_request_units_other / seconds
    rbc, rbw = load.read_byte_units_connection / seconds, load.read_byte_units_worker / seconds
    if load.key_class == "connection":
        return Affine(wc + ww, 0.0), Affine(rqw + rqo + rbc + rbw, 0.0)
    if load.key_class == "worker":
        c = per_worker / conn_per_worker_run
        return Affine(wc * c + ww, 0.0), Affine(rqw + rqo + rbc * c + rbw, 0.0)
    per_conn = 1.0 / run.connections  # connection-item load per connection of the fleet
    per_worker_of_fleet = 1.0 / (per_worker * run.workers)  # worker-item load, N / C workers
    writes = Affine(0.0, wc * per_conn + ww * per_worker_of_fleet)
    reads = Affine(rqo, rqw * per_worker_of_fleet + rbc * per_conn + rbw * per_worker_of_fleet)
    return writes, reads


def ceiling(load: Affine, limit: float) -> float:
    """The fleet size N at which ``load`` reaches ``limit`` (inf: never; 0: already above)."""
    if load.constant >= limit:
        return 0.0
    if load.per_connection <= 0:
        return math.inf
    return (limit - load.constant) / load.per_connection


def _number(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 6)


@dataclass
class KeyFigures:
    load: KeyLoad
    writes: Affine
    reads: Affine
    ceilings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.load.target,
            "key": self.load.key,
            "class": self.load.key_class,
            "wcu_per_s_at_1000": round(self.writes.at(1000), 6),
            "rcu_per_s_at_1000": round(self.reads.at(1000), 6),
            "wcu_per_s_at_1m": round(self.writes.at(TARGET_CONNECTIONS), 4),
            "rcu_per_s_at_1m": round(self.reads.at(TARGET_CONNECTIONS), 4),
            "ceiling_50": _number(self.ceilings["50"]),
            "ceiling_100": _number(self.ceilings["100"]),
        }


def model(
    loads: Iterable[KeyLoad], run: Run, *, connections_per_worker: int = 1000
) -> dict[str, Any]:
    """Per-key rates at 1,000 and 1,000,000 connections, ceilings, the hottest key.

    ``ceiling_50`` / ``ceiling_100``: the fleet size at which the key reaches 50 % / 100 % of
    a partition's write or read limit, whichever first (None: no fleet size does).
    """
    figures = []
    for load in loads:
        writes, reads = _scales(load, run, connections_per_worker)
        key = KeyFigures(load, writes, reads)
        for name, fraction in (("50", 0.5), ("100", 1.0)):
            key.ceilings[name] = min(
                ceiling(writes, fraction * WRITE_LIMIT), ceiling(reads, fraction * READ_LIMIT)
            )
        figures.append(key)

    def heat(k: KeyFigures) -> tuple[float, float]:
        at = TARGET_CONNECTIONS
        return (k.ceilings["50"], -max(k.writes.at(at) / WRITE_LIMIT, k.reads.at(at) / READ_LIMIT))

    figures.sort(key=heat)
    hottest = figures[0] if figures else None
    ceiling_50 = hottest.ceilings["50"] if hottest else math.inf
    ceiling_100 = min((k.ceilings["100"] for k in figures), default=math.inf)
    return {
        "run": asdict(run),
        "connections_per_worker": connections_per_worker,
        "limits": {"wcu_per_s": WRITE_LIMIT, "rcu_per_s": READ_LIMIT},
        "hottest": hottest.to_dict() if hottest else None,
        "ceiling_50": _number(ceiling_50),
        "ceiling_100": _number(ceiling_100),
        "target": f">= {TARGET_CONNECTIONS:,} connections with the hottest key under "
        f"{TARGET_FRACTION:.0%} of its limit",
        "target_met": ceiling_50 >= TARGET_CONNECTIONS,
        "keys": [k.to_dict() for k in figures],
    }


# =============================================================================================
# SCALE.md
# =============================================================================================


def _connections(value: float | None) -> str:
    if value is None:
        return "never"
    if value >= 1e9:
        return f"{value:.1e}"
    return f"{value:,.0f}"


def _rate(value: float) -> str:
    if value == 0:
        return "0"
    if value < 0.001:
        return f"{value:.1e}"
    return f"{value:,.3f}" if value < 10 else f"{value:,.0f}"


def _groups(keys: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int]]:
    """The hottest key of each (target, class), with how many keys the group has; keys
    are already sorted hottest first."""
    seen: dict[tuple[str, str], list[Any]] = {}
    for key in keys:
        group = (key["target"], key["class"])
        if group in seen:
            seen[group][1] += 1
        else:
            seen[group] = [key, 1]
    return [(key, count) for key, count in seen.values()]


def _table(result: Mapping[str, Any]) -> list[str]:
    lines = [
        "| table / index | key (hottest of its kind) | kind | keys | WCU/s at 1k | RCU/s at 1k "
        "| % of limit at 1M | 50 % at | 100 % at |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, count in _groups(result["keys"]):
        share = max(key["wcu_per_s_at_1m"] / WRITE_LIMIT, key["rcu_per_s_at_1m"] / READ_LIMIT)
        percent = f"{share:,.0%}" if share >= 10 else f"{share:.2%}"
        lines.append(
            f"| {key['target']} | `{key['key']}` | {key['class']} | {count} "
            f"| {_rate(key['wcu_per_s_at_1000'])} | {_rate(key['rcu_per_s_at_1000'])} "
            f"| {percent} | {_connections(key['ceiling_50'])} "
            f"| {_connections(key['ceiling_100'])} |"
        )
    return lines


def _version(
    name: str, recording: Mapping[str, Any] | None, result: Mapping[str, Any] | None
) -> list[str]:
    lines = [f"## {name}", ""]
    if recording is None or result is None:
        return [*lines, "Not recorded yet: `python -m bench --only scale` records it.", ""]
    run = result["run"]
    hottest = result["hottest"]
    settings = recording.get("production", {})
    lines += [
        f"Recorded {recording.get('recorded_at', '?')} at commit `{recording.get('commit', '?')}`: "
        f"{run['connections']} connections on {run['workers']} workers, "
        f"{run['window_seconds']:.0f} s window with every cadence / {run['factor']:g} "
        f"(= {run['window_seconds'] * run['factor']:.0f} production seconds). Production "
        "cadences: " + ", ".join(f"{k} {v:g} s" for k, v in settings.items()) + ".",
        "",
        *_table(result),
        "",
    ]
    if hottest is not None:
        lines.append(
            f"Hottest key: **{hottest['target']} `{hottest['key']}`** ({hottest['class']}): "
            f"50 % of a partition's limit at **{_connections(result['ceiling_50'])}** "
            f"connections, 100 % at **{_connections(result['ceiling_100'])}**. "
            f"Target ({result['target']}): **{'met' if result['target_met'] else 'not met'}**."
        )
        lines.append("")
    hour = result.get("per_connection_hour")
    if hour:
        lines += [
            f"Per connection-hour (production): {hour['connection_item_writes']:g} writes to "
            f"connection items ({hour['connection_item_wcu']:g} WCU) and "
            f"{hour['index_wcu_from_connection_items']:g} WCU of index writes caused by them.",
            "",
        ]
    silent = sorted(
        {i["name"] for i in recording.get("table", {}).get("indexes", ())}
        - {k["target"] for k in result["keys"]}
    )
    if silent:
        lines += ["Indexes without a request in the window: "
                  + ", ".join(f"`{name}`" for name in silent) + ".", ""]  # fmt: skip
    notes = recording.get("notes")
    if notes:
        lines += [str(notes), ""]
    return lines


def render_markdown(
    versions: Sequence[tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None]],
    *,
    command: str = "python -m bench --only scale",
) -> str:
    """SCALE.md: one table per version (name, recording, model result)."""
    lines = [
        "# Scale model: partition-key heat of the connections table",
        "",
        f"Generated by `{command}` (bench/scale_model.py, bench/scale_record.py); raw per-key "
        "figures in bench/results.json under the `scale` step. Do not edit by hand.",
        "",
        "DynamoDB serves one partition-key value from one partition: at most "
        f"{WRITE_LIMIT:,.0f} write units/s and {READ_LIMIT:,.0f} read units/s. A GSI that "
        "cannot keep up throttles the *base table's* writes. So what sizes the fleet is the "
        "hottest key of the table or of any index, not the table's total.",
        "",
        "How the figures are made: a local fleet runs with every cadence (lease, heartbeat, "
        "safety margin, checkpoint, worker sweep, reconcile pass) divided by a factor f; every "
        "write to the connections table is read back from its stream (old and new image: "
        "base-table units ceil(max size / 1 KB), and an index write whenever the item enters or "
        "leaves the index, moves to another index key (delete + put) or changes a projected "
        "attribute), every read of every process (workers and Lambdas, through the counting "
        "proxy's journal) is attributed to the partition value of its key, bytes at 4 KB per "
        "unit, half for eventually consistent reads. Request rates are linear in 1 / interval, "
        "so the measured rates / f are production rates. Only the steady state is recorded "
        "(every stream streaming; no starts, stops or failovers in the window); the messages "
        "table is left out (its key is one connection: its load does not grow with the fleet).",
        "",
        "Scaling to N connections (C = 1,000 per worker): a key per connection keeps its load; "
        "a key per worker (`WORKER#<id>`, `lease_owner=<id>`) carries C connections' share of "
        "it, whatever N; a key with a fixed set of values (`desired_state=STARTED`, "
        "`worker_index=WORKER`, the 16 `unowned_shard` values) takes load from connection items "
        "in proportion to N and from worker items (and worker-issued reads) in proportion to "
        "N / C. A reconcile pass's requests are per pass; the bytes they read grow as above. "
        "Columns: units/s on that one key at 1,000 connections, its share of the limit at "
        "1,000,000, and the fleet sizes at which it reaches 50 % and 100 % of a limit "
        "(never: its load does not grow with the fleet). The hottest key is the one that "
        "reaches a limit at the smallest fleet; one row per table or index and kind of key "
        "(its hottest value).",
        "",
    ]
    for name, recording, result in versions:
        lines += _version(name, recording, result)
    return "\n".join(lines).rstrip() + "\n"
