"""The local FilterCriteria matcher agrees with moto's own event-pattern matcher (moto.events)
on every sample event in events/ for every rule pattern in template.yaml.

The matcher keeps its own code (Lambda's subset, strict parsing, no I/O); this cross-check is
a second opinion from an independent implementation of the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.events.models import EventPattern

from wsfleet_local.backend import find_template, load_template
from wsfleet_local.eventfilter import matches, parse_pattern

EVENTS_DIR = find_template().parent / "events"


def _patterns(node: Any) -> Iterator[str]:
    """Every FilterCriteria pattern and EventBridge EventPattern anywhere in the template."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "FilterCriteria" and isinstance(value, dict):
                yield from (f["Pattern"] for f in value.get("Filters", []) if "Pattern" in f)
            elif key == "EventPattern":
                yield value if isinstance(value, str) else json.dumps(value)
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)


PATTERNS = sorted(set(_patterns(load_template(find_template())["Resources"])))
SAMPLES = sorted(EVENTS_DIR.glob("*.json"))


def _records(path: Path) -> list[dict[str, Any]]:
    """What a pattern is matched against: each record of a batch, else the event itself."""
    event = json.loads(path.read_text(encoding="utf-8"))
    return list(event["Records"]) if "Records" in event else [event]


def test_the_template_has_patterns_and_events_has_samples() -> None:
    assert PATTERNS and len(SAMPLES) >= 10


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda path: path.stem)
def test_local_matcher_agrees_with_moto_on_every_sample(pattern: str, sample: Path) -> None:
    # GIVEN a template pattern, as our matcher and as moto's EventPattern read it
    ours = parse_pattern(pattern)
    theirs = EventPattern(pattern, json.loads(pattern))

    # WHEN each record of the sample is matched THEN both say the same
    for record in _records(sample):
        assert matches(ours, record) is theirs.matches_event(record), record


def test_the_stop_sample_passes_the_filter_and_the_ignored_one_does_not() -> None:
    # a cross-check where nothing ever matches would prove little
    [pattern] = [p for p in PATTERNS if "STOPPED" in p]
    parsed = parse_pattern(pattern)
    assert all(matches(parsed, r) for r in _records(EVENTS_DIR / "stream_stop_modify.json"))
    assert not any(matches(parsed, r) for r in _records(EVENTS_DIR / "stream_ignored_modify.json"))
