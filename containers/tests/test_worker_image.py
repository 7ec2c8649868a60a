"""The worker image, built from worker/Dockerfile on the stand-in base with a host-made
wheelhouse, run the way the ECS task definition runs it (template.yaml: its user, read-only
root filesystem, the /tmp volume, the stop timeout, the image's HEALTHCHECK), in the local
fleet on the host (LocalFleet listening on the docker bridge's gateway address):

* a START streams frames into the messages table;
* `docker stop` (SIGTERM) drains: the connection is released and a host worker takes it over,
  nothing lost;
* `docker kill` (SIGKILL) fails the connection over to a host worker once the lease lapses;
* the health check reports healthy, then unhealthy while the container is paused.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fleet_helpers import StoreDriver
from harness import INVOKE_IMAGE, PYTHON_BASE, ROOT, run, tail

from bench.waiting import wait_until
from wsfleet.record import DesiredState
from wsfleet.settings import ENVIRONMENT
from wsfleet.upstream_options import parse_upstream_options
from wsfleet_local.backend import find_template, load_template
from wsfleet_local.fleet import FleetTimings, LocalFleet
from wsfleet_local.stack import container_environment

pytestmark = pytest.mark.timeout(1800)

IMAGE = "wsfleet-worker:sam-local"
TIMINGS = FleetTimings(max_connections=1, rebalance_max_moves=0, drain_timeout_seconds=10.0)


def task_container() -> dict[str, Any]:
    """The worker's container definition in template.yaml (what ECS runs)."""
    (task,) = [
        r for r in load_template(find_template())["Resources"].values()
        if r["Type"] == "AWS::ECS::TaskDefinition"
    ]  # fmt: skip
    (container,) = task["Properties"]["ContainerDefinitions"]
    return dict(container)


def bridge_address() -> str:
    """The docker bridge's gateway address on this host: where containers reach the fleet."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", "docker0"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return out.split()[3].split("/")[0]


def inspect(container: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", container], capture_output=True, text=True)
    return dict(json.loads(out.stdout)[0]) if out.returncode == 0 else {}


class WorkerContainer:
    """One worker container, run with the task definition's settings."""

    def __init__(self, fleet: LocalFleet, worker_id: str, *extra_run_flags: str) -> None:
        self.worker_id = worker_id
        self.name = f"wsfleet-sam-local-{worker_id}"
        self.env = container_env(fleet, worker_id)
        self.extra = extra_run_flags

    def run(self) -> WorkerContainer:
        spec = task_container()
        (mount,) = spec["MountPoints"]
        assert spec["ReadonlyRootFilesystem"] is True
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)
        cmd = [
            "docker", "run", "--detach", "--name", self.name,
            "--user", spec["User"], "--read-only",
            "--mount", f"type=volume,dst={mount['ContainerPath']}",
            "--stop-timeout", str(spec["StopTimeout"]),
            *[f"--env={name}={value}" for name, value in sorted(self.env.items())],
            *self.extra, IMAGE,
        ]  # fmt: skip
        run(cmd)
        return self

    def logs(self) -> str:
        proc = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True)
        return tail(proc.stdout + proc.stderr, 60)

    def state(self) -> dict[str, Any]:
        return dict(inspect(self.name).get("State", {}))

    def ensure_running(self) -> bool:
        """True while the container runs; a container that exited fails the wait at once, with
        its log (a worker that cannot start need not be waited for)."""
        state = self.state()
        if not state.get("Running"):
            raise AssertionError(f"{self.name} is not running: {state}\n{self.logs()}")
        return True

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", "-v", self.name], capture_output=True)


def container_env(fleet: LocalFleet, worker_id: str) -> dict[str, str]:
    """What a host worker of this fleet gets (the template's worker environment, resolved),
    less the host's own variables; HEALTH_FILE as the task definition sets it."""
    known = {var.name for var in ENVIRONMENT}
    env = {
        name: value
        for name, value in fleet._worker_env(worker_id).items()
        if name in known or name.startswith(("AWS_", "POWERTOOLS_", "WORKER_", "LEASE_"))
    }
    health = container_environment(task_container()["Environment"])["HEALTH_FILE"]
    return {**env, "WORKER_ID": worker_id, "HEALTH_FILE": health, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing"}  # fmt: skip


@pytest.fixture(scope="module")
def worker_image(figures: dict[str, Any]) -> str:
    run([str(ROOT / "containers" / "wheelhouse")])
    started = time.monotonic()
    run(
        ["docker", "build", "-f", "worker/Dockerfile", "--build-arg", f"PYTHON_BASE={PYTHON_BASE}",
         "--build-arg", "WHEELHOUSE=worker/.wheelhouse", "-t", IMAGE, "."],
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=1800,
    )  # fmt: skip
    figures["worker_image_build_seconds"] = round(time.monotonic() - started, 1)
    sizes = figures.setdefault("image_bytes", {})
    for image in (IMAGE, PYTHON_BASE, INVOKE_IMAGE):
        if info := inspect(image):
            sizes[image] = info["Size"]
    return IMAGE


@pytest.fixture(scope="module")
def fleet(worker_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """The local fleet, no host worker yet, listening where containers reach it."""
    running = LocalFleet(
        workers=0, timings=TIMINGS, host=bridge_address(), task_events=False,
        run_dir=tmp_path_factory.mktemp("fleet"),
    ).start()  # fmt: skip
    yield running
    running.stop()


@pytest.fixture(scope="module")
def driver(fleet: LocalFleet) -> StoreDriver:
    return StoreDriver(fleet._local_env())


@pytest.fixture
def containers() -> Iterator[list[WorkerContainer]]:
    started: list[WorkerContainer] = []
    yield started
    for container in started:
        container.remove()


#: The upstream's normal close ends the stream (STOPPED), so an ended feed can be audited.
FINITE = parse_upstream_options({"normal_close": "final"}, secret_prefixes=())


def start(driver: StoreDriver, fleet: LocalFleet, stream: str) -> None:
    driver.start(stream, f"{fleet.simulator_url}/{stream}", upstream=FINITE)


def assert_nothing_lost(driver: StoreDriver, fleet: LocalFleet, stream: str) -> int:
    """End the stream at the upstream, wait for the connection to stop, then every frame the
    upstream produced is stored once with the upstream's content."""
    max_seq = int(fleet.simulator.end_stream(stream)["max_seq"])
    driver.wait_for_state(stream, DesiredState.STOPPED, timeout=120)
    items = {int(item["seq"]): item for item in driver.stored(stream) if "seq" in item}
    missing = sorted(set(range(1, max_seq + 1)) - set(items))
    assert not missing, f"{stream}: {len(missing)} of {max_seq} frames lost: {missing[:20]}"
    wrong = [seq for seq, item in items.items() if item.get("message_data") != f"{stream}:{seq}"]
    assert not wrong, f"{stream}: frames with foreign content: {wrong[:20]}"
    return max_seq


def test_image_runs_as_the_task_definition_says(worker_image: str) -> None:
    config = inspect(worker_image)["Config"]
    spec = task_container()
    # the image's user and health check are the task definition's
    assert config["User"] == spec["User"]
    assert config["Healthcheck"]["Test"] == spec["HealthCheck"]["Command"]
    # built on the stand-in, not on an image of the public name
    history = subprocess.run(["docker", "history", "-q", worker_image], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    base = inspect(PYTHON_BASE)["Id"].split(":")[1][:12]
    assert base in history


def test_start_streams_then_docker_stop_hands_off(
    fleet: LocalFleet,
    driver: StoreDriver,
    containers: list[WorkerContainer],
    figures: dict[str, Any],
) -> None:
    # GIVEN a worker container in the fleet and a START for it
    stream = "image-stop-1"
    started = time.monotonic()
    container = WorkerContainer(fleet, "container-stop")
    containers.append(container.run())
    start(driver, fleet, stream)

    # THEN its frames reach the messages table, stored by the container's worker
    wait_until(
        lambda: container.ensure_running() and driver.stored_seqs(stream),
        timeout=300, interval=0.5, message=container.logs,
    )  # fmt: skip
    figures["docker_run_to_first_frame_seconds"] = round(time.monotonic() - started, 2)
    record = driver.record(stream)
    assert record.lease_owner == "container-stop", record

    # WHEN a host worker joins and the container gets `docker stop` (SIGTERM)
    peer = fleet.add_worker()
    stopping = time.monotonic()
    run(["docker", "stop", container.name], timeout=120)
    stop_seconds = time.monotonic() - stopping

    # THEN the worker drained and exited by itself: 0, not the 137 of the SIGKILL docker sends
    # at the stop timeout (the task definition's StopTimeout, above DRAIN_TIMEOUT_SECONDS)
    state = container.state()
    assert state["ExitCode"] == 0, (state, container.logs())

    # AND the host worker took the connection over and streams it
    def taken_over() -> bool:
        now = driver.record(stream)
        return now.lease_owner == peer.worker_id and now.lease_epoch > record.lease_epoch

    wait_until(
        taken_over,
        timeout=60,
        interval=0.2,
        message=lambda: f"{driver.record(stream)}\n{container.logs()}",
    )
    figures["docker_stop_to_new_owner_seconds"] = round(time.monotonic() - stopping, 2)
    figures["docker_stop_seconds"] = round(stop_seconds, 2)
    # AND nothing was lost
    assert_nothing_lost(driver, fleet, stream)


def test_docker_kill_fails_over(
    fleet: LocalFleet,
    driver: StoreDriver,
    containers: list[WorkerContainer],
    figures: dict[str, Any],
) -> None:
    # GIVEN every host worker busy (one connection each, the most they take), and a worker
    # container that takes the next START
    for slot in fleet.workers:
        filler = f"filler-{slot.worker_id}"
        start(driver, fleet, filler)
        wait_until(lambda f=filler: driver.record(f).lease_owner, timeout=120, interval=0.2)
    stream = "image-kill-1"
    container = WorkerContainer(fleet, "container-kill")
    containers.append(container.run())
    start(driver, fleet, stream)
    wait_until(
        lambda: container.ensure_running() and len(driver.stored_seqs(stream)) >= 5,
        timeout=300, interval=0.5, message=container.logs,
    )  # fmt: skip
    record = driver.record(stream)
    assert record.lease_owner == "container-kill", record

    # WHEN a free host worker joins and the container is killed (SIGKILL: no drain)
    peer = fleet.add_worker()
    killed = time.monotonic()
    run(["docker", "kill", container.name])

    # THEN the free host worker takes the connection over once the lease lapses
    assert container.state()["ExitCode"] == 137
    wait_until(
        lambda: driver.record(stream).lease_owner == peer.worker_id,
        timeout=120, interval=0.2, message=lambda: str(driver.record(stream)),
    )  # fmt: skip
    figures["docker_kill_to_new_owner_seconds"] = round(time.monotonic() - killed, 2)
    assert driver.record(stream).lease_epoch > record.lease_epoch
    # AND resumes from the checkpoint: nothing lost
    assert_nothing_lost(driver, fleet, stream)


def test_health_check_healthy_then_unhealthy_when_paused(
    fleet: LocalFleet, containers: list[WorkerContainer]
) -> None:
    # GIVEN a worker container with the image's health check, probed every second
    container = WorkerContainer(
        fleet, "container-health",
        "--health-interval=1s", "--health-retries=2", "--health-start-period=0s",
    )  # fmt: skip
    containers.append(container.run())

    def health() -> str:
        return str(container.state().get("Health", {}).get("Status"))

    # THEN it turns healthy once the worker heartbeats
    wait_until(
        lambda: container.ensure_running() and health() == "healthy", timeout=180, interval=0.5,
        message=lambda: f"{health()}\n{container.logs()}",
    )  # fmt: skip
    # WHEN the container is paused (a hung worker): THEN it turns unhealthy
    run(["docker", "pause", container.name])
    try:
        wait_until(lambda: health() == "unhealthy", timeout=120, interval=0.5, message=health)
    finally:
        run(["docker", "unpause", container.name])
