"""A real worker refuses a redirect to a host its ALLOWED_UPSTREAM_HOSTS does not list (#11).

The allowed upstream (the simulator on 127.0.0.1) answers the handshake with
``302 Location: ws://127.0.0.2:<port>/<stream>``, where a second simulator on 127.0.0.2 (the
"refused host"; Linux answers the whole loopback range) would happily stream frames. The
worker must not connect there, must store nothing, and must end the connection in a visible
terminal state instead of redirect-looping. Before the fix the worker followed the redirect
and stored the refused host's frames.
"""

from __future__ import annotations

import uuid

import pytest
from fleet_helpers import StoreDriver, WorkerProcess, wait_until

from wsfleet.record import DesiredState
from wsfleet_local.simulator import SimulatorThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def allowed_sim():
    with SimulatorThread(rate=20.0) as running:
        yield running


@pytest.fixture(scope="module")
def refused_sim():
    with SimulatorThread("127.0.0.2", rate=20.0) as running:
        yield running


@pytest.fixture(scope="module")
def env(backend):
    return backend.create_resources(f"wss-{uuid.uuid4().hex[:6]}").env()


@pytest.fixture(scope="module")
def worker(env, allowed_sim, refused_sim, tmp_path_factory):
    # Only the simulator's own address is listed, as in a deployment listing its provider.
    process = WorkerProcess(
        env,
        log_dir=tmp_path_factory.mktemp("workers"),
        ALLOWED_UPSTREAM_HOSTS="127.0.0.1",
        ALLOW_INSECURE_WS="true",
    )
    try:
        yield process
    finally:
        process.stop()


def test_a_redirect_to_a_refused_host_stores_nothing_and_stops_visibly(
    env, allowed_sim, refused_sim, worker
):
    fleet = StoreDriver(env)
    refused_sim.open_stream("evil")  # the refused host has frames ready to serve
    allowed_sim.redirect_stream("evil", refused_sim.url_for("evil") + "?from_seq=1&token=s3cret")

    fleet.start("evil", allowed_sim.url_for("evil"))

    record = fleet.wait_for_state(
        "evil",
        DesiredState.STOPPED,
        timeout=60,
        message=lambda: f"not stopped: {fleet.record('evil')}\n{worker.tail(30)}",
    )
    assert record.stop_reason == "upstream_refused"
    assert record.last_error is not None
    assert "127.0.0.2 is not in ALLOWED_UPSTREAM_HOSTS" in record.last_error
    # query values never reach the record; their names stay visible
    # (wsfleet.upstream_url.redact_url)
    assert "s3cret" not in record.last_error
    assert "?from_seq=***&token=***" in record.last_error
    assert record.lease_owner == ""
    assert refused_sim.sessions("evil") == []  # the worker never reached the refused host
    assert fleet.stored("evil") == []
    assert allowed_sim.redirects_served("evil") == 1  # stopped, not a reconnect loop
    wait_until(
        lambda: worker.metric_total("UpstreamRefused") == 1,
        timeout=30,
        message=lambda: worker.tail(30),
    )


def test_a_redirect_to_http_stops_as_a_refusal_naming_the_scheme(env, allowed_sim, worker):
    # Issue #23: this ended STOPPED with stop_reason invalid_ws_url and an empty last_error,
    # though the stored ws_url was fine and the upstream's redirect was what was refused.
    fleet = StoreDriver(env)
    allowed_sim.open_stream("to-http")
    allowed_sim.redirect_stream("to-http", "http://127.0.0.1:9/to-http?token=s3cret")

    fleet.start("to-http", allowed_sim.url_for("to-http"))

    record = fleet.wait_for_state(
        "to-http",
        DesiredState.STOPPED,
        timeout=60,
        message=lambda: f"not stopped: {fleet.record('to-http')}\n{worker.tail(30)}",
    )
    assert record.stop_reason == "upstream_refused"
    assert record.last_error is not None
    assert "scheme must be wss or ws, got 'http'" in record.last_error
    assert "s3cret" not in record.last_error
    assert allowed_sim.redirects_served("to-http") == 1


def test_a_stored_trailing_dot_host_stops_instead_of_retrying_a_lookup(env, allowed_sim, worker):
    # Issue #23: "ws://127.0.0.1./" passed the router's check (it read an address) and the
    # worker's resolver then failed on the name "127.0.0.1." on every retry, forever. The
    # record is written directly, as one the router accepted before the rule would be.
    fleet = StoreDriver(env)
    allowed_sim.open_stream("dotted")
    dotted = allowed_sim.url_for("dotted").replace("://127.0.0.1:", "://127.0.0.1.:")
    assert dotted != allowed_sim.url_for("dotted")

    fleet.start("dotted", dotted)

    record = fleet.wait_for_state(
        "dotted",
        DesiredState.STOPPED,
        timeout=60,
        message=lambda: f"not stopped: {fleet.record('dotted')}\n{worker.tail(30)}",
    )
    assert record.stop_reason == "upstream_refused"
    assert record.last_error is not None
    assert "must not end with a dot" in record.last_error
    assert allowed_sim.sessions("dotted") == []
