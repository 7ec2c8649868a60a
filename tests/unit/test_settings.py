"""Settings: defaults, parsing, validation, and the README's configuration table."""

from pathlib import Path

import pytest

from wsfleet.exceptions import ConfigurationError
from wsfleet.settings import ENVIRONMENT, Settings, markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_match_the_article():
    settings = Settings.from_env({})
    assert settings.lease_seconds == 20 and settings.heartbeat_seconds == 5
    assert settings.lease_ms == 20_000
    assert settings.reconcile_pass_seconds == 10
    settings.check_reconcile_pass()


def test_every_variable_is_read():
    env = {
        "CONNECTIONS_TABLE": "c", "MESSAGES_TABLE": "m", "HINT_QUEUE_URL": "http://q",
        "LEASE_SECONDS": "4", "HEARTBEAT_EVERY": "1", "LEASE_SAFETY_MARGIN_SECONDS": "0.5",
        "MAX_CONNECTIONS": "7", "WORKER_ID": "w-1", "DRAIN_TIMEOUT_SECONDS": "3",
        "CONTROL_QUEUE_PREFIX": "s-ctl-", "SEQ_FIELD": "n", "RESUME_PARAM": "offset",
        "MESSAGE_FLUSH_MS": "50", "MESSAGE_RETENTION_DAYS": "0", "STOPPED_RETENTION_DAYS": "1",
        "HEALTH_FILE": "/tmp/h", "SERVICE_NAME": "svc", "RECONCILE_PASS_SECONDS": "2",
        "RECONCILE_PAGE_SIZE": "10", "ALLOWED_UPSTREAM_HOSTS": " Example.com, 127.0.0.1 ,",
        "ALLOW_INSECURE_WS": "true",
        "CONTROL_QUEUE_SENDER_ARNS": "arn:aws:iam::1:role/N",
        "CHECKPOINT_SECONDS": "30",
        "UPSTREAM_SECRET_PREFIXES": "arn:aws:ssm:us-east-1:1:parameter/Wsfleet/, x",
        "WORKER_CONTAINER_NAME": "app",
        "REBALANCE": "false", "REBALANCE_SECONDS": "2", "REBALANCE_MAX_MOVES": "3",
        "REBALANCE_DWELL_SECONDS": "60", "REBALANCE_BAND_PERCENT": "5",
        "REBALANCE_PLACEMENT_SECONDS": "0.5",
        "MESSAGE_SINK": "kinesis", "MESSAGE_STREAM": "frames", "MESSAGE_KINESIS_AGGREGATION": "no",
        "MESSAGE_REPLAY_WINDOW": "250",
    }
    assert {v.name for v in ENVIRONMENT if v.scope == "shared"} == set(env)
    s = Settings.from_env(env)
    assert (s.connections_table, s.messages_table, s.hint_queue_url) == ("c", "m", "http://q")
    assert (s.lease_seconds, s.heartbeat_seconds, s.safety_margin_ms) == (4, 1, 500)
    assert (s.max_connections, s.worker_id, s.drain_timeout_seconds) == (7, "w-1", 3)
    assert (s.seq_field, s.resume_param, s.message_flush_ms) == ("n", "offset", 50)
    assert s.allowed_upstream_hosts == ("example.com", "127.0.0.1")
    assert s.allow_insecure_ws is True
    assert (s.message_sink, s.message_stream, s.message_kinesis_aggregation) == (
        "kinesis", "frames", False
    )
    assert s.checkpoint_ms == 30_000
    assert s.message_replay_window == 250
    assert s.control_queue_sender_arns == "arn:aws:iam::1:role/N"  # ARNs keep their case
    assert s.upstream_secret_prefixes == ("arn:aws:ssm:us-east-1:1:parameter/Wsfleet/", "x")
    assert s.require_hint_queue_url() == "http://q"
    assert s.worker_container_name == "app"
    assert (s.rebalance, s.rebalance_seconds, s.rebalance_max_moves) == (False, 2, 3)
    assert (s.rebalance_dwell_seconds, s.rebalance_band_percent) == (60, 5)
    assert s.rebalance_placement_seconds == 0.5


def test_every_shared_variable_fills_its_own_settings_field():
    shared = [v.field for v in ENVIRONMENT if v.scope == "shared"]
    assert sorted(shared) == sorted(Settings.__dataclass_fields__)
    assert len({v.name for v in ENVIRONMENT}) == len(ENVIRONMENT)


def test_documented_defaults_are_the_settings_defaults():
    documented = {v.name: v.default for v in ENVIRONMENT if v.scope == "shared"}
    del documented["WORKER_ID"]  # documented as its shape; generated per process
    assert Settings.from_env(documented, worker_id="w") == Settings(worker_id="w")


def test_empty_variables_keep_their_defaults():
    empty = {"LEASE_SECONDS": "", "CONNECTIONS_TABLE": "", "ALLOW_INSECURE_WS": ""}
    assert Settings.from_env(empty, worker_id="w") == Settings(worker_id="w")


def test_worker_id_defaults_to_unique_value():
    assert Settings.from_env({}).worker_id != Settings.from_env({}).worker_id
    assert Settings.from_env({"WORKER_ID": ""}).worker_id  # empty means "generate"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"LEASE_SECONDS": "abc"}, "LEASE_SECONDS must be a number"),
        ({"LEASE_SECONDS": "inf"}, "LEASE_SECONDS must be a finite number"),
        ({"MAX_CONNECTIONS": "2.5"}, "MAX_CONNECTIONS must be a whole number"),
        ({"LEASE_SECONDS": "5", "HEARTBEAT_EVERY": "3"}, "at least twice"),
        ({"HEARTBEAT_EVERY": "0"}, "positive"),
        ({"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS"),
        ({"ALLOW_INSECURE_WS": "maybe"}, "true or false"),
        ({"RECONCILE_PAGE_SIZE": "0"}, "RECONCILE_PAGE_SIZE"),
        ({"REBALANCE_SECONDS": "0"}, "REBALANCE_SECONDS"),
        ({"REBALANCE_MAX_MOVES": "-1"}, "REBALANCE_MAX_MOVES"),
        ({"REBALANCE_BAND_PERCENT": "101"}, "REBALANCE_BAND_PERCENT"),
        ({"REBALANCE_PLACEMENT_SECONDS": "21"}, "REBALANCE_PLACEMENT_SECONDS"),
        ({"LEASE_SAFETY_MARGIN_SECONDS": "15"}, "LEASE_SAFETY_MARGIN_SECONDS"),
    ],
)
def test_bad_values_name_the_variable(env, needle):
    with pytest.raises(ConfigurationError, match=needle):
        Settings.from_env(env)


def test_reconcile_pass_must_fit_inside_lease_minus_heartbeat():
    s = Settings.from_env(
        {"LEASE_SECONDS": "4", "HEARTBEAT_EVERY": "1", "RECONCILE_PASS_SECONDS": "3"}
    )
    with pytest.raises(ConfigurationError, match="RECONCILE_PASS_SECONDS"):
        s.check_reconcile_pass()


def test_missing_hint_queue_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="HINT_QUEUE_URL"):
        Settings.from_env({}).require_hint_queue_url()


def test_whole_numbers_may_be_written_as_floats():
    assert Settings.from_env({"MAX_CONNECTIONS": "7.0"}).max_connections == 7


def test_readme_table_is_generated_from_the_environment_table():
    # Regenerate with `python -m wsfleet.settings` and paste under "## Configuration".
    assert markdown_table() in README.read_text()
