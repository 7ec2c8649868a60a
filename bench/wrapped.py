"""The benchmarks that live in their own scripts, run as child processes and parsed.

* worker capacity (bench/worker_capacity.py, the worker's): one worker with N connections;
* reconcile pass time (bench/reconcile_pass.py, the reconciler's): 10k / 100k items;
* compatibility: the LeaseStore and race tests against dynalite (bench/dynalite_plugin.py).

A child process per run keeps each one's servers, memory and imports apart from the others,
and lets the scripts evolve on their own: only their ``--json-only`` output is relied on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .harness import ROOT

__all__ = ["run_capacity", "run_compat", "run_reconcile"]


def _json_from(stdout: str) -> Any:
    start = stdout.find("{")
    if start < 0:
        raise ValueError(f"no JSON in output: {stdout[-500:]!r}")
    document, _ = json.JSONDecoder().raw_decode(stdout[start:])
    return document


def _run_script(
    argv: list[str], timeout: float, *, ok_codes: tuple[int, ...] = (0,)
) -> tuple[Any, float]:
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    completed = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    if completed.returncode not in ok_codes:
        raise RuntimeError(
            f"{' '.join(argv)} exited {completed.returncode}: {completed.stderr[-1500:]}"
        )
    return _json_from(completed.stdout), time.monotonic() - started


def run_capacity(
    *,
    connections: int,
    rate: float,
    lease: float,
    heartbeat: float,
    margin: float,
    window: float,
    timeout: float = 1500,
) -> dict[str, Any]:
    argv = [
        "bench/worker_capacity.py", "--json-only", "--connections", str(connections),
        "--rate", str(rate), "--lease", str(lease), "--heartbeat", str(heartbeat),
        "--margin", str(margin), "--window", str(window),
    ]  # fmt: skip
    result, seconds = _run_script(argv, timeout)
    result["benchmark"] = "capacity"
    result["bench_seconds"] = round(seconds, 1)
    per_connection = result.get("rss_per_connection_kb")
    lateness = result.get("renew_lateness_max_ms_steady")
    limit = result.get("renew_lateness_limit_ms")
    result["target"] = (">= 5,000 connections, < 100 KB each, every one streaming (>= half "
                        "the offered frames stored), worker-lease renewal never later than half "
                        "the lease")  # fmt: skip
    offered = connections * rate
    streamed = (result.get("messages_per_second") or 0) >= 0.5 * offered
    result["streamed"] = streamed
    result["target_met"] = (
        streamed and per_connection is not None and per_connection < 100
        and lateness is not None and limit is not None and lateness <= limit
        and result.get("owned_at_end_of_window") == connections
    )  # fmt: skip
    return result


def run_flood(*, connections: int, window: float, timeout: float = 600) -> dict[str, Any]:
    """bench/frame_flood.py: peak RSS of one worker flooded with maximum-size frames."""
    argv = ["bench/frame_flood.py", "--json-only", "--connections", str(connections),
            "--window", str(window)]  # fmt: skip
    # The script exits 1 when the memory target is missed: its figures are kept all the same.
    document, seconds = _run_script(argv, timeout, ok_codes=(0, 1))
    result = dict(document)
    result["benchmark"] = "flood"
    result["bench_seconds"] = round(seconds, 1)
    return result


def run_reconcile(
    *, items: list[int], scenarios: list[str], timeout: float = 1800
) -> dict[str, Any]:
    argv = ["bench/reconcile_pass.py", "--json-only", "--items", *map(str, items),
            "--scenarios", *scenarios]  # fmt: skip
    result, seconds = _run_script(argv, timeout)
    result["bench_seconds"] = round(seconds, 1)
    return result


def run_compat(*, timeout: float = 900) -> dict[str, Any]:
    """LeaseStore + race tests on dynalite; per-test outcomes from a JUnit report."""
    from bench.dynalite import available, dynalite_home, install

    result: dict[str, Any] = {"benchmark": "compat", "implementation": "dynalite"}
    if not available():
        try:
            install()
        except Exception as exc:  # reported in the result, not fatal to the bench
            result["skipped"] = f"dynalite not available: {exc}"
            return result
    result["dynalite_home"] = str(dynalite_home())
    junit = ROOT / "bench" / ".compat-junit.xml"
    argv = [
        "-m", "pytest", "-p", "bench.dynalite_plugin", "tests/integration/test_lease_store.py",
        "-q", "--timeout", "60", "-p", "no:cacheprovider", f"--junitxml={junit}",
    ]  # fmt: skip
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    result["bench_seconds"] = round(time.monotonic() - started, 1)
    result["tests"] = _junit_outcomes(junit)
    junit.unlink(missing_ok=True)
    outcomes = [t["outcome"] for t in result["tests"]]
    result["passed"] = outcomes.count("passed")
    result["failed"] = outcomes.count("failed")
    result["skipped_tests"] = outcomes.count("skipped")
    result["exit_code"] = completed.returncode
    result["raw_race"] = dynalite_race()
    return result


def dynalite_race(racers: int = 16, rounds: int = 40) -> dict[str, Any]:
    """Conditional-write atomicity on dynalite itself, without LeaseStore's error mapping.

    ``racers`` threads (one client each) race a conditional acquire (the first lease model's
    condition, ``lease_expires_at_ms < :now``, epoch + 1: what is tested is the atomicity of a
    conditional UpdateItem, which v2's acquire relies on the same way) on a fresh item per
    round; exactly one conditional UpdateItem per round may succeed and the epoch must end at 1.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from botocore.exceptions import ClientError

    from bench.dynalite import Dynalite

    with Dynalite() as server:
        admin = server.client()
        admin.create_table(
            TableName="race-table",
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        admin.get_waiter("table_exists").wait(TableName="race-table")
        for r in range(rounds):
            admin.put_item(TableName="race-table", Item={
                "pk": {"S": f"CONN#r{r}"}, "lease_expires_at_ms": {"N": "0"},
                "lease_epoch": {"N": "0"}})  # fmt: skip
        clients = [server.client() for _ in range(racers)]
        barrier = threading.Barrier(racers, timeout=30)

        def race(index: int) -> list[int]:
            won = []
            for r in range(rounds):
                barrier.wait()
                try:
                    clients[index].update_item(
                        TableName="race-table",
                        Key={"pk": {"S": f"CONN#r{r}"}},
                        UpdateExpression="SET lease_owner = :me, lease_expires_at_ms = :exp "
                        "ADD lease_epoch :one",
                        ConditionExpression="lease_expires_at_ms < :now",
                        ExpressionAttributeValues={
                            ":me": {"S": f"w{index}"}, ":exp": {"N": "9999999999999"},
                            ":now": {"N": "1"}, ":one": {"N": "1"}},
                    )  # fmt: skip
                    won.append(r)
                except ClientError as exc:
                    if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                        raise
            return won

        with ThreadPoolExecutor(racers) as pool:
            results = list(pool.map(race, range(racers)))
        winners = [sum(r in won for won in results) for r in range(rounds)]
        epochs = [
            int(admin.get_item(TableName="race-table", Key={"pk": {"S": f"CONN#r{r}"}})["Item"]
                ["lease_epoch"]["N"])
            for r in range(rounds)
        ]  # fmt: skip
    return {
        "racers": racers,
        "rounds": rounds,
        "rounds_with_exactly_one_winner": sum(1 for w in winners if w == 1),
        "max_winners_in_a_round": max(winners),
        "epochs_all_one": all(e == 1 for e in epochs),
        "ok": all(w == 1 for w in winners) and all(e == 1 for e in epochs),
    }


def _junit_outcomes(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or "").splitlines()[0][:200]
            elif child.tag == "skipped":
                outcome = "skipped"
                message = (child.get("message") or "")[:200]
        tests.append({"name": case.get("name", ""), "outcome": outcome, "message": message})
    return tests
