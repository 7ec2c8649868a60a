"""The demo's audit: what counts as lost and as duplicated."""

from __future__ import annotations

from wsfleet_local.audit import FleetAudit, audit_stream, latency_summary
from wsfleet_local.simulator import SessionRecord


def items(stream: str, seqs, epoch=1, data=None):
    return [{"seq": s, "message_data": data or f"{stream}:{s}", "lease_epoch": epoch} for s in seqs]


def session(n: int, opened: float, closed: float | None, gap: int = 0) -> SessionRecord:
    return SessionRecord(
        stream_id="s",
        session_id=n,
        peer="p",
        from_seq=1,
        opened_at=opened,
        closed_at=closed,
        gap=gap,
    )


def test_an_ended_stream_must_hold_every_produced_seq():
    # GIVEN the upstream ended at 5 but seq 4 is not stored (even though checkpoint says 3)
    audit = audit_stream(
        "s", final_seq=5, ended=True, checkpointed=3, items=items("s", [1, 2, 3, 5]), sessions=[]
    )
    assert audit.missing == (4,) and audit.lost == 1


def test_a_stopped_stream_must_hold_every_seq_up_to_its_checkpoint():
    audit = audit_stream(
        "s", final_seq=10, ended=False, checkpointed=3, items=items("s", [1, 2, 3]), sessions=[]
    )
    assert audit.lost == 0
    audit = audit_stream(
        "s", final_seq=10, ended=False, checkpointed=3, items=items("s", [1, 3]), sessions=[]
    )
    assert audit.missing == (2,)


def test_wrong_content_counts_as_duplicated():
    audit = audit_stream(
        "s",
        final_seq=2,
        ended=True,
        checkpointed=2,
        items=items("s", [1]) + items("s", [2], data="other:2"),
        sessions=[],
    )
    assert audit.corrupt == (2,) and audit.duplicated == 1


def test_a_write_under_an_older_epoch_after_a_takeover_is_stale():
    stored = items("s", [1, 2], epoch=1) + items("s", [3], epoch=2) + items("s", [4], epoch=1)
    audit = audit_stream("s", final_seq=4, ended=True, checkpointed=4, items=stored, sessions=[])
    assert audit.stale_epoch == (4,)


def test_leftovers_beyond_the_checkpoint_of_a_stopped_stream_are_not_stale():
    # an older owner stored 5..6 before crashing; the new owner checkpointed 4 and was STOPPED
    stored = items("s", [1, 2], epoch=1) + items("s", [3, 4], epoch=2) + items("s", [5, 6], epoch=1)
    audit = audit_stream("s", final_seq=6, ended=False, checkpointed=4, items=stored, sessions=[])
    assert audit.duplicated == 0 and audit.stored == 6


def test_overlapping_sessions_are_reported_but_are_not_duplicates():
    # make-before-break overlaps two sessions on purpose: what was stored decides
    sessions = [session(1, 0.0, 5.0), session(2, 4.0, None), session(3, 6.0, 7.0)]
    audit = audit_stream("s", final_seq=0, ended=True, checkpointed=0, items=[], sessions=sessions)
    assert audit.overlapping_sessions == 2  # (1,2) and (2,3)
    assert audit.duplicated == 0


def test_fleet_totals_and_latency_summary():
    one = audit_stream(
        "a",
        final_seq=2,
        ended=True,
        checkpointed=2,
        items=items("a", [1, 2]),
        sessions=[session(1, 0, 1, gap=0)],
    )
    two = audit_stream(
        "b", final_seq=3, ended=False, checkpointed=1, items=items("b", [1]), sessions=[]
    )
    fleet = FleetAudit((one, two))
    assert (fleet.produced, fleet.stored, fleet.lost, fleet.duplicated) == (5, 3, 0, 0)
    assert fleet.ok
    assert latency_summary([1.0, 3.0, 2.0]) == (2.0, 3.0)
    assert latency_summary([]) is None
