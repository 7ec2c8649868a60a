"""The local FilterCriteria matcher: Lambda's pattern rules, and the template's real pattern."""

from __future__ import annotations

import json

import pytest

from wsfleet_local.eventfilter import FilterPatternError, RecordFilter, matches, parse_pattern


def stream_record(event_name: str, old_state: str | None, new_state: str | None) -> dict:
    """A Lambda-shaped DynamoDB Streams record of a connection item."""
    dynamodb: dict = {"Keys": {"pk": {"S": "CONN#a"}}, "SequenceNumber": "1"}
    if old_state is not None:
        dynamodb["OldImage"] = {"pk": {"S": "CONN#a"}, "desired_state": {"S": old_state}}
    if new_state is not None:
        dynamodb["NewImage"] = {"pk": {"S": "CONN#a"}, "desired_state": {"S": new_state}}
    return {"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": dynamodb}


@pytest.mark.parametrize(
    ("rule", "value", "expected"),
    [
        (["MODIFY", "INSERT"], "MODIFY", True),
        (["MODIFY"], "REMOVE", False),
        ([5], 5.0, True),
        ([5], "5", False),  # a string never equals a number
        ([None], None, True),
        ([""], "", True),
        ([True], True, True),
        ([True], 1, False),
        ([{"prefix": "CONN#"}], "CONN#a", True),
        ([{"prefix": "CONN#"}], "WORKER#a", False),
        ([{"suffix": ".png"}], "a.png", True),
        ([{"equals-ignore-case": "stopped"}], "STOPPED", True),
        ([{"anything-but": ["STOPPED"]}], "STARTED", True),
        ([{"anything-but": ["STOPPED"]}], "STOPPED", False),
        ([{"anything-but": "STOPPED"}], "STOPPED", False),
        ([{"anything-but": {"prefix": "WORKER#"}}], "CONN#a", True),
        ([{"anything-but": {"prefix": "WORKER#"}}], "WORKER#a", False),
        ([{"numeric": [">", 0, "<=", 5]}], 5, True),
        ([{"numeric": [">", 0, "<=", 5]}], 6, False),
        ([{"numeric": ["=", 3]}], "3", False),  # numeric compares numbers only
        ([{"exists": True}], "x", True),
        ([{"exists": False}], "x", False),
        (["a", {"prefix": "zz"}], "zzz", True),  # rules of a list are ORed
        (["a"], ["b", "a"], True),  # a list value matches through any element
        (["a"], {"S": "a"}, False),  # leaves only: an object never matches a value rule
    ],
)
def test_leaf_rules(rule, value, expected):
    # GIVEN a one-key pattern WHEN matched against a record holding value THEN as Lambda does
    assert matches(parse_pattern({"f": rule}), {"f": value}) is expected


def test_missing_field_matches_only_exists_false():
    assert matches(parse_pattern({"f": [{"exists": False}]}), {}) is True
    assert matches(parse_pattern({"f": [{"exists": True}]}), {}) is False
    assert matches(parse_pattern({"f": [{"anything-but": ["x"]}]}), {}) is False
    assert matches(parse_pattern({"a": {"b": [{"exists": False}]}}), {}) is True


def test_nested_keys_are_anded_and_or_branches_ored():
    pattern = parse_pattern(
        {"eventName": ["MODIFY"], "$or": [{"x": ["1"]}, {"y": [{"exists": True}]}]}
    )
    assert matches(pattern, {"eventName": "MODIFY", "x": "1"})
    assert matches(pattern, {"eventName": "MODIFY", "y": 0})
    assert not matches(pattern, {"eventName": "MODIFY", "x": "2"})
    assert not matches(pattern, {"eventName": "INSERT", "x": "1"})


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        "[1, 2]",
        '{"f": "MODIFY"}',
        '{"f": []}',
        '{"f": [{"wildcard": "*"}]}',
        '{"f": [{"prefix": 1}]}',
        '{"f": [{"numeric": [">", "a"]}]}',
        '{"f": [{"numeric": [">"]}]}',
        '{"f": [{"exists": "yes"}]}',
        '{"$or": [{"a": ["1"]}]}',
    ],
)
def test_malformed_patterns_are_refused_up_front(bad):
    with pytest.raises(FilterPatternError):
        parse_pattern(bad)


def test_filters_are_ored_and_no_filter_passes_everything():
    keep = RecordFilter.from_criteria(
        {"Filters": [{"Pattern": '{"eventName": ["INSERT"]}'}, {"Pattern": '{"k": ["v"]}'}]}
    )
    assert keep({"eventName": "INSERT"}) and keep({"k": "v"})
    assert not keep({"eventName": "REMOVE"})
    assert RecordFilter.from_criteria(None)({"anything": 1})
    with pytest.raises(FilterPatternError):
        RecordFilter.from_criteria({"Filters": [{"NotPattern": "{}"}]})


STOP_TRANSITION = json.dumps(
    {
        "eventName": ["MODIFY"],
        "dynamodb": {
            "NewImage": {"desired_state": {"S": ["STOPPED"]}},
            "OldImage": {"desired_state": {"S": [{"anything-but": ["STOPPED"]}]}},
        },
    }
)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (stream_record("MODIFY", "STARTED", "STOPPED"), True),
        (stream_record("MODIFY", "STOPPED", "STOPPED"), False),  # a write to a stopped item
        (stream_record("MODIFY", "STARTED", "STARTED"), False),  # a heartbeat
        (stream_record("INSERT", None, "STOPPED"), False),
        (stream_record("REMOVE", "STOPPED", None), False),
    ],
)
def test_hand_written_stop_transition_pattern(record, expected):
    keep = RecordFilter.from_criteria({"Filters": [{"Pattern": STOP_TRANSITION}]})
    assert keep(record) is expected


def test_a_nested_pattern_over_an_array_of_objects_matches_like_eventbridge():
    # GIVEN the task exit rule's pattern and ECS events with several containers
    pattern = parse_pattern({"detail": {"containers": {"lastStatus": ["STOPPED"]}}})
    def event(*statuses: str) -> dict:
        return {"detail": {"containers": [{"name": f"c{i}", "lastStatus": s}
                                          for i, s in enumerate(statuses)]}}  # fmt: skip
    # THEN any stopped container matches, none does not, and an empty list is absent
    assert matches(pattern, event("RUNNING", "STOPPED"))
    assert not matches(pattern, event("RUNNING", "PENDING"))
    assert not matches(pattern, event())
    # AND the array is flattened: each key may match in a different element
    both = parse_pattern({"c": {"name": ["a"], "lastStatus": ["STOPPED"]}})
    assert matches(both, {"c": [{"name": "a", "lastStatus": "RUNNING"}, {"lastStatus": "STOPPED"}]})
    assert not matches(both, {"c": [{"name": "b", "lastStatus": "STOPPED"}]})
    absent = parse_pattern({"c": {"x": [{"exists": False}]}})
    assert matches(absent, {"c": []}) and matches(absent, {"c": [{"y": 1}]})
