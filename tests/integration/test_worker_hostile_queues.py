"""Hostile queue messages (issue #11, findings 2 and 7) against a real worker process.

* Poison: bodies that once raised RecursionError out of the parsers and ended the worker, sent
  to the hint queue and to the worker's own control queue. The worker must count them, delete
  them and keep working: it still acquires and streams a connection started afterwards.
* A forged STOP: a well-formed command naming the live epoch, with no STOP in the record. The
  worker must confirm it against the record, count it as unconfirmed and keep streaming.

Every wait is on an observable outcome (a log line, a metric, a queue count, stored frames).
"""

from __future__ import annotations

import json

import fleet_helpers
import pytest
from fleet_helpers import queue_depth, streaming, wait_until

from wsfleet.record import DesiredState, connection_pk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

sim, fleet, spawn = fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn

# A long heartbeat: the forged STOP must not be overtaken by a renewal that would explain the
# outcome either way (see test_worker_stop.py).
SLOW_HEARTBEAT = fleet_helpers.SLOW_HEARTBEAT_ENV

POISON = [
    "[" * 5000,  # RecursionError inside json on main
    '{"type": "STOP", "pk": "CONN#x", "epoch": ' + "9" * 5000 + "}",  # int digit limit
    "x" * 200_000,  # near the SQS maximum
]


def test_poison_on_both_queues_is_counted_deleted_and_survived(fleet, sim, spawn):
    # GIVEN a running worker with its control queue
    worker = spawn()
    item = wait_until(lambda: fleet.worker_item(worker.worker_id), timeout=60, message=worker.tail)
    control_url = item.control_queue_url
    assert control_url

    # WHEN poison arrives on its control queue and on the hint queue
    for body in POISON:
        fleet.sqs.send_message(QueueUrl=control_url, MessageBody=body)
        fleet.sqs.send_message(QueueUrl=fleet.hint_queue_url, MessageBody=body)

    # THEN every poison message is counted and deleted, and the worker is still running
    wait_until(
        lambda: worker.metric_total("InvalidControlMessages") >= len(POISON)
        and worker.metric_total("InvalidHints") >= len(POISON),
        timeout=60,
        message=worker.tail,
    )
    wait_until(lambda: queue_depth(fleet.sqs, control_url) == (0, 0), timeout=30,
               message=worker.tail)  # fmt: skip
    wait_until(lambda: queue_depth(fleet.sqs, fleet.hint_queue_url) == (0, 0), timeout=30,
               message=worker.tail)  # fmt: skip
    assert worker.is_running(), worker.tail()

    # AND it still acquires and streams a connection started afterwards
    fleet.start("after-poison", sim.url_for("after-poison"))
    streaming(fleet, "after-poison", worker)
    assert worker.is_running()

    # AND the logs carry excerpts, never a whole hostile body
    output = worker.output()
    assert "[" * 200 not in output and "x" * 200 not in output and "9" * 200 not in output
    assert worker.logs("deleting unusable control message")


def test_a_forged_stop_does_not_end_a_live_stream(fleet, sim, spawn):
    # GIVEN a connection streaming on a worker
    worker = spawn(**SLOW_HEARTBEAT)
    fleet.start("forged", sim.url_for("forged"))
    record = streaming(fleet, "forged", worker)

    # WHEN a well-formed STOP with the live epoch arrives, but the record was never stopped
    fleet.send_stop(worker.worker_id, record.pk, record.lease_epoch)

    # THEN the worker checks the record, counts the STOP as unconfirmed and keeps streaming
    received = wait_until(lambda: worker.logs("STOP command received"), timeout=30,
                          message=worker.tail)
    assert received[0]["applied"] is False
    assert worker.logs("STOP not confirmed by the record; stream kept")
    wait_until(lambda: worker.metric_total("UnconfirmedStops") >= 1, timeout=30,
               message=worker.tail)
    assert sim.sessions("forged")[0].is_open
    assert len(sim.sessions("forged")) == 1
    current = fleet.record("forged")
    assert current.desired_state is DesiredState.STARTED
    assert (current.lease_owner, current.lease_epoch) == (worker.worker_id, record.lease_epoch)
    assert not [r for r in worker.logs("session finished") if r.get("connection_id") == "forged"]

    # AND a real STOP (the record says STOPPED) still closes it through the control channel
    fleet.store.stop(connection_pk("forged"))
    fleet.send_stop(worker.worker_id, record.pk, record.lease_epoch)
    wait_until(lambda: not sim.sessions("forged")[0].is_open, timeout=30, message=worker.tail)
    finished = wait_until(
        lambda: next(
            (r for r in worker.logs("session finished") if r.get("connection_id") == "forged"),
            None,
        ),
        timeout=30,
        message=worker.tail,
    )
    assert (finished["reason"], finished["via"]) == ("stopped", "control")


def test_the_control_queue_denies_every_sender_but_the_configured_roles(fleet, spawn):
    # GIVEN the stack's setting naming the notifier's role (moto stores queue policies but does
    # not enforce them: this checks what the worker asks SQS to enforce)
    notifier = "arn:aws:iam::123456789012:role/stack-StreamNotifierRole-X"
    worker = spawn(CONTROL_QUEUE_SENDER_ARNS=f" {notifier} ,")
    item = wait_until(lambda: fleet.worker_item(worker.worker_id), timeout=60, message=worker.tail)

    # WHEN the worker has created its control queue
    attributes = fleet.sqs.get_queue_attributes(
        QueueUrl=item.control_queue_url, AttributeNames=["Policy", "QueueArn"]
    )["Attributes"]

    # THEN its policy denies SendMessage to every principal but the notifier's role
    policy = json.loads(attributes["Policy"])
    deny = next(s for s in policy["Statement"] if s["Effect"] == "Deny")
    assert deny["Principal"] == "*" and deny["Action"] == "sqs:SendMessage"
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": [notifier]}}
    assert deny["Resource"].endswith(":" + attributes["QueueArn"].rsplit(":", 1)[1])
