"""The API's view of a connection (wsfleet.views): pure, no backend, no clock."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from wsfleet.record import ConnectionRecord, WorkerRecord
from wsfleet.views import connection_view, lease_view

NOW = 1_000_000
URL = "wss://stream.example.com/feed?token=abc"


def record(**changes: Any) -> ConnectionRecord:
    return ConnectionRecord.new("c1", URL, NOW - 10).with_changes(**changes)


def worker(**changes: Any) -> WorkerRecord:
    """The owner's worker item: its lease runs to ``expires_at_ms``."""
    fields: dict[str, Any] = {
        "worker_id": "w1", "control_queue_url": "q://w1", "started_at_ms": 0,
        "heartbeat_at_ms": NOW, "expires_at_ms": NOW + 1500,
    }
    return WorkerRecord(**{**fields, **changes})


class TestLeaseView:
    def test_free(self):
        assert lease_view(record(), None, NOW) == {
            "state": "free", "owner": None, "epoch": 0, "expires_in_ms": None,
        }

    def test_released_lease_is_free_but_keeps_its_epoch(self):
        view = lease_view(record(lease_epoch=4), None, NOW)
        assert (view["state"], view["epoch"]) == ("free", 4)

    def test_held_while_the_owners_worker_lease_runs(self):
        held = record(lease_owner="w1", lease_epoch=2)
        assert lease_view(held, worker(), NOW) == {
            "state": "held", "owner": "w1", "epoch": 2, "expires_in_ms": 1500,
        }

    @pytest.mark.parametrize(
        "owner",
        [worker(expires_at_ms=NOW - 1), worker(dead_at_ms=NOW - 5), None],
        ids=["lapsed", "killed", "item-gone"],
    )
    def test_expired_once_the_owner_is_not_alive(self, owner):
        stale = record(lease_owner="w1", lease_epoch=2)
        assert lease_view(stale, owner, NOW) == {
            "state": "expired", "owner": "w1", "epoch": 2, "expires_in_ms": 0,
        }


def test_connection_view_redacts_the_url_and_lists_every_field():
    view = connection_view(record(last_seq=9, stop_reason=None), None, NOW)

    assert view["ws_url"] == "wss://stream.example.com/feed?token=***"
    assert view["connection_id"] == "c1"
    assert view["desired_state"] == "STARTED"
    assert view["last_seq"] == 9
    assert list(view) == [
        "connection_id", "desired_state", "ws_url", "resume", "last_seq", "lease",
        "stop_reason", "last_error", "failures", "upstream", "gaps", "replayed",
        "created_at_ms", "updated_at_ms",
    ]
    assert view["failures"] == {"count": 0, "at_seq": None}
    assert view["replayed"] == {"takeovers": 0, "frames": 0, "from_seq": None, "to_seq": None}


def test_the_view_reports_the_last_replay_window_and_the_totals():
    view = connection_view(
        record(replayed_takeovers=2, replayed_frames=7, replayed_from_seq=41,
               replayed_to_seq=60, sent_limit=1060),
        None,
        NOW,
    )
    assert view["replayed"] == {"takeovers": 2, "frames": 7, "from_seq": 41, "to_seq": 60}


def test_the_readmes_name_the_gap_report_as_the_view_has_it():
    # Issue #23: worker/README.md said the view shows `resume_gaps` and `gap_frames` (the
    # item's attribute names); the view has gaps: {resumes, frames}.
    root = Path(__file__).resolve().parents[2]
    view = connection_view(record(resume_gaps=2, gap_frames=9), None, NOW)
    assert view["gaps"] == {"resumes": 2, "frames": 9}
    for readme in ("README.md", "worker/README.md"):
        text = " ".join((root / readme).read_text(encoding="utf-8").split())
        claims = re.findall(r"`GET /connections/\{id\}` shows (?:them as )?`([^`]+)`", text)
        claims += re.findall(r"connection view has `([^`]+)`", text)
        assert claims, readme
        for claim in claims:
            name, _, inner = claim.partition(":")
            assert name.strip() in view, (readme, claim)
            for key in re.findall(r'"(\w+)"', inner):
                assert key in view[name.strip()], (readme, claim)
