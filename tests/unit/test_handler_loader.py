"""wsfleet_local.handler_loader: handlers loaded by path under unique names, and a stand-in
context."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wsfleet_local import handler_loader
from wsfleet_local.handler_loader import (
    FUNCTION_NAMES,
    FunctionNotFound,
    functions_dir,
    lambda_context,
    load_function,
    module_name,
)

REPO = Path(__file__).resolve().parents[2]


def test_default_directory_is_the_repositorys_functions_folder(monkeypatch):
    monkeypatch.delenv(handler_loader.FUNCTIONS_DIR_ENV, raising=False)
    assert functions_dir() == REPO / "functions"


def test_the_four_lambdas_are_named():
    assert FUNCTION_NAMES == ("router", "reconciler", "stream_notifier", "task_exit")


def test_router_loads_once_under_its_unique_name():
    first = load_function("router")
    second = load_function("router")

    assert first is second
    assert first.__name__ == "wsfleet_functions.router.app" == module_name("router")
    assert sys.modules["wsfleet_functions.router.app"] is first
    assert callable(first.lambda_handler)


@pytest.fixture
def scratch_functions(tmp_path, monkeypatch):
    """A functions directory of our own, and no trace of its modules afterwards."""
    monkeypatch.setenv(handler_loader.FUNCTIONS_DIR_ENV, str(tmp_path))
    yield tmp_path
    for name in ("probe", "broken"):
        sys.modules.pop(module_name(name), None)


def test_environment_variable_overrides_the_directory(scratch_functions):
    (scratch_functions / "probe").mkdir()
    (scratch_functions / "probe" / "app.py").write_text("VALUE = 41 + 1\n")

    module = load_function("probe")

    assert module.VALUE == 42
    assert module.__file__ == str(scratch_functions / "probe" / "app.py")


def test_unknown_function_is_refused(scratch_functions):
    with pytest.raises(FunctionNotFound, match="no handler module"):
        load_function("nothing-here")


def test_a_module_that_fails_to_import_is_not_cached(scratch_functions):
    (scratch_functions / "broken").mkdir()
    (scratch_functions / "broken" / "app.py").write_text("raise ImportError('missing dep')\n")

    with pytest.raises(ImportError, match="missing dep"):
        load_function("broken")

    assert module_name("broken") not in sys.modules


def test_no_repository_above_means_the_variable_is_needed(monkeypatch, tmp_path):
    monkeypatch.delenv(handler_loader.FUNCTIONS_DIR_ENV, raising=False)
    installed = tmp_path / "site-packages" / "handler_loader.py"
    monkeypatch.setattr(handler_loader, "__file__", str(installed))

    with pytest.raises(FunctionNotFound, match=handler_loader.FUNCTIONS_DIR_ENV):
        functions_dir()


class TestLambdaContext:
    def test_has_what_powertools_reads(self):
        context = lambda_context("router")

        assert context.function_name == "wsfleet-router"
        assert context.memory_limit_in_mb == 256
        assert context.invoked_function_arn.endswith(":function:wsfleet-router")
        assert context.log_group_name == "/aws/lambda/wsfleet-router"
        assert context.function_version == "$LATEST"
        assert context.aws_request_id

    def test_each_invocation_gets_its_own_request_id(self):
        assert lambda_context("router").aws_request_id != lambda_context("router").aws_request_id

    def test_remaining_time_counts_down_from_the_timeout(self):
        context = lambda_context("reconciler", timeout_ms=60_000, memory_mb=512)

        assert 0 < context.get_remaining_time_in_millis() <= 60_000
        assert context.memory_limit_in_mb == 512

    def test_remaining_time_never_goes_negative(self):
        assert lambda_context("router", timeout_ms=0).get_remaining_time_in_millis() == 0
