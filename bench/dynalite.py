"""dynalite (npm) as a second, independent DynamoDB implementation for compatibility runs.

wsfleet's safety rests on DynamoDB's conditional writes. The embedded backend is moto; a
test suite that only ever ran against moto could pass because of one of moto's quirks. dynalite
(LevelDB-backed, written from DynamoDB's documented behaviour, in Node.js) is a second
opinion: the LeaseStore and race tests run against it too (bench/dynalite_plugin.py), with SQS
still on moto. dynalite has no Streams and no SQS. :class:`Dynalite` is also a
:class:`wsfleet_local.fleet.TablesService`: ``LocalFleet(tables=Dynalite())`` keeps the fleet's
tables on it, which is how the benchmarks' ``-dynalite`` runs leave the serialised moto server
out of the K = 100 figures.

Install (once; ``make dynalite`` does the same, ``.ci/run`` calls it)::

    python -m bench.dynalite --install      # npm install dynalite into .dynalite/ (git-ignored)

``DYNALITE_HOME`` overrides the install directory (default ``.dynalite/`` in the repository;
an install in ``~/.cache/wsfleet/dynalite``, where earlier versions put it, is still found).
Tests that need dynalite skip without it, or fail when ``WSFLEET_REQUIRE_DYNALITE=1`` (CI).

Example::

    with Dynalite() as dynalite:
        dynalite.create_tables(resources)  # the tables the embedded backend made
        client = dynalite.client()
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from wsfleet.exceptions import WsfleetError
from wsfleet_local.backend import Resources, local_client
from wsfleet_local.procs import ChildFailed, ChildProcess, Service, spawn

__all__ = [
    "DYNALITE_VERSION",
    "DYNAMODB_BACKENDS",
    "PROJECT_HOME",
    "REQUIRE_ENV",
    "Dynalite",
    "DynaliteError",
    "available",
    "dynalite_home",
    "install",
    "main",
    "required",
    "tables_service",
]

DYNALITE_VERSION = "4.0.0"
START_TIMEOUT_SECONDS = 30.0
#: Where a bench run keeps its tables: the embedded moto server, or dynalite (SQS is moto's
#: either way).
DYNAMODB_BACKENDS = ("moto", "dynalite")


class DynaliteError(WsfleetError):
    """node/npm missing, dynalite not installed, or the server did not come up."""


#: The project-local install (git-ignored): where ``--install`` and ``.ci/run`` put dynalite.
PROJECT_HOME = Path(__file__).resolve().parents[1] / ".dynalite"
#: Set (to 1) by ``.ci/run``: a test that needs dynalite fails instead of skipping without it.
REQUIRE_ENV = "WSFLEET_REQUIRE_DYNALITE"


def dynalite_home() -> Path:
    """``DYNALITE_HOME`` if set; else the project's ``.dynalite/``, unless dynalite is only in
    the per-user cache (``~/.cache/wsfleet/dynalite``, where earlier versions installed it)."""
    override = os.environ.get("DYNALITE_HOME")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    user_home = cache / "wsfleet" / "dynalite"
    if not _binary(PROJECT_HOME).exists() and _binary(user_home).exists():
        return user_home
    return PROJECT_HOME


def required() -> bool:
    """Tests must run on dynalite (CI), not skip (``WSFLEET_REQUIRE_DYNALITE=1``)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _binary(home: Path) -> Path:
    return home / "node_modules" / ".bin" / "dynalite"


def available(home: Path | None = None) -> bool:
    """node is on PATH and dynalite is installed in ``home``."""
    return shutil.which("node") is not None and _binary(home or dynalite_home()).exists()


def install(home: Path | None = None, *, version: str = DYNALITE_VERSION) -> Path:
    """``npm install dynalite@version`` into ``home`` (idempotent); returns the binary."""
    home = home or dynalite_home()
    if _binary(home).exists():
        return _binary(home)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise DynaliteError("node and npm are needed to install dynalite")
    home.mkdir(parents=True, exist_ok=True)
    package = home / "package.json"
    if not package.exists():
        package.write_text(json.dumps({"name": "wsfleet-dynalite", "private": True}))
    # --ignore-scripts: the one install script is classic-level's native LevelDB build
    # (node-gyp, which would fetch node's headers from outside the registry); dynalite runs in
    # memory here and never loads it.
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", f"dynalite@{version}"],
        cwd=home, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return _binary(home)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class Dynalite(Service):
    """A dynalite server (in memory) in a child process on 127.0.0.1; a
    :class:`wsfleet_local.fleet.TablesService`.

    The child is spawned like the local fleet's own (:func:`wsfleet_local.procs.spawn`): in its
    own session and killed with this process, so an interrupted run leaves no node behind.
    """

    #: In the fleet's progress lines.
    name = "dynalite"

    def __init__(
        self, home: Path | None = None, *, host: str = "127.0.0.1", log_path: Path | None = None
    ) -> None:
        self.home = home or dynalite_home()
        self.host = host
        self.log_path = log_path
        self.port: int | None = None
        self._child: ChildProcess | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        return self._child.pid if self._child is not None and self._child.alive() else None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise DynaliteError("dynalite is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        if not available(self.home):
            raise DynaliteError(
                f"dynalite is not installed in {self.home} (python -m bench.dynalite --install)"
            )
        self.port = _free_port(self.host)
        command = [str(_binary(self.home)), "--host", self.host, "--port", str(self.port),
                   "--createTableMs", "0", "--deleteTableMs", "0",
                   "--updateTableMs", "0"]  # fmt: skip
        try:
            self._child = spawn("dynalite", command, log_path=self.log_path)
        except ChildFailed as exc:
            raise DynaliteError(str(exc)) from exc
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._answers():
            if not self._child.alive():
                code = self._child.stop()
                raise DynaliteError(f"dynalite exited with {code}")
            if time.monotonic() > deadline:
                self.stop()
                raise DynaliteError("dynalite did not answer")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        request = urllib.request.Request(self.endpoint_url + "/", method="GET")
        try:
            with urllib.request.urlopen(request, timeout=1):  # loopback only
                return True
        except urllib.error.HTTPError:
            return True  # it answered (dynalite rejects unsigned requests)
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate the server (SIGKILL after 10 s) and reap it. Safe to call twice."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(signal.SIGTERM, 10)

    def client(self, region: str = "us-east-1") -> Any:
        return local_client("dynamodb", self.endpoint_url, region)

    def create_tables(self, resources: Resources) -> None:
        """Create here the tables of ``resources`` shaped as the backend made them (keys, GSIs,
        billing; no streams).

        Copying the definitions from the backend the template was provisioned into keeps one
        source of truth (template.yaml) without a second template reader.
        """
        source = local_client("dynamodb", resources.endpoint_url, resources.region)
        target = self.client(resources.region)
        for name in resources.tables.values():
            description = source.describe_table(TableName=name)["Table"]
            target.create_table(**create_table_request(description))
            target.get_waiter("table_exists").wait(
                TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
            )


def tables_service(dynamodb: str) -> Dynalite | None:
    """``LocalFleet``'s ``tables`` for a bench run's ``dynamodb`` setting (one of
    :data:`DYNAMODB_BACKENDS`): None leaves the tables on the embedded moto server."""
    if dynamodb not in DYNAMODB_BACKENDS:
        raise ValueError(f"dynamodb must be one of {', '.join(DYNAMODB_BACKENDS)}")
    return Dynalite() if dynamodb == "dynalite" else None


def create_table_request(description: dict[str, Any]) -> dict[str, Any]:
    """CreateTable arguments reproducing a DescribeTable result (keys, indexes, billing).

    >>> request = create_table_request({"TableName": "t", "AttributeDefinitions": [],
    ...     "KeySchema": [], "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"}})
    >>> request["BillingMode"]
    'PAY_PER_REQUEST'
    """
    billing = (description.get("BillingModeSummary") or {}).get("BillingMode", "PAY_PER_REQUEST")
    request: dict[str, Any] = {
        "TableName": description["TableName"],
        "AttributeDefinitions": description["AttributeDefinitions"],
        "KeySchema": description["KeySchema"],
        "BillingMode": billing,
    }
    if billing == "PROVISIONED":
        throughput = description.get("ProvisionedThroughput") or {}
        request["ProvisionedThroughput"] = {
            "ReadCapacityUnits": max(1, throughput.get("ReadCapacityUnits", 5)),
            "WriteCapacityUnits": max(1, throughput.get("WriteCapacityUnits", 5)),
        }
    indexes = []
    for index in description.get("GlobalSecondaryIndexes") or ():
        entry = {key: index[key] for key in ("IndexName", "KeySchema", "Projection")}
        if billing == "PROVISIONED":
            entry["ProvisionedThroughput"] = request["ProvisionedThroughput"]
        indexes.append(entry)
    if indexes:
        request["GlobalSecondaryIndexes"] = indexes
    return request


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dynalite")
    parser.add_argument("--install", action="store_true", help="npm install dynalite")
    parser.add_argument("--check", action="store_true", help="start it once and stop it")
    args = parser.parse_args(argv)
    try:
        if args.install:
            print(install())
        if args.check:
            with Dynalite() as dynalite:
                print(json.dumps({"endpoint_url": dynalite.endpoint_url}))
    except (DynaliteError, subprocess.CalledProcessError) as exc:
        print(f"bench.dynalite: {exc}", file=sys.stderr)
        return 1
    if not (args.install or args.check):
        print(json.dumps({"installed": available(), "home": str(dynalite_home())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
