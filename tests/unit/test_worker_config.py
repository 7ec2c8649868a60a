"""Worker configuration from the environment, the health check and EMF output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from wsfleet.exceptions import ConfigurationError
from wsfleet.settings import ENVIRONMENT, Settings
from wsfleet_worker.config import WORKER_ENVIRONMENT, WorkerConfig
from wsfleet_worker.health import is_fresh, main, touch
from wsfleet_worker.observability import WorkerMetrics


# ---------------------------------------------------------------- config
def test_defaults_are_production_values():
    config = WorkerConfig.from_env({})
    assert (config.hint_wait_seconds, config.control_wait_seconds) == (20, 20)
    assert config.control_channel is True
    assert config.settings.lease_seconds == 20
    assert config.heartbeat_ms == 5000


def test_shared_and_worker_variables_are_read():
    config = WorkerConfig.from_env(
        {
            "LEASE_SECONDS": "2",
            "HEARTBEAT_EVERY": "0.5",
            "LEASE_SAFETY_MARGIN_SECONDS": "0.5",
            "WORKER_ID": "w-7",
            "WORKER_HINT_WAIT_SECONDS": "1",
            "WORKER_CONTROL_CHANNEL": "false",
            "WORKER_METRICS_FLUSH_SECONDS": "0.5",
            "WORKER_IO_THREADS": "4",
        }
    )
    assert config.settings.worker_id == "w-7"
    assert config.heartbeat_ms == 500
    assert (config.hint_wait_seconds, config.control_channel) == (1, False)
    assert (config.metrics_flush_seconds, config.io_threads) == (0.5, 4)


def test_empty_worker_variables_keep_their_defaults():
    config = WorkerConfig.from_env({"WORKER_IO_THREADS": "", "WORKER_CONTROL_CHANNEL": ""})
    assert (config.io_threads, config.control_channel) == (16, True)


def test_whole_number_knobs_may_be_written_as_floats():
    assert WorkerConfig.from_env({"WORKER_HINT_WAIT_SECONDS": "2.0"}).hint_wait_seconds == 2


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"WORKER_HINT_WAIT_SECONDS": "21"}, "WORKER_HINT_WAIT_SECONDS must be between 0 and 20"),
        ({"WORKER_CONTROL_WAIT_SECONDS": "-1"}, "WORKER_CONTROL_WAIT_SECONDS must be between"),
        ({"WORKER_IO_THREADS": "0"}, "WORKER_IO_THREADS must be at least 1"),
        ({"WORKER_MAX_FRAME_BYTES": "0"}, "WORKER_MAX_FRAME_BYTES must be at least 1"),
        ({"WORKER_WRITE_THREADS": "1.5"}, "WORKER_WRITE_THREADS must be a whole number"),
        ({"WORKER_CONTROL_CHANNEL": "maybe"}, "WORKER_CONTROL_CHANNEL must be true or false"),
        ({"WORKER_QUEUE_FRAMES": "lots"}, "WORKER_QUEUE_FRAMES must be a number"),
        ({"WORKER_METRICS_FLUSH_SECONDS": "0"}, "WORKER_METRICS_FLUSH_SECONDS must be positive"),
        ({"LEASE_SECONDS": "1", "HEARTBEAT_EVERY": "1"}, "LEASE_SECONDS"),
    ],
)
def test_bad_values_are_configuration_errors_naming_the_variable(env, needle):
    with pytest.raises(ConfigurationError, match=needle):
        WorkerConfig.from_env(env)


def test_worker_knobs_are_the_worker_scoped_entries_of_the_one_table():
    assert tuple(v for v in ENVIRONMENT if v.scope == "worker") == WORKER_ENVIRONMENT
    knobs = sorted(v.field for v in WORKER_ENVIRONMENT)
    # ``task`` is read from the ECS metadata endpoint, not from a variable
    assert knobs == sorted(set(WorkerConfig.__dataclass_fields__) - {"settings", "task"})


def test_documented_defaults_are_the_worker_config_defaults():
    documented = {v.name: v.default for v in WORKER_ENVIRONMENT}
    settings = Settings(worker_id="w")
    assert WorkerConfig.from_env(documented, settings=settings) == WorkerConfig(settings=settings)


def test_missing_hint_queue_url_exits_with_a_configuration_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HINT_QUEUE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "wsfleet_worker"], env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "HINT_QUEUE_URL" in done.stderr


# ---------------------------------------------------------------- health
def test_health_is_fresh_only_within_the_window(tmp_path):
    path = tmp_path / "health"
    assert not is_fresh(path, 3)
    touch(path)
    assert is_fresh(path, 3)
    assert not is_fresh(path, 3, now=time.time() + 10)


def test_health_main_follows_heartbeat_setting(tmp_path, monkeypatch):
    path = tmp_path / "health"
    monkeypatch.setenv("HEALTH_FILE", str(path))
    monkeypatch.setenv("HEARTBEAT_EVERY", "5")
    assert main() == 1
    touch(path)
    assert main() == 0
    old = time.time() - 16
    os.utime(path, (old, old))
    assert main() == 1


def test_health_module_runs_as_a_command(tmp_path):
    path = tmp_path / "health"
    touch(path)
    env = {**os.environ, "HEALTH_FILE": str(path), "HEARTBEAT_EVERY": "5"}
    done = subprocess.run([sys.executable, "-m", "wsfleet_worker.health"], env=env, timeout=60)
    assert done.returncode == 0


# ---------------------------------------------------------------- metrics
def test_emf_document_has_only_the_service_name_dimension():
    documents = []
    metrics = WorkerMetrics("svc-a", namespace="wsfleet", emit=documents.append)
    metrics.count("MessagesReceived", 5)
    metrics.count("MessagesReceived", 2)
    metrics.gauge("ActiveConnections", 12)
    metrics.observe("RenewLatenessMs", 30)
    metrics.observe("RenewLatenessMs", 10)
    metrics.flush()
    (doc,) = documents
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "wsfleet"
    assert directive["Dimensions"] == [["ServiceName"]]
    assert doc["ServiceName"] == "svc-a"
    assert doc["MessagesReceived"] == [7.0]
    assert doc["ActiveConnections"] == [12.0]
    assert doc["RenewLatenessMs"] == [30.0]
    assert doc["RenewLatenessMsSamples"] == 2
    json.dumps(doc)


def test_counters_reset_per_interval_gauges_persist_and_totals_accumulate():
    documents = []
    metrics = WorkerMetrics("svc", emit=documents.append)
    metrics.count("Reconnects")
    metrics.gauge("ActiveConnections", 3)
    metrics.flush()
    metrics.flush()
    assert "Reconnects" not in documents[1] and documents[1]["ActiveConnections"] == [3.0]
    assert metrics.totals["Reconnects"] == 1


def test_nothing_to_flush_prints_nothing():
    documents = []
    assert WorkerMetrics("svc", emit=documents.append).flush() is None
    assert documents == []


def test_byte_budgets_and_seq_jump_come_from_the_environment():
    config = WorkerConfig.from_env({
        "WORKER_QUEUE_BYTES": "1048576",
        "WORKER_SESSION_QUEUE_BYTES": "65536",
        "WORKER_MAX_SEQ_JUMP": "0",
    })
    assert (config.queue_bytes, config.session_queue_bytes, config.max_seq_jump) == (
        1_048_576, 65_536, 0
    )
    defaults = WorkerConfig()
    assert (defaults.queue_bytes, defaults.session_queue_bytes) == (128 * 2**20, 4 * 2**20)


@pytest.mark.parametrize(
    "variable, value",
    [("WORKER_QUEUE_BYTES", "0"), ("WORKER_SESSION_QUEUE_BYTES", "0"),
     ("WORKER_MAX_SEQ_JUMP", "-1")],
)
def test_bad_budgets_name_their_variable(variable, value):
    with pytest.raises(ConfigurationError, match=variable):
        WorkerConfig.from_env({variable: value})
