"""Lambda event filtering (``FilterCriteria``) done locally: the poller drops what AWS drops.

The STOP notifier's DynamoDB Streams event source carries ``FilterCriteria`` in template.yaml;
on AWS, Lambda evaluates them before a record ever reaches the handler. Locally the streams
poller must apply exactly the same patterns, or the handler would see (and be tested against)
records it never gets in production. This module is the pure core of that: a pattern in, a
record in, a boolean out. No I/O, no clock.

Supported pattern syntax (the Lambda/EventBridge content-filter subset)::

    {"eventName": ["MODIFY", "INSERT"]}            exact match, any of (strings, numbers, null)
    {"a": {"b": {"S": ["x"]}}}                       nested objects: every key must match (AND)
    {"a": [{"prefix": "us-"}]}                      begins with
    {"a": [{"suffix": ".png"}]}                     ends with
    {"a": [{"equals-ignore-case": "alice"}]}        case-insensitive equality
    {"a": [{"anything-but": ["x", "y"]}]}            not any of (also a single value,
    {"a": [{"anything-but": {"prefix": "x"}}]}       or a prefix/suffix/equals-ignore-case)
    {"a": [{"exists": true}]}, [{"exists": false}]   the field is present / absent
    {"a": [{"numeric": [">", 0, "<=", 5]}]}          numeric comparisons (ANDed)
    {"$or": [{...}, {...}]}                           any of several sub-patterns

A list in the *record* matches if any of its elements matches. A nested pattern over a list of
objects (``{"containers": {"lastStatus": ["STOPPED"]}}`` against an ECS event's
``containers``) matches as EventBridge matches it: the array is flattened, so each key of the
sub-pattern must match in some element (not necessarily the same one). Only ``exists: false``
matches an absent field. Several filters (``FilterCriteria.Filters``) are ORed: a record passes
if any pattern matches.

Example::

    >>> pattern = parse_pattern('{"eventName": ["MODIFY"], "dynamodb": {"NewImage": '
    ...                         '{"desired_state": {"S": ["STOPPED"]}}}}')
    >>> matches(pattern, {"eventName": "MODIFY",
    ...                   "dynamodb": {"NewImage": {"desired_state": {"S": "STOPPED"}}}})
    True
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wsfleet.exceptions import ConfigurationError

__all__ = ["FilterPatternError", "RecordFilter", "matches", "parse_pattern"]

_MISSING = object()

_COMPARATORS: dict[str, Callable[[float, float], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class FilterPatternError(ConfigurationError):
    """A FilterCriteria pattern is malformed or uses syntax this matcher does not support."""


def parse_pattern(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """Decode one ``Pattern`` (a JSON string in templates) and check its syntax up front.

    Checking when the poller starts turns a typo in template.yaml into an error at ``local up``
    rather than a silently dropped STOP at run time.
    """
    try:
        pattern = json.loads(text) if isinstance(text, str) else dict(text)
    except ValueError as exc:
        raise FilterPatternError(f"filter pattern is not JSON: {exc}") from exc
    if not isinstance(pattern, dict):
        raise FilterPatternError(f"filter pattern must be a JSON object, got {pattern!r}")
    _check_object(pattern, path="")
    return pattern


def _check_object(pattern: Mapping[str, Any], path: str) -> None:
    for key, value in pattern.items():
        where = f"{path}.{key}" if path else key
        if key == "$or":
            if not isinstance(value, list) or len(value) < 2:
                raise FilterPatternError(f"{where}: $or needs a list of at least two patterns")
            for index, branch in enumerate(value):
                if not isinstance(branch, dict):
                    raise FilterPatternError(f"{where}[{index}]: must be an object")
                _check_object(branch, f"{where}[{index}]")
        elif isinstance(value, dict):
            _check_object(value, where)
        elif isinstance(value, list):
            if not value:
                raise FilterPatternError(f"{where}: an empty list matches nothing")
            for rule in value:
                _check_rule(rule, where)
        else:
            raise FilterPatternError(f"{where}: values must be lists or objects, got {value!r}")


def _check_rule(rule: Any, where: str) -> None:
    if rule is None or isinstance(rule, str | int | float | bool):
        return
    if not isinstance(rule, dict) or len(rule) != 1:
        raise FilterPatternError(f"{where}: {rule!r} is not a value or a one-key operator")
    ((name, argument),) = rule.items()
    if name in ("prefix", "suffix", "equals-ignore-case"):
        if not isinstance(argument, str):
            raise FilterPatternError(f"{where}: {name} needs a string")
    elif name == "exists":
        if not isinstance(argument, bool):
            raise FilterPatternError(f"{where}: exists needs true or false")
    elif name == "anything-but":
        if isinstance(argument, dict):
            _check_rule(argument, where)
            if next(iter(argument)) not in ("prefix", "suffix", "equals-ignore-case"):
                raise FilterPatternError(f"{where}: unsupported anything-but operator {argument}")
        elif isinstance(argument, list):
            if not argument:
                raise FilterPatternError(f"{where}: anything-but needs at least one value")
        elif not isinstance(argument, str | int | float):
            raise FilterPatternError(f"{where}: anything-but needs values")
    elif name == "numeric":
        _numeric_terms(argument, where)
    else:
        raise FilterPatternError(f"{where}: unsupported filter operator {name!r}")


def _numeric_terms(argument: Any, where: str = "numeric") -> list[tuple[str, float]]:
    if not isinstance(argument, list) or not argument or len(argument) % 2:
        raise FilterPatternError(f"{where}: numeric needs [op, number, ...]")
    terms = []
    for op, bound in zip(argument[::2], argument[1::2], strict=True):
        valid_bound = isinstance(bound, int | float) and not isinstance(bound, bool)
        if op not in _COMPARATORS or not valid_bound:
            raise FilterPatternError(f"{where}: bad numeric term {op!r} {bound!r}")
        terms.append((op, float(bound)))
    return terms


def matches(pattern: Mapping[str, Any], record: Any) -> bool:
    """True if ``record`` (a decoded JSON object) satisfies every key of ``pattern``."""
    if not isinstance(record, Mapping):
        return False
    for key, expected in pattern.items():
        if key == "$or":
            if not any(matches(branch, record) for branch in expected):
                return False
            continue
        actual = record.get(key, _MISSING)
        if isinstance(expected, Mapping) and isinstance(actual, list):
            if not _matches_flattened(expected, actual):
                return False
        elif isinstance(expected, Mapping):
            if not matches(expected, actual if actual is not _MISSING else {}):
                return False
        elif not _matches_rules(expected, actual):
            return False
    return True


def _matches_flattened(pattern: Mapping[str, Any], items: Sequence[Any]) -> bool:
    """A sub-pattern over an array of objects: every key matches in some object."""
    objects = [item for item in items if isinstance(item, Mapping)] or [{}]
    return all(
        any(matches({key: expected}, item) for item in objects)
        for key, expected in pattern.items()
    )


def _matches_rules(rules: Sequence[Any], actual: Any) -> bool:
    """A leaf: any rule of the list may match; a list value matches through any element."""
    if actual is _MISSING:
        return any(isinstance(rule, Mapping) and rule.get("exists") is False for rule in rules)
    values: Iterable[Any] = actual if isinstance(actual, list) else (actual,)
    values = list(values)
    for rule in rules:
        if isinstance(rule, Mapping) and "exists" in rule:
            if rule["exists"] is True:
                return True
            continue
        if any(_matches_rule(rule, value) for value in values):
            return True
    return False


def _matches_rule(rule: Any, value: Any) -> bool:
    if isinstance(value, Mapping | list):
        return False  # filters compare leaves only
    if not isinstance(rule, Mapping):
        return _equal(rule, value)
    ((name, argument),) = rule.items()
    if name == "prefix":
        return isinstance(value, str) and value.startswith(argument)
    if name == "suffix":
        return isinstance(value, str) and value.endswith(argument)
    if name == "equals-ignore-case":
        return isinstance(value, str) and value.casefold() == argument.casefold()
    if name == "anything-but":
        if isinstance(argument, Mapping):
            return not _matches_rule(argument, value)
        excluded = argument if isinstance(argument, list) else [argument]
        return not any(_equal(item, value) for item in excluded)
    if name == "numeric":
        number = _as_number(value)
        return number is not None and all(
            _COMPARATORS[op](number, bound) for op, bound in _numeric_terms(argument)
        )
    return False


def _equal(expected: Any, value: Any) -> bool:
    """JSON equality: 5 equals 5.0, but a string never equals a number (as in Lambda)."""
    if expected is None or value is None:
        return expected is None and value is None
    if isinstance(expected, bool) or isinstance(value, bool):
        return type(expected) is type(value) and expected == value
    if isinstance(expected, int | float) and isinstance(value, int | float):
        return float(expected) == float(value)
    return type(expected) is type(value) and expected == value


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return None if math.isnan(number) else number


@dataclass(frozen=True)
class RecordFilter:
    """The ``FilterCriteria`` of one event source: records pass if any pattern matches.

    No patterns at all means no filtering (every record passes), as on AWS.

    Example::

        >>> pattern = '{"eventName": ["INSERT"]}'
        >>> keep = RecordFilter.from_criteria({"Filters": [{"Pattern": pattern}]})
        >>> keep({"eventName": "INSERT"}), keep({"eventName": "REMOVE"})
        (True, False)
    """

    patterns: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_criteria(cls, criteria: Mapping[str, Any] | None) -> RecordFilter:
        """Build from a template's ``FilterCriteria`` (``{"Filters": [{"Pattern": ...}]}``)."""
        if not criteria:
            return cls()
        filters = criteria.get("Filters")
        if not isinstance(filters, list):
            raise FilterPatternError("FilterCriteria.Filters must be a list")
        patterns = []
        for index, item in enumerate(filters):
            if not isinstance(item, Mapping) or "Pattern" not in item:
                raise FilterPatternError(f"FilterCriteria.Filters[{index}] has no Pattern")
            patterns.append(parse_pattern(item["Pattern"]))
        return cls(tuple(patterns))

    def __call__(self, record: Mapping[str, Any]) -> bool:
        return not self.patterns or any(matches(p, record) for p in self.patterns)
