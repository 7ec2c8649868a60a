"""Losing a worker: SIGKILL (crash), SIGTERM (graceful hand-off) and SIGSTOP (a zombie owner).

Each test runs real worker processes against fresh tables and its own simulator. The
reconciler is another component: where a test needs one, it plays its part itself
(:meth:`StoreDriver.hint_orphans`: query the orphan GSI, send hints).

The invariants checked are the ones wsfleet promises:

* no seq missing and none stored with the wrong content, up to the checkpoint;
* every new upstream session resumes at or before where the previous one stopped (no gap);
* a fenced owner writes nothing more: no checkpoint regresses, no message item is rewritten
  under an old epoch after the new owner's acquire, and it starts over under a new id;
* graceful shutdown hands streams over through released connections and hints, not expiry,
  and retires the worker item.
"""

from __future__ import annotations

import signal
import threading
import time

import fleet_helpers
import pytest
from fleet_helpers import StoreDriver, WorkerProcess, check_stream, resume_problems, wait_until

from wsfleet.hints import Hint
from wsfleet.record import WorkerRecord, connection_pk
from wsfleet.upstream_options import parse_upstream_options
from wsfleet_local.simulator import SimulatorThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Per-test fixtures from fleet_helpers (also used by test_worker_stop.py): a simulator, clients
# over the test's own resources, and worker processes stopped when the test ends. Binding them
# here is what makes pytest find them in this module.
sim, fleet, spawn = fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn


def logs(*workers: WorkerProcess) -> str:
    return "\n---\n".join(w.tail(25) for w in workers)


def registered(fleet: StoreDriver, worker: WorkerProcess) -> None:
    """Wait until the worker has started (its worker item exists): it is polling for hints."""
    wait_until(lambda: fleet.worker_item(worker.worker_id), timeout=60, message=worker.tail)


def owned_by(fleet: StoreDriver, ids: list[str], worker: WorkerProcess, min_seq: int = 1):
    """Wait until ``worker`` holds every stream and has checkpointed at least ``min_seq``."""

    def done():
        records = [fleet.record(i) for i in ids]
        return all(r.lease_owner == worker.worker_id and r.last_seq >= min_seq for r in records)

    wait_until(done, timeout=60, message=lambda: logs(worker))
    return {i: fleet.record(i) for i in ids}


def assert_complete(fleet: StoreDriver, sim: SimulatorThread, stream_id: str) -> None:
    checkpoint = fleet.record(stream_id).last_seq
    check = check_stream(fleet.stored(stream_id), stream_id, checkpoint)
    assert check.ok, (stream_id, check)
    assert resume_problems(sim.sessions(stream_id)) == [], stream_id


def test_sigkill_peer_takes_over_with_no_seq_missing_or_duplicated(fleet, sim, spawn):
    ids = [f"kill{i}" for i in range(4)]
    a = spawn()
    for stream_id in ids:
        fleet.start(stream_id, sim.url_for(stream_id))
    before = owned_by(fleet, ids, a, min_seq=10)
    b = spawn()
    registered(fleet, b)

    a.signal(signal.SIGKILL)
    a.wait()
    # The reconciler's job: once the dead worker's lease expires, hint its connections.
    wait_until(
        lambda: len(fleet.hint_orphans()) == len(ids) or all(
            fleet.record(i).lease_owner == b.worker_id for i in ids
        ),
        timeout=30,
        interval=0.2,
    )
    sent_by_a = {i: max(s.last_seq_sent or 0 for s in sim.sessions(i)) for i in ids}
    after = owned_by(fleet, ids, b)
    for stream_id in ids:
        assert after[stream_id].lease_epoch == before[stream_id].lease_epoch + 1
    owned_by(fleet, ids, b, min_seq=max(sent_by_a.values()) + 10)

    for stream_id in ids:
        assert_complete(fleet, sim, stream_id)


def test_an_early_hint_is_held_until_the_lease_lapses_then_acquired(fleet, sim, spawn):
    """The reconciler's early hint lands up to a second before the lease it names expires
    (SQS delays are whole seconds): the worker waits out the rest instead of dropping it."""
    c = spawn()
    registered(fleet, c)
    # A holder that stopped renewing, its worker lease 1.5 s from the end (a worker item
    # written here plays that holder), and the hint sent now, well before the expiry.
    fleet.store.start("early", sim.url_for("early"))  # no START hint: only the early one
    now = int(time.time() * 1000)
    fleet.store.register_worker(
        WorkerRecord(worker_id="gone-worker", control_queue_url="", started_at_ms=now,
                     heartbeat_at_ms=now, expires_at_ms=now + 1500)
    )
    taken = fleet.store.acquire(connection_pk("early"), "gone-worker")
    fleet.hints.send(Hint(taken.pk, epoch=taken.lease_epoch))

    record = wait_until(
        lambda: (r := fleet.record("early")).lease_owner == c.worker_id and r,
        timeout=30,
        message=lambda: logs(c),
    )
    assert record.lease_epoch == taken.lease_epoch + 1
    assert fleet.worker_item("gone-worker").dead  # killed (after its expiry) before the take


def test_sigterm_hands_every_connection_to_a_peer_without_waiting_for_expiry(fleet, sim, spawn):
    # A lease long enough that "below the lease" is a clear margin on a busy machine.
    timing = {"LEASE_SECONDS": "6", "HEARTBEAT_EVERY": "1", "LEASE_SAFETY_MARGIN_SECONDS": "1"}
    ids = [f"term{i}" for i in range(5)]
    a = spawn(**timing)
    # break mode: one upstream session at a time (overlap drains: test_handoff_overlap.py)
    brk = parse_upstream_options({"handoff": "break"}, secret_prefixes=())
    for stream_id in ids:
        fleet.start(stream_id, sim.url_for(stream_id), upstream=brk)
    before = owned_by(fleet, ids, a, min_seq=5)
    b = spawn(**timing)
    registered(fleet, b)

    sigterm_at = time.time()
    a.signal(signal.SIGTERM)

    assert a.wait(30) == 0
    after = owned_by(fleet, ids, b)
    for stream_id in ids:
        assert after[stream_id].lease_epoch > before[stream_id].lease_epoch
        first_frame = wait_until(lambda s=stream_id: sim.first_frame_at(s, sigterm_at), timeout=30)
        assert first_frame - sigterm_at < 6, f"{stream_id} resumed only after the lease"
        assert sim.overlaps(stream_id) == [], f"{stream_id}: both workers streamed at once"
    (drained,) = a.logs("drained")
    assert (drained["connections"], drained["hints_sent"]) == (5, 5)
    assert fleet.worker_item(a.worker_id).dead  # retired: nothing waits for its expiry
    owned_by(fleet, ids, b, min_seq=max(r.last_seq for r in after.values()) + 5)
    for stream_id in ids:
        assert_complete(fleet, sim, stream_id)


def test_a_paused_owner_is_fenced_and_never_writes_after_the_peers_acquire(fleet, sim, spawn):
    a = spawn()
    fleet.start("zombie", sim.url_for("zombie"))
    before = owned_by(fleet, ["zombie"], a, min_seq=10)["zombie"]
    b = spawn()
    registered(fleet, b)

    # Sample the stored checkpoint throughout: it must never go backwards.
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(fleet.record("zombie").last_seq)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        a.signal(signal.SIGSTOP)
        wait_until(
            lambda: fleet.worker_item(a.worker_id).expires_at_ms < time.time() * 1000,
            timeout=30,
        )
        fleet.hint_orphans()
        after = owned_by(fleet, ["zombie"], b)["zombie"]
        assert after.lease_epoch == before.lease_epoch + 1
        peer_session = wait_until(
            lambda: next((s for s in sim.sessions("zombie")[1:] if s.frames_sent > 20), None),
            timeout=30,
        )
        owned_by(fleet, ["zombie"], b, min_seq=peer_session.from_seq + 10)

        a.signal(signal.SIGCONT)
        zombie_session = sim.sessions("zombie")[0]
        wait_until(
            lambda: not sim.sessions("zombie")[0].is_open, timeout=30, message=lambda: logs(a)
        )
        finished = wait_until(lambda: a.logs("session finished"), timeout=30)
        assert finished[-1]["reason"] == "fenced"
        # Its incarnation is over for good (never renews again); the process starts over
        # under a new id and is an ordinary peer from then on.
        (fenced,) = wait_until(
            lambda: a.logs("worker lease over: every session fenced; this incarnation ends"),
            timeout=30,
        )
        assert fenced["cause"] in ("self-fence", "worker-dead")
        assert fleet.worker_item(a.worker_id).dead  # killed by b's takeover
        (again,) = wait_until(
            lambda: a.logs("worker lease lost: starting over under a new identity"), timeout=30
        )
        assert (again["previous"], again["next"]) == (a.worker_id, f"{a.worker_id}+2")
        reborn = wait_until(
            lambda: fleet.store.get_worker(again["next"]), timeout=30, message=lambda: logs(a)
        )
        assert not reborn.dead and a.is_running()
        owned_by(fleet, ["zombie"], b, min_seq=peer_session.from_seq + 30)
    finally:
        sampling.set()
        sampler.join()

    assert samples == sorted(samples), "the checkpoint went backwards"
    record = fleet.record("zombie")
    assert (record.lease_owner, record.lease_epoch) == (b.worker_id, after.lease_epoch)
    # Everything from where the peer resumed was (re)written by the peer; an item carrying
    # the zombie's epoch there would be a write the zombie made after the peer's acquire.
    late = [
        item["seq"]
        for item in fleet.messages.read_all(connection_pk("zombie"))
        if item.get("seq", 0) >= peer_session.from_seq and item["lease_epoch"] != after.lease_epoch
    ]
    assert late == []
    assert zombie_session.session_id != peer_session.session_id
    assert_complete(fleet, sim, "zombie")
    assert not a.logs("final lease write failed; retrying")
    assert not a.logs("stranded connection released by the sweep")
