"""The shared layer as `sam build` makes it (layers/wsfleet/Makefile), built with pip here.

Needs PyPI (like `make install`). Checks what the Makefile promises: no boto3/botocore stack
(the Lambda runtime provides it; a bundled botocore would shadow the runtime's), a size well
under the 45 MB the python3.11 build method produced, and that the handlers' imports resolve
from the layer with only the runtime's boto3 stack beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Measured 14 MB (aws-lambda-powertools, pydantic-core, aws-xray-sdk); room to grow a little.
MAX_LAYER_BYTES = 20 * 1024 * 1024
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3")


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    artifacts = tmp_path_factory.mktemp("SharedLayer")
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "layers" / "wsfleet"), "build-SharedLayer"],
        env={**os.environ, "ARTIFACTS_DIR": str(artifacts), "PYTHON": sys.executable},
        check=True,
        capture_output=True,
    )
    return artifacts / "python"


def test_layer_has_no_runtime_provided_packages(layer: Path) -> None:
    present = {path.name for path in layer.iterdir()}
    for name in RUNTIME_PROVIDED:
        assert name not in present
        assert not [p for p in present if p.startswith(f"{name}-")], name
    assert "six.py" not in present


def test_layer_size(layer: Path) -> None:
    size = sum(path.stat().st_size for path in layer.rglob("*") if path.is_file())
    assert size < MAX_LAYER_BYTES, f"{size / 2**20:.1f} MB"


def test_handlers_imports_resolve_from_the_layer(layer: Path) -> None:
    # GIVEN only the layer on the path ahead of this venv, whose boto3 stands in for the
    # runtime's (the venv also has every other package: the check is where each one comes from)
    code = (
        "import importlib, json\n"
        "names = ['wsfleet.store', 'wsfleet.settings', 'aws_lambda_powertools.tracing',"
        " 'aws_lambda_powertools.event_handler', 'aws_xray_sdk.core', 'pydantic', 'wrapt',"
        " 'botocore']\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(layer)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    origins = json.loads(out.splitlines()[-1])
    # THEN everything but botocore comes from the layer, botocore from the "runtime"
    for name, origin in origins.items():
        from_layer = origin.startswith(str(layer))
        assert from_layer is (name != "botocore"), (name, origin)
