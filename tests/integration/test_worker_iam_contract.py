"""The worker role's DynamoDB write limits match what LeaseStore actually writes (issue #11, 8;
lease model v2: no per-connection renewal, the worker's own lease on its worker item, and the
kill of a lapsed peer's worker item on the takeover path).

template.yaml lets the worker role Put/UpdateItem only the attributes listed under
``dynamodb:Attributes`` (per leading key: ``CONN#*``, ``WORKER#*``), so it cannot rewrite
``ws_url`` or anything else the router validates. IAM denies a request naming any other
attribute, so a list that falls behind the store would break the worker in AWS only. This test
runs every write the worker makes through a real LeaseStore against the moto server, records
the attribute names each request carries, and checks them against the template's lists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.lease import Lease
from wsfleet.record import WorkerRecord, connection_pk
from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.backend import load_template
from wsfleet_local.stack import StackResolver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"(?<![:#\w])[A-Za-z_][A-Za-z0-9_]*")
_NOT_NAMES = {"SET", "ADD", "REMOVE", "DELETE", "AND", "OR", "NOT", "BETWEEN", "IN",
              "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with",
              "contains", "size", "if_not_exists", "list_append"}


def _names(expression: str, aliases: dict[str, str]) -> set[str]:
    found = {m for m in _NAME.findall(expression) if m not in _NOT_NAMES}
    return found | {aliases[a] for a in re.findall(r"#\w+", expression)}


def request_attributes(params: dict[str, Any]) -> set[str]:
    """Top-level attribute names a Put/UpdateItem request names (key included)."""
    aliases = params.get("ExpressionAttributeNames", {})
    names = set(params.get("Key", {})) | set(params.get("Item", {}))
    for field in ("UpdateExpression", "ConditionExpression"):
        names |= _names(params.get(field, ""), aliases)
    return names


#: Parameters that add a conditional policy to the worker role (credentials by reference).
WIDEST = {
    "UpstreamSecretPrefix": "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/",
    "UpstreamSecretKmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/1234abcd",
}


def worker_statements(**parameters: str) -> list[dict[str, Any]]:
    """The worker role's statements as a stack deployed with ``parameters`` has them (its
    conditional policies evaluated; Defaults for what is not given)."""
    template = load_template(ROOT / "template.yaml")
    resolver = StackResolver(
        stack_name="wsfleet", region="us-east-1", names={},
        parameters=template["Parameters"], conditions=template["Conditions"],
        overrides=parameters,
    )
    role = template["Resources"]["WorkerTaskRole"]["Properties"]
    return [
        statement
        for policy in resolver.resolve_conditions(role["Policies"])
        for statement in policy["PolicyDocument"]["Statement"]
    ]


def worker_write_limits(**parameters: str) -> dict[str, set[str]]:
    limits: dict[str, set[str]] = {}
    for statement in worker_statements(**parameters):
        actions = statement["Action"]
        writes = {"dynamodb:UpdateItem", "dynamodb:PutItem"} & set(actions)
        if writes and "ConnectionsTable" in str(statement["Resource"]):
            condition = statement["Condition"]
            for key in condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]:
                limits[key] = set(condition["ForAllValues:StringEquals"]["dynamodb:Attributes"])
    return limits


def test_every_worker_write_names_only_attributes_the_template_allows(aws):
    # GIVEN connections the router started, and a peer worker whose lease has lapsed while it
    # owned one of them (written by a separate client: these are not the worker's requests)
    setup = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=60_000)
    for cid in ("a", "b", "c", "d", "e", "f"):
        setup.start(cid, f"wss://example.com/{cid}")
    now = now_ms()
    setup.register_worker(WorkerRecord(
        worker_id="w0", control_queue_url="http://q0", started_at_ms=now - 120_000,
        heartbeat_at_ms=now - 61_000, expires_at_ms=now - 1_000,
    ))
    setup.acquire(connection_pk("d"), "w0")

    # AND a store whose requests are recorded
    client = dynamodb_client()
    requests: list[tuple[str, dict[str, Any]]] = []
    client.meta.events.register(
        "provide-client-params.dynamodb.*",
        lambda params, model, **_: requests.append((model.name, dict(params))),
    )
    store = DynamoDBLeaseStore(
        client, aws.connections_table, lease_ms=60_000, stopped_retention_ms=86_400_000
    )

    # WHEN it makes every write the worker makes: its own lease...
    store.register_worker(WorkerRecord(
        worker_id="w1", control_queue_url="http://q", started_at_ms=now, heartbeat_at_ms=now,
        expires_at_ms=now + 60_000, capacity=100,
        task_arn="arn:aws:ecs:us-east-1:123456789012:task/wsfleet/0123abcd",
        container_runtime_id="0123abcd-1234567890",
    ))
    store.renew_worker("w1", expires_at_ms=now_ms() + 60_000, connection_count=1)
    # ... a free connection: acquire, re-take (its own earlier attempt), checkpoint, errors
    lease = Lease.of(store.acquire(connection_pk("a"), "w1"))
    lease = Lease.of(store.acquire(connection_pk("a"), "w1"))
    window = {  # an at-least-once sink's send limit and replay totals ride on the checkpoint
        "sent_limit": 9, "replayed_takeovers": 1, "replayed_frames": 2,
        "replayed_from_seq": 3, "replayed_to_seq": 9,
    }
    store.checkpoint(lease, 4, window=window)
    store.record_error(lease, "upstream closed 1011")
    store.note_failure(lease, "crashed", count=1, at_seq=4, since_ms=1)
    store.note_gap(lease, resumes=1, frames=30)
    store.release(lease, last_seq=5)  # hand-off: free and STARTED (gsi_unowned)
    moved = Lease.of(store.acquire(connection_pk("a"), "w1"))
    store.release(moved, last_seq=6, moved=True)  # a rebalancing move (rebalanced_at_ms)
    # ... the endings: STOPPED by the holder, FAILED by the breaker, released after a STOP
    store.mark_stopped(Lease.of(store.acquire(connection_pk("b"), "w1")), "done", last_seq=1)
    failed = Lease.of(store.acquire(connection_pk("c"), "w1"))
    store.mark_failed(failed, "poison", count=3, at_seq=0, since_ms=1, last_seq=0)
    stopped = Lease.of(store.acquire(connection_pk("e"), "w1"))
    setup.stop(connection_pk("e"))
    store.release(stopped, last_seq=2)  # not knowing of the STOP: refused once, then released
    known = Lease.of(store.acquire(connection_pk("f"), "w1"))
    setup.stop(connection_pk("f"))
    store.release(known, stopped=True)
    # ... a takeover from the lapsed peer: the kill, then the take
    taken = store.acquire(connection_pk("d"), "w1")
    assert (taken.lease_owner, store.get_worker("w0", consistent=True).dead) == ("w1", True)
    # ... and the end of its own lease
    store.retire_worker("w1")

    # THEN each Put/UpdateItem names only attributes the template allows under its key
    limits = worker_write_limits()
    writes = [(op, p) for op, p in requests if op in ("PutItem", "UpdateItem", "DeleteItem")]
    assert {op for op, _ in writes} == {"PutItem", "UpdateItem"}  # workers never delete items
    for operation, params in writes:
        pk = (params.get("Key") or params.get("Item"))["pk"]["S"]
        allowed = limits["CONN#*" if pk.startswith("CONN#") else "WORKER#*"]
        assert request_attributes(params) <= allowed, (operation, request_attributes(params))
    # AND the lists hold nothing the worker never writes (a stale grant is a wider grant)
    for key, prefix in (("CONN#*", "CONN#"), ("WORKER#*", "WORKER#")):
        written = set().union(*(
            request_attributes(p) for _, p in writes
            if (p.get("Key") or p.get("Item"))["pk"]["S"].startswith(prefix)
        ))
        assert limits[key] == written, key


@pytest.mark.parametrize("parameters", [{}, WIDEST], ids=["defaults", "with-secrets"])
def test_the_worker_role_may_not_delete_items(parameters: dict[str, str]) -> None:
    actions = {
        action for statement in worker_statements(**parameters) for action in statement["Action"]
    }
    assert "dynamodb:DeleteItem" not in actions
    # and the secret policy adds no write limit of its own (nor lifts one)
    assert worker_write_limits(**parameters) == worker_write_limits()
