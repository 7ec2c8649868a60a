"""Real workers against real-looking upstreams (#13): handshake options, credentials by
reference from the moto server's Secrets Manager and SSM, resume modes, the gap report.

Every test runs ``python -m wsfleet_worker`` processes against the embedded moto server and
the simulator's stream shapes (header_auth, subscribe, live_only). Waits are bounded polls;
nothing asserts on elapsed time.
"""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import boto3
import fleet_helpers
import pytest
from fleet_helpers import StoreDriver, WorkerProcess, check_stream, wait_until

from wsfleet.record import DesiredState
from wsfleet.upstream_options import UpstreamOptions, parse_upstream_options
from wsfleet_local.simulator import SimulatorThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

sim, fleet, spawn = fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn

ACCOUNT_PREFIXES = (
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/",
    "arn:aws:ssm:us-east-1:123456789012:parameter/wsfleet/",
)


def options(**raw: Any) -> UpstreamOptions:
    return parse_upstream_options(raw, secret_prefixes=ACCOUNT_PREFIXES)


def client(fleet: StoreDriver, service: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(service, endpoint_url=fleet.env["AWS_ENDPOINT_URL"])


def make_secret(fleet: StoreDriver, value: str) -> str:
    name = f"wsfleet/feed-{uuid.uuid4().hex[:8]}"
    return str(client(fleet, "secretsmanager").create_secret(Name=name, SecretString=value)["ARN"])


def make_parameter(fleet: StoreDriver, value: str) -> str:
    name = f"/wsfleet/token-{uuid.uuid4().hex[:8]}"
    ssm = client(fleet, "ssm")
    ssm.put_parameter(Name=name, Value=value, Type="SecureString")
    return f"arn:aws:ssm:us-east-1:123456789012:parameter{name}"


def streaming(fleet: StoreDriver, stream_id: str, worker: WorkerProcess, *, frames: int) -> None:
    wait_until(
        lambda: len(fleet.stored_seqs(stream_id)) >= frames,
        timeout=60,
        message=lambda: f"{fleet.record(stream_id)}\n{worker.tail(30)}",
    )


def contiguous_missing(seqs: list[int]) -> list[int]:
    """Seqs between the first and the last stored one that are not stored."""
    have = set(seqs)
    return [s for s in range(min(have), max(have) + 1) if s not in have]


# --------------------------------------------------------------------------- handshake
def test_headers_subprotocols_and_a_secrets_manager_credential_reach_the_upstream(
    fleet, sim, spawn
):
    arn = make_secret(fleet, json.dumps({"token": "tok-v1"}))
    sim.set_shape("auth", "header_auth", header="Authorization", value="Bearer tok-v1")
    worker = spawn(WORKER_SECRET_CACHE_SECONDS="1")
    fleet.start(
        "auth",
        sim.url_for("auth"),
        upstream=options(
            headers={"X-Client": "acme"},
            subprotocols=["feed.v2"],
            credential={"ref": arn, "header": "Authorization", "format": "Bearer {{secret}}",
                        "json_key": "token"},
        ),
    )
    streaming(fleet, "auth", worker, frames=10)
    session = sim.sessions("auth")[0]
    assert session.headers["Authorization"] == "Bearer tok-v1"
    assert session.headers["X-Client"] == "acme"
    assert session.subprotocols == ("feed.v2",)
    assert "tok-v1" not in worker.output()

    # Rotation: the upstream only takes the new token now; the worker's cached value ages out
    # (WORKER_SECRET_CACHE_SECONDS=1), so a reconnect after the drop presents the new one.
    client(fleet, "secretsmanager").put_secret_value(
        SecretId=arn, SecretString=json.dumps({"token": "tok-v2"})
    )
    sim.set_shape("auth", "header_auth", header="Authorization", value="Bearer tok-v2")
    sim.inject_fault("auth", "drop")
    wait_until(
        lambda: any(
            s.headers.get("Authorization") == "Bearer tok-v2" for s in sim.sessions("auth")
        ),
        timeout=60,
        message=lambda: worker.tail(30),
    )
    before = fleet.record("auth").last_seq
    wait_until(lambda: fleet.record("auth").last_seq > before + 5, timeout=60)
    assert fleet.record("auth").desired_state is DesiredState.STARTED
    assert "tok-v2" not in worker.output()


def test_a_rotated_secret_is_read_again_when_the_upstream_refuses_the_cached_one(
    fleet, sim, spawn
):
    # GIVEN a worker that caches secrets for an hour, streaming with a header credential
    arn = make_secret(fleet, "key-v1")
    sim.set_shape("rotate", "header_auth", header="X-Api-Key", value="key-v1")
    worker = spawn(WORKER_SECRET_CACHE_SECONDS="3600")
    fleet.start(
        "rotate",
        sim.url_for("rotate"),
        upstream=options(credential={"ref": arn, "header": "X-Api-Key"}),
    )
    streaming(fleet, "rotate", worker, frames=5)
    # WHEN the secret is rotated, the upstream accepts only the new value, and the link drops
    client(fleet, "secretsmanager").put_secret_value(SecretId=arn, SecretString="key-v2")
    sim.set_shape("rotate", "header_auth", header="X-Api-Key", value="key-v2")
    sim.inject_fault("rotate", "drop")
    # THEN the refused handshake (401) made the worker read the secret again: the stream
    # resumes with the new value long before the cached one would age out
    wait_until(
        lambda: any(s.headers.get("X-Api-Key") == "key-v2" for s in sim.sessions("rotate")),
        timeout=60,
        message=lambda: f"{sim.auth_rejects('rotate')} rejects\n{worker.tail(30)}",
    )
    before = fleet.record("rotate").last_seq
    wait_until(lambda: fleet.record("rotate").last_seq > before + 5, timeout=60)
    assert 1 <= sim.auth_rejects("rotate") <= 2
    wait_until(lambda: worker.metric_total("CredentialRefreshes") >= 1, timeout=30)
    assert "key-v2" not in worker.output()


def test_ssm_securestring_in_the_query_and_resume_by_subscribe_message(fleet, sim, spawn):
    arn = make_parameter(fleet, "ssm-s3cret")
    sim.set_shape("sub", "subscribe")
    worker = spawn()
    fleet.start(
        "sub",
        sim.url_for("sub"),
        upstream=options(
            credential={"ref": arn, "query": "token"},
            subscribe={"op": "subscribe", "from_seq": "{{from_seq}}"},
            resume="subscribe",
        ),
    )
    streaming(fleet, "sub", worker, frames=15)
    first = sim.sessions("sub")[0]
    assert "token=ssm-s3cret" in first.query and "from_seq" not in first.query
    assert json.loads(first.subscribe or "") == {"op": "subscribe", "from_seq": 1}

    sim.inject_fault("sub", "drop")  # the upstream replays from the subscribe's from_seq
    wait_until(lambda: len(sim.sessions("sub")) >= 2, timeout=60, message=worker.tail)
    checkpoint = fleet.record("sub").last_seq
    wait_until(lambda: fleet.record("sub").last_seq > checkpoint + 10, timeout=60)
    second = sim.sessions("sub")[1]
    assert second.from_seq is not None and second.from_seq > 1 and second.gap == 0
    record = fleet.record("sub")
    assert check_stream(fleet.stored("sub"), "sub", record.last_seq).ok
    assert (record.resume_gaps, record.gap_frames) == (0, 0)
    assert "ssm-s3cret" not in worker.output()


def test_query_mode_with_a_seq_pointer_and_its_own_resume_param(fleet, sim, spawn):
    # The pointer names the simulator's /seq explicitly; the resume parameter is the
    # connection's own ("since" instead of the fleet's from_seq).
    worker = spawn()
    fleet.start(
        "ptr", sim.url_for("ptr"), upstream=options(seq_pointer="/seq", resume_param="since")
    )
    streaming(fleet, "ptr", worker, frames=10)
    assert "since=1" in sim.sessions("ptr")[0].query


def test_an_unreadable_secret_trips_the_breaker_and_the_worker_keeps_running(fleet, sim, spawn):
    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/never-created"
    worker = spawn(WORKER_BREAKER_MAX_FAILURES="3")
    fleet.start("nosecret", sim.url_for("nosecret"),
                upstream=options(credential={"ref": missing, "header": "Authorization"}))
    record = fleet.wait_for_state(
        "nosecret",
        DesiredState.FAILED,
        timeout=120,
        message=lambda: worker.tail(30),
    )
    assert record.last_error == "credential_unavailable"
    assert record.failure_count == 3
    assert sim.sessions("nosecret") == []  # never connected without its credential
    assert worker.is_running()
    wait_until(lambda: worker.metric_total("CredentialFailures") >= 3, timeout=30)
    assert any(missing in (line.get("error") or "") for line in worker.logs())


def test_a_redirect_to_another_origin_is_refused_when_a_credential_rides_on_it(
    fleet, sim, spawn
):
    arn = make_secret(fleet, "redirect-s3cret")
    with SimulatorThread(rate=20.0) as elsewhere:  # same host, other port: another origin
        elsewhere.open_stream("r")
        sim.redirect_stream("r", elsewhere.url_for("r"))
        worker = spawn()
        fleet.start("r", sim.url_for("r"),
                    upstream=options(credential={"ref": arn, "header": "X-Api-Key"}))
        record = fleet.wait_for_state(
            "r",
            DesiredState.STOPPED,
            timeout=60,
            message=lambda: worker.tail(30),
        )
        assert record.stop_reason == "upstream_refused"
        assert "carrying a credential" in (record.last_error or "")
        assert elsewhere.sessions("r") == []
        assert "redirect-s3cret" not in worker.output()


# --------------------------------------------------------------------------- the gap report
def test_live_only_gap_reported_equals_frames_lost_through_a_crash_and_a_hand_off(
    fleet, sim, spawn
):
    """resume: none against a live-only upstream: whatever was produced while nobody listened
    is gone, and the record must say exactly how much.

    The crash comes before the stream's first checkpoint (CHECKPOINT_SECONDS=600): the record
    says last_seq 0 though frames are stored, which is where a gap measured from the stored
    checkpoint reported nothing at all (resume_gap(0, n) == 0). Waiting for the totals to
    appear (not reading them at a guess) is part of the check: an undercount never gets there.
    """
    slow_checkpoints = {"CHECKPOINT_SECONDS": "600"}
    sim.set_shape("live", "live_only")
    a = spawn(**slow_checkpoints)
    fleet.start("live", sim.url_for("live"), upstream=options(resume="none"))
    streaming(fleet, "live", a, frames=20)
    assert fleet.record("live").last_seq == 0  # no checkpoint yet: the case that undercounted

    a.signal(signal.SIGKILL)
    a.wait()
    b = spawn(**slow_checkpoints)

    def taken_over_with_a_gap() -> bool:
        if fleet.record("live").resume_gaps >= 1:
            return True
        fleet.hint_orphans()  # the reconciler's part, once a's lease has lapsed
        return False

    wait_until(
        taken_over_with_a_gap,
        timeout=90,
        interval=0.3,
        message=lambda: f"{fleet.record('live')}\n{b.tail(30)}",
    )
    seqs = fleet.stored_seqs("live")
    record = fleet.record("live")
    lost = contiguous_missing(seqs)
    assert lost, "a live-only upstream must lose what it sent while nobody listened"
    assert (record.resume_gaps, record.gap_frames) == (1, len(lost)), (record, lost)
    crash_gap = record.gap_frames

    # Hand-off: SIGTERM with a peer ready. The old owner flushes and releases; the new one
    # connects live again a moment later: a second (small) gap, added to the first.
    c = spawn(**slow_checkpoints)
    wait_until(lambda: fleet.worker_item(c.worker_id), timeout=60, message=c.tail)
    stored_before = len(seqs)
    b.signal(signal.SIGTERM)
    assert b.wait(30) == 0
    wait_until(
        lambda: fleet.record("live").lease_owner == c.worker_id
        and len(fleet.stored_seqs("live")) > stored_before + 10,
        timeout=60,
        message=lambda: f"{fleet.record('live')}\n{c.tail(30)}",
    )
    # The new owner's note lands just after its first frame: wait for the totals to say
    # what the table shows (an undercount never does).
    wait_until(
        lambda: fleet.record("live").gap_frames
        == len(contiguous_missing(fleet.stored_seqs("live"))),
        timeout=30,
        message=lambda: f"{fleet.record('live')} lost="
        f"{contiguous_missing(fleet.stored_seqs('live'))}",
    )
    record = fleet.record("live")
    handoff_gap = record.gap_frames - crash_gap
    assert record.resume_gaps == 1 + (handoff_gap > 0)
    # Metrics: every gapped resume counted by the worker that saw it (c flushes every second).
    wait_until(
        lambda: b.metric_total("ResumeGapFrames") + c.metric_total("ResumeGapFrames")
        == record.gap_frames,
        timeout=30,
    )
