"""Load the Lambda handlers in-process: tests and the local runtime call them directly.

Each Lambda lives in ``functions/<name>/app.py``, the layout SAM expects (``CodeUri:
functions/<name>/``, ``Handler: app.lambda_handler``). Three modules all named ``app`` cannot be
imported side by side with a plain ``import app``, and none of them is an installed package, so
:func:`load_function` imports each file by path under its own module name
``wsfleet_functions.<name>.app`` and caches it: every caller shares one module object, exactly
like one warm Lambda container.

Locally there is no Lambda service (moto's needs Docker), so the handler gets a
:func:`lambda_context` instead of the real context object: just the attributes Powertools
reads. Example::

    from wsfleet_local.handler_loader import lambda_context, load_function

    router = load_function("router")
    response = router.lambda_handler(api_event, lambda_context("router"))

The functions directory is found by walking up from this file to the repository root (the
directory holding ``template.yaml`` and ``functions/``); ``WSFLEET_FUNCTIONS_DIR`` overrides it,
e.g. for an installed (non-editable) copy of this package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from .stack import LOCAL_ACCOUNT_ID

__all__ = [
    "FUNCTIONS_DIR_ENV",
    "FUNCTION_NAMES",
    "FunctionNotFound",
    "LambdaContext",
    "functions_dir",
    "lambda_context",
    "load_function",
    "module_name",
]

FUNCTION_NAMES = ("router", "reconciler", "stream_notifier", "task_exit")
FUNCTIONS_DIR_ENV = "WSFLEET_FUNCTIONS_DIR"
_PACKAGE = "wsfleet_functions"
_lock = threading.Lock()


class FunctionNotFound(LookupError):
    """There is no ``functions/<name>/app.py`` to load."""


def functions_dir() -> Path:
    """``$WSFLEET_FUNCTIONS_DIR``, else ``functions/`` of the repository this file sits in."""
    override = os.environ.get(FUNCTIONS_DIR_ENV)
    if override:
        return Path(override).resolve()
    for parent in Path(__file__).resolve().parents:
        if (parent / "template.yaml").is_file() and (parent / "functions").is_dir():
            return parent / "functions"
    raise FunctionNotFound(
        f"no functions/ directory above {__file__}; set {FUNCTIONS_DIR_ENV}"
    )


def module_name(name: str) -> str:
    """The unique module name a handler is imported under: ``wsfleet_functions.<name>.app``."""
    return f"{_PACKAGE}.{name}.app"


def load_function(name: str) -> ModuleType:
    """Import ``functions/<name>/app.py`` once and return the module (cached in sys.modules).

    The module keeps its module-level state (clients, caches) between calls, as a warm Lambda
    container does; a test that needs a cold start resets that state through the handler's own
    hook (the router's ``reset_dependencies()``) rather than re-importing.
    """
    qualified = module_name(name)
    with _lock:
        loaded = sys.modules.get(qualified)
        if loaded is not None:
            return loaded
        path = functions_dir() / name / "app.py"
        if not path.is_file():
            raise FunctionNotFound(f"no handler module at {path}")
        spec = importlib.util.spec_from_file_location(qualified, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[qualified]
            raise
        return module


@dataclass
class LambdaContext:
    """The parts of the Lambda context object that Powertools and wsfleet read.

    ``get_remaining_time_in_millis`` counts down from ``timeout_ms`` in real time, so code that
    budgets its work by the remaining time (the reconciler's passes) behaves as in Lambda.
    """

    function_name: str
    memory_limit_in_mb: int = 256
    timeout_ms: int = 10_000
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = ""
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = "local"
    _started: float = field(default_factory=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        if not self.invoked_function_arn:
            self.invoked_function_arn = (
                f"arn:aws:lambda:us-east-1:{LOCAL_ACCOUNT_ID}:function:{self.function_name}"
            )
        if not self.log_group_name:
            self.log_group_name = f"/aws/lambda/{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        elapsed_ms = int((time.monotonic() - self._started) * 1000)
        return max(0, self.timeout_ms - elapsed_ms)


def lambda_context(name: str, *, timeout_ms: int = 10_000, memory_mb: int = 256) -> LambdaContext:
    """A fresh context for one local invocation of function ``name`` (new request id each time)."""
    return LambdaContext(
        function_name=f"wsfleet-{name}", timeout_ms=timeout_ms, memory_limit_in_mb=memory_mb
    )
