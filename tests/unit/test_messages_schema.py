"""Hint and control message schemas (what crosses SQS)."""

import json

import pytest

from wsfleet.control import QUEUE_NAME_LIMIT, StopCommand, control_queue_name
from wsfleet.hints import Hint


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


def test_control_queue_names_are_valid_and_distinct():
    assert control_queue_name("s-ctl-", "host.a-1") == "s-ctl-host-a-1"
    long_a, long_b = "a" * 100 + "1", "a" * 100 + "2"
    name_a, name_b = control_queue_name("s-ctl-", long_a), control_queue_name("s-ctl-", long_b)
    assert len(name_a) <= QUEUE_NAME_LIMIT and name_a != name_b
    assert name_a.startswith("s-ctl-")
