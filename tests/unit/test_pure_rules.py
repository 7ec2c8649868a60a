"""The pure cores stay pure: importing them loads no AWS SDK and no event loop.

Lease rules, records, the reconciler's plan and the worker's session and checkpoint rules
are decisions over values (STYLE.md: like websockets' ``protocol.py``). If one of them pulls in
boto3, botocore or asyncio, even indirectly, it is no longer testable or reusable without
them, and its cold start in a Lambda pays for them. Each module is imported in a fresh
interpreter, since this test process has all three loaded already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("boto3", "botocore", "asyncio")

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(n for n in sys.argv[2:] if n in sys.modules)))
"""


def loaded_after_import(module: str) -> list[str]:
    """Which of FORBIDDEN a fresh interpreter holds after ``import module``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, *FORBIDDEN],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"import {module} failed:\n{done.stderr}"
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    "module",
    [
        "wsfleet.lease",
        "wsfleet.record",
        "wsfleet.reconcile",
        "wsfleet.hints",
        "wsfleet.upstream_options",
        "wsfleet.backoff",
        "wsfleet_worker.session_rules",
        "wsfleet_worker.checkpoint",
    ],
)
def test_pure_module_imports_no_sdk_and_no_event_loop(module):
    assert loaded_after_import(module) == []
