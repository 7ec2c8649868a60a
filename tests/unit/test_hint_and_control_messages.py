"""Hint and control message schemas (what crosses SQS)."""

import contextlib
import json
import random

import pytest

from wsfleet.bodies import excerpt
from wsfleet.control import (
    QUEUE_NAME_LIMIT,
    CommitNotice,
    DeclineReply,
    HandoffHint,
    PrepareCommand,
    ReadyReply,
    StopCommand,
    control_queue_name,
    control_queue_policy,
    parse_control_message,
    sibling_queue_url,
    stop_confirmed,
)
from wsfleet.hints import Hint
from wsfleet.record import ConnectionRecord, DesiredState


def test_hint_round_trip():
    assert Hint.parse(Hint("CONN#a", epoch=4).body()) == Hint("CONN#a", 4)
    assert Hint.parse(Hint("CONN#a").body()) == Hint("CONN#a")
    # the article's body is accepted unchanged
    assert Hint.parse(json.dumps({"pk": "CONN#a"})).pk == "CONN#a"


@pytest.mark.parametrize("body", ["not json", "[]", '{"pk": 3}', '{"pk": "WORKER#w"}', "{}"])
def test_bad_hints_are_value_errors(body):
    with pytest.raises(ValueError):
        Hint.parse(body)


def test_stop_command_round_trip():
    assert StopCommand.parse(StopCommand("CONN#a", 2).body()) == StopCommand("CONN#a", 2)


@pytest.mark.parametrize(
    "body",
    ["x", '{"type": "START", "pk": "CONN#a", "epoch": 1}', '{"type": "STOP", "pk": "CONN#a"}',
     '{"type": "STOP", "pk": "CONN#a", "epoch": true}', '{"type": "STOP", "pk": "a", "epoch": 1}'],
)
def test_bad_stop_commands(body):
    with pytest.raises(ValueError):
        StopCommand.parse(body)


def test_control_messages_are_a_stop_or_a_handoff():
    handoff = HandoffHint("CONN#a", 3)
    assert parse_control_message(handoff.body()) == handoff
    assert parse_control_message(StopCommand("CONN#a", 2).body()) == StopCommand("CONN#a", 2)


@pytest.mark.parametrize(
    "body",
    ['{"type": "HANDOFF", "pk": "CONN#a"}', '{"type": "HANDOFF", "pk": "a", "epoch": 1}',
     '{"type": "HANDOFF", "pk": "CONN#a", "epoch": -1}', '{"type": "TAKE", "pk": "CONN#a"}'],
)
def test_bad_handoffs(body):
    with pytest.raises(ValueError):
        parse_control_message(body)


def test_control_queue_names_are_valid_and_distinct():
    assert control_queue_name("s-ctl-", "host.a-1") == "s-ctl-host-a-1"
    long_a, long_b = "a" * 100 + "1", "a" * 100 + "2"
    name_a, name_b = control_queue_name("s-ctl-", long_a), control_queue_name("s-ctl-", long_b)
    assert len(name_a) <= QUEUE_NAME_LIMIT and name_a != name_b
    assert name_a.startswith("s-ctl-")


# Hostile bodies (issue #11, finding 2): any of these once raised something other than
# ValueError (RecursionError, TypeError, OverflowError) out of a parser and ended the worker.
HOSTILE_BODIES = [
    "[" * 5000,
    "{" * 5000,
    '{"pk": "CONN#a", "epoch": ' + "[" * 5000 + "1" + "]" * 5000 + "}",
    '{"pk": "CONN#a", "x": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"type": "STOP", "pk": "CONN#a", "epoch": ' + "9" * 5000 + "}",  # int digit limit
    '{"type": "STOP", "pk": "CONN#a", "epoch": 1e999}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": NaN}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": -1}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": 18446744073709551616}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": 1.0}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": "1"}',
    '{"type": "STOP", "pk": "CONN#", "epoch": 1}',
    '{"type": "STOP", "pk": "CONN#a b", "epoch": 1}',
    '{"type": "STOP", "pk": "CONN#' + "a" * 129 + '", "epoch": 1}',
    '{"type": "STOP", "pk": ["CONN#a"], "epoch": 1}',
    '{"type": "STOP", "pk": "CONN#a", "epoch": 1, "pad": "' + "x" * 300_000 + '"}',
    '"\\ud800"',
    "\ud800",
    "\x00",
    "",
    "null",
    '{"pk": "CONN#a", "epoch": true}',
    '{"pk": "CONN#a", "epoch": "3"}',
    '{"pk": "CONN#a/../b"}',
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
@pytest.mark.parametrize(
    "parse", [Hint.parse, StopCommand.parse, parse_control_message], ids=["hint", "stop", "control"]
)
def test_hostile_bodies_are_value_errors(parse, body):
    with pytest.raises(ValueError):
        parse(body)


@pytest.mark.parametrize("body", [None, 3, b"{}", ["CONN#a"]])
def test_bodies_that_are_not_text_are_value_errors(body):
    for parse in (Hint.parse, StopCommand.parse):
        with pytest.raises(ValueError):
            parse(body)


def test_random_bodies_raise_nothing_but_value_error():
    # A bounded, seeded fuzz over the characters that matter to the decoder: brackets,
    # quotes, escapes, digits and valid fragments. Every outcome is a value or a ValueError.
    rng = random.Random(11)
    alphabet = ['[', ']', '{', '}', '"', "\\", ",", ":", "9", "-", "e", "CONN#a", '"pk"',
                '"epoch"', '"type"', '"STOP"', "null", "true", " ", "\ud800"]
    for _ in range(3000):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        for parse in (Hint.parse, StopCommand.parse):
            with contextlib.suppress(ValueError):  # a value or a ValueError; nothing else
                parse(body)


def test_excerpt_never_logs_the_whole_body():
    body = "x" * 100_000
    assert len(excerpt(body)) < 120
    assert excerpt(None) == "<NoneType>"


def test_parsed_fields_are_what_the_stores_expect():
    assert Hint.parse('{"pk": "CONN#a.b:c-d_1", "epoch": 0}') == Hint("CONN#a.b:c-d_1", 0)
    assert StopCommand.parse('{"type":"STOP","pk":"CONN#a","epoch":7}') == StopCommand("CONN#a", 7)


# ----------------------------------------------------------------- STOP confirmation (finding 7)
def _record(state, epoch, pk="CONN#a"):
    return ConnectionRecord(pk=pk, desired_state=state, ws_url="wss://x", lease_epoch=epoch)


@pytest.mark.parametrize(
    ("record", "confirmed"),
    [
        (None, True),  # the item is gone (DELETE)
        (_record(DesiredState.STOPPED, 3), True),
        (_record(DesiredState.STARTED, 3), False),  # forged: the record never said STOP
        (_record(DesiredState.STOPPED, 4), False),  # stale: another epoch
        (_record(DesiredState.STOPPED, 3, pk="CONN#b"), False),
    ],
)
def test_a_stop_is_confirmed_only_by_the_record(record, confirmed):
    assert stop_confirmed(StopCommand("CONN#a", 3), record) is confirmed


def test_control_queue_policy_denies_all_other_senders():
    notifier = "arn:aws-cn:iam::210987654321:role/n"
    doc = json.loads(control_queue_policy("s-ctl-w1", "cn-north-1", [notifier]))
    deny, allow = doc["Statement"]
    queue_arn = "arn:aws-cn:sqs:cn-north-1:210987654321:s-ctl-w1"
    assert deny["Resource"] == allow["Resource"] == queue_arn
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == ("Deny", "*", "sqs:SendMessage")
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": [notifier]}}
    assert allow["Principal"] == {"AWS": [notifier]}
    with pytest.raises(ValueError):
        control_queue_policy("q", "r", ["not-an-arn"])


# ----------------------------------------------------------------- make-before-break (issue #26)
HANDOFF_MESSAGES = [
    PrepareCommand("CONN#a", 3, "task-1.ip-10-0-0-1-7-ab12"),
    PrepareCommand("CONN#a", 3, "g", durable=2**53 - 1, reply_to="s-ctl-g_1"),
    ReadyReply("CONN#a", 3, "task-2.host-9-cd34", 41),
    DeclineReply("CONN#a", 3, "task-2.host-9-cd34", "budget"),
    CommitNotice("CONN#a", 4),
]


@pytest.mark.parametrize("message", HANDOFF_MESSAGES, ids=lambda m: type(m).__name__)
def test_handoff_messages_round_trip(message):
    assert parse_control_message(message.body()) == message


@pytest.mark.parametrize(
    "body",
    [
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3}',  # no giver
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": ""}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "a b"}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "' + "g" * 257 + '"}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": 7}',
        '{"type": "PREPARE", "pk": "CONN#a", "giver": "g"}',  # no epoch
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "g", "durable": -1}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "g", "durable": "7"}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "g", "reply_to": "a/b"}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "g", "reply_to": "'
        + "q" * 81 + '"}',
        '{"type": "PREPARE", "pk": "CONN#a", "epoch": 3, "giver": "g", "reply_to": '
        '"https://evil.example/q"}',
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t"}',  # no first_seq
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t", "first_seq": 0}',
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t", "first_seq": true}',
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t", "first_seq": "4"}',
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t", "first_seq": 1e3}',
        '{"type": "READY", "pk": "CONN#a", "epoch": 3, "taker": "t", "first_seq": '
        + "9" * 20 + "}",
        '{"type": "DECLINE", "pk": "CONN#a", "epoch": 3, "taker": "t"}',
        '{"type": "DECLINE", "pk": "CONN#a", "epoch": 3, "taker": "t", "reason": "whatever"}',
        '{"type": "COMMIT", "pk": "CONN#a", "epoch": 0}',
        '{"type": "COMMIT", "pk": "WORKER#a", "epoch": 2}',
        '{"type": "TRANSFER", "pk": "CONN#a", "epoch": 2}',  # unknown type
        '{"type": ["READY"], "pk": "CONN#a", "epoch": 2}',
    ],
)
def test_bad_handoff_messages_are_value_errors(body):
    with pytest.raises(ValueError):
        parse_control_message(body)


def test_random_handoff_bodies_raise_nothing_but_value_error():
    rng = random.Random(26)
    fragments = ['{', '}', '"', ",", ":", "1", "-", '"type"', '"PREPARE"', '"READY"', '"COMMIT"',
                 '"DECLINE"', '"pk"', '"CONN#a"', '"epoch"', '"giver"', '"taker"', '"first_seq"',
                 '"reason"', '"full"', "null", "true", "\ud800", " "]
    for _ in range(3000):
        body = "".join(rng.choice(fragments) for _ in range(rng.randrange(1, 40)))
        with contextlib.suppress(ValueError):
            parse_control_message(body)


def test_a_taker_reaches_the_givers_queue_beside_its_own():
    own = "http://127.0.0.1:5000/123456789012/s-ctl-taker"
    assert sibling_queue_url(own, control_queue_name("s-ctl-", "giver.1")) == (
        "http://127.0.0.1:5000/123456789012/s-ctl-giver-1"
    )
