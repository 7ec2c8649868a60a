"""README's "What it costs" matches what the bench measured, the prices the bench uses and the
template's parameters.

The frame-storage rows are `python -m bench --only sinks` (bench/results.json, step
``sinks``, 100 connections x 20 frames/s): a re-run that moves a figure by more than 10 %
fails here until the README says so. The coordination row is step ``coordination-cost-1000``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.sink_cost import FRAMES_PER_CONNECTION_HOUR, PRICES, PRICES_CHECKED
from wsfleet_local.backend import load_template

ROOT = Path(__file__).resolve().parents[2]
SINKS = {"dynamodb": "dynamodb", "kinesis, aggregated": "kinesis-aggregated",
         "kinesis, plain": "kinesis-plain", "firehose": "firehose"}  # fmt: skip
FRAMES = {"200 B": 200, "1 KB": 1024}


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## What it costs\n")
    return text[start : text.index("\n## ", start + 1)]


def rows(header_start: str) -> list[list[str]]:
    """The cells of the table whose header starts with ``header_start``."""
    lines = section().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    out = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        out.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return out


def results() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ROOT / "bench" / "results.json").read_text())
    return document["results"]


def usd(cell: str) -> float:
    return float(cell.replace(",", "").lstrip("$"))


def storage_rows() -> list[tuple[str, int, float, float]]:
    found = []
    for sink, frame, _buys, per_million, per_hour in rows("| sink | frame |"):
        name = SINKS[re.sub(r" \(.*\)$", "", sink)]
        found.append((name, FRAMES[frame], usd(per_million), usd(per_hour)))
    return found


def test_every_sink_and_frame_size_has_its_row():
    assert {(n, f) for n, f, *_ in storage_rows()} == {(n, f) for n in SINKS.values()
                                                       for f in FRAMES.values()}  # fmt: skip


def test_a_connection_hour_is_72000_frames_of_the_per_million_cost():
    for name, frame, per_million, per_hour in storage_rows():
        assert per_hour == pytest.approx(
            per_million * FRAMES_PER_CONNECTION_HOUR / 1e6, rel=0.02, abs=2e-6
        ), (name, frame)


def test_the_storage_figures_are_the_measured_ones():
    measured = {
        (row["sink"], row["frame_bytes"]): row["cost"]["usd_per_million_frames"]
        for row in results()["sinks"]["rows"]
        if row.get("connections") == 100 and "cost" in row
    }
    for name, frame, per_million, _per_hour in storage_rows():
        assert per_million == pytest.approx(measured[(name, frame)], rel=0.10), (name, frame)


def test_the_coordination_row_is_the_measured_one_at_list_prices():
    ((what, units, _buys, cost),) = rows("| per connection-hour |")
    assert what.startswith("coordination")
    totals = results()["coordination-cost-1000"]["totals_per_connection_hour"]
    writes, reads = (float(x) for x in re.findall(r"([\d.]+) (?:write|read) units", units))
    assert (writes, reads) == (round(totals["write_units"], 2), round(totals["read_units"], 2))
    expected = (writes * PRICES["dynamodb_per_million_write_request_units"]
                + reads * PRICES["dynamodb_per_million_read_request_units"]) / 1e6  # fmt: skip
    assert usd(cost) == pytest.approx(expected, rel=0.02)


def test_the_prices_are_the_benchs_and_dated():
    text = " ".join(section().split())
    for phrase, key in (
        ("${} per million write", "dynamodb_per_million_write_request_units"),
        ("${} per million read", "dynamodb_per_million_read_request_units"),
        ("${} per million PUT payload units", "kinesis_per_million_put_payload_units"),
        ("${} per shard-hour", "kinesis_per_shard_hour"),
        ("${} per GB in", "kinesis_on_demand_per_gb_in"),
        ("${} per stream-hour", "kinesis_on_demand_per_stream_hour"),
        ("Firehose Direct PUT ${} per GB", "firehose_direct_put_per_gb"),
    ):
        assert phrase.format(f"{PRICES[key]:g}") in text, key
    assert PRICES_CHECKED in text


def test_the_parameters_it_names_are_the_templates():
    template = load_template(ROOT / "template.yaml")
    parameters = template["Parameters"]
    text = section()
    assert "(`MessageSink` default)" in text and parameters["MessageSink"]["Default"] == "dynamodb"
    assert "(`MessageKinesisAggregation` default)" in text
    assert str(parameters["MessageKinesisAggregation"]["Default"]).lower() == "true"
    # the stack's own stream (MessageStreamArn empty) is on-demand, as the section says
    assert "`MessageStreamArn` is empty is **on-demand**" in " ".join(text.split())
    stream = template["Resources"]["FrameStream"]["Properties"]
    assert stream["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    assert "on-demand stream" in (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
