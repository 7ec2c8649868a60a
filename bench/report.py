"""Render bench/results.json as bench/RESULTS.md (tables, command, machine, settings, targets)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["render"]


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("" if v is None else str(v) for v in row) + " |")
    return "\n".join(lines)


def _s(value: Any, unit: str = " s") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}{unit}" if value < 10 else f"{value:.2f}{unit}"
    return f"{value}{unit}"


def _met(flag: Any) -> str:
    if flag is None:
        return "-"
    return "**yes**" if flag else "**NO**"


def _results(document: dict[str, Any], group: str) -> list[tuple[str, dict[str, Any]]]:
    return [(n, r) for n, r in document.get("results", {}).items() if r.get("group") == group]


def _error_rows(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"- `{name}` failed: {r['error']}" for name, r in items if "error" in r]


def _latency_section(title: str, items: list[tuple[str, dict[str, Any]]], *, kind: str) -> str:
    rows = []
    for _, r in items:
        if "seconds" not in r:
            continue
        s, st = r["seconds"], r["settings"]
        ratio = r.get("ratio_to_lease", {})
        if kind == "stop":
            label = "control channel" if r.get("control_channel") else "heartbeat fallback"
            rows.append([label, st["streams"],
                         f"{st['lease_seconds']:g} / {st['heartbeat_seconds']:g}",
                         _s(s["p50"]), _s(s["p95"]), _s(s["p99"]), _s(s["max"]),
                         r.get("target") or r.get("bound"), _met(r.get("target_met"))])  # fmt: skip
        else:
            rows.append([r["connections"], st.get("dynamodb", "moto"),
                         f"{st['lease_seconds']:g} / {st['heartbeat_seconds']:g}",
                         st["frames_per_second_per_stream"], _s(s["p50"]), _s(s["p95"]),
                         _s(s["p99"]), _s(s["max"]),
                         f"{ratio.get('p50', 0):.2f} / {ratio.get('p99', 0):.2f}",
                         r.get("target"), _met(r.get("target_met"))])  # fmt: skip
    if kind == "stop":
        header = ["path", "streams", "lease / heartbeat (s)", "p50", "p95", "p99", "max",
                  "target", "met"]  # fmt: skip
    else:
        header = ["K", "DynamoDB", "lease / heartbeat (s)", "frames/s/stream", "p50", "p95", "p99",
                  "max", "p50 / p99 as x lease", "target", "met"]  # fmt: skip
    parts = [title, "", _table(header, rows)] if rows else [title, "", "(not run)"]
    parts += _error_rows(items)
    return "\n".join(parts)


def _loss_section(document: dict[str, Any]) -> str:
    rows = []
    for group in ("crash", "handoff"):
        for name, r in _results(document, group):
            a = r.get("audit")
            if not a:
                continue
            rows.append([name, a["streams"], a["checkpointed"], a["stored"], a["lost"],
                         a["wrong_content"], a["stale_epoch"], a["overlapping_sessions"],
                         a["replay_gaps"], _met(a["ok"])])  # fmt: skip
    header = ["run", "streams", "seqs up to checkpoints", "frames stored", "lost",
              "wrong content", "stale epoch", "overlapping sessions", "replay gaps", "exactly once"]
    return "\n".join(["## 4. Loss and duplicates after 1 and 2", "",
                      "Every seq from 1 to the record's checkpoint must be stored exactly once, "
                      "with content `<id>:<seq>`, under its own sort key; no frame under an "
                      "older epoch after a newer one; no two upstream sessions open at once.", "",
                      _table(header, rows) if rows else "(not run)"])  # fmt: skip


def _cost_section(document: dict[str, Any]) -> str:
    parts = ["## 5. Request cost (steady state, one worker, counted at the proxy)", ""]
    items = _results(document, "cost")
    for name, r in items:
        if "phases" not in r:
            continue
        st = r["settings"]
        parts.append(
            f"`{name}`: lease {st['lease_seconds']:g} s, heartbeat {st['heartbeat_seconds']:g} s, "
            f"queue long polls {st['queue_long_poll_seconds']} s, MESSAGE_FLUSH_MS "
            f"{st['message_flush_ms']}, window {st['window_seconds']:g} s per phase."
        )
        parts.append("")
        rows = []
        for p in r["phases"]:
            rows.append([p["streams"], p["frames_per_second_per_stream"], p["messages_per_second"],
                         p["message_write_requests"], p["messages_written"],
                         p["requests_per_message"], p["messages_per_request"],
                         p["renewals_per_connection_hour"], p["wcu_per_connection_hour_renewals"],
                         p["wcu_per_message"], p["dynamodb_reads_by_worker"],
                         p["sqs_requests_per_worker_hour"]])  # fmt: skip
        parts.append(_table(
            ["streams", "frames/s/stream", "msg/s stored", "BatchWriteItem", "messages",
             "requests/message", "messages/request", "renewals per conn-hour",
             "WCU per conn-hour (renewals, incl. GSI)", "WCU/message",
             "worker DynamoDB reads", "SQS requests per worker-hour"], rows))  # fmt: skip
        first = r["phases"][0] if r["phases"] else None
        if first:
            parts.append("")
            parts.append(
                f"Item sizes: connection item {first['connection_item_bytes']} B, message item "
                f"{first['message_item_bytes']} B. A renewal rewrites the base item (1 WCU) and "
                "the GSI entry, whose sort key `lease_expires_at_ms` changes (delete + put: 2 "
                f"WCU): {first['wcu_per_renewal']} WCU per renewal. No polling reads: "
                f"{_met(r.get('no_polling_reads'))}. <= 1 request per 20 messages at >= 100 "
                f"msg/s: {_met(r.get('target_met'))}."
            )
            parts.append("")
    parts += _error_rows(items)
    return "\n".join(parts)


def _capacity_section(document: dict[str, Any]) -> str:
    items = _results(document, "capacity")
    rows = []
    for _, r in items:
        if "error" in r:
            continue
        st = r.get("settings", {})
        rows.append([st.get("connections"), st.get("frames_per_second_per_connection"),
                     f"{st.get('lease_seconds')} / {st.get('heartbeat_seconds')} / "
                     f"{st.get('safety_margin_seconds')}",
                     st.get("renewals_per_second"), r.get("ramp_seconds_to_all_streaming"),
                     r.get("owned_at_end_of_window"), r.get("rss_per_connection_kb"),
                     f"{r.get('rss_idle_mb')} / {r.get('rss_peak_mb')}",
                     r.get("cpu_percent_of_one_core"), r.get("messages_per_second"),
                     r.get("cpu_ms_per_message"), r.get("renew_lateness_max_ms_steady"),
                     r.get("renew_lateness_max_ms_incl_ramp"), r.get("renew_lateness_limit_ms"),
                     f"{r.get('self_fenced')} / {r.get('lease_lost')}",
                     _met(r.get("target_met"))])  # fmt: skip
    header = ["connections", "frames/s/conn", "lease / heartbeat / margin (s)", "renewals/s",
              "ramp (s)", "held at end", "RSS KB/conn", "RSS idle / peak (MB)", "CPU % of a core",
              "msg/s", "CPU ms/msg", "max renew lateness steady (ms)",
              "incl. ramp (ms)", "limit: half lease (ms)", "self-fenced / lost", "target met"]
    parts = ["## 6. Capacity: one worker process", "",
             "bench/worker_capacity.py (wrapped). The embedded backend serialises every request "
             "(a few hundred writes/s), so lease, heartbeat and frame rate are chosen for it to "
             "sustain; they are printed in each row.", "",
             _table(header, rows) if rows else "(not run)"]  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts)


def _flood_section(document: dict[str, Any]) -> str:
    items = _results(document, "flood")
    rows = [
        [r.get("connections"), f"{r.get('frame_bytes')}, {r.get('frame_text')}",
         r.get("window_seconds"),
         f"{(r.get('queue_bytes') or 0) // 2**20} / {(r.get('session_queue_bytes') or 0) // 2**20}",
         r.get("idle_rss_mib"), r.get("peak_rss_mib"), r.get("task_memory_mib"),
         r.get("frames_written"), r.get("written_mib"),
         f"{r.get('renew_lateness_max_ms')} of {r.get('renew_lateness_limit_ms')}",
         r.get("lease_lost"), _met(r.get("target_met"))]
        for _, r in items if "error" not in r
    ]  # fmt: skip
    header = ["connections", "frame bytes", "flood (s)", "budget worker / session (MiB)",
              "RSS idle (MiB)", "peak RSS (MiB)", "task memory (MiB)", "frames written",
              "written (MiB)", "max renew lateness (ms)", "leases lost", "target met"]
    parts = ["## 6b. Memory under a flood of maximum-size frames", "",
             "bench/frame_flood.py (wrapped; `python -m bench --only flood`). An upstream sends "
             "every connection frames of the largest accepted size as fast as TCP lets it; one "
             "worker with its default byte budgets (WORKER_QUEUE_BYTES, "
             "WORKER_SESSION_QUEUE_BYTES) stores them on the moto server. Peak RSS is the "
             "worker's VmHWM over the whole run. For comparison, the same run (50 connections, "
             "60 s) against the worker before the byte budgets (commit 1b1a72f, caps in frames "
             "only) peaked at 3,133 MiB, three times the task's memory.", "",
             _table(header, rows) if rows else "(not run)"]  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts)


def _pass(run: dict[str, Any], which: str) -> dict[str, Any]:
    """One pass of a reconcile run, in either output format of bench/reconcile_pass.py."""
    nested = run.get(which)
    if isinstance(nested, dict):
        return nested
    return {"pass_ms": run.get(f"{which}_pass_ms"), "hints_sent": run.get(f"{which}_hints_sent")}


def _ms(value: Any) -> str:
    return f"{value:,} ms" if isinstance(value, int | float) else "-"


def _reconcile_section(document: dict[str, Any]) -> str:
    items = _results(document, "reconcile")
    rows = []
    for _name, r in items:
        for run in r.get("runs", []):
            first, warm, cold = (_pass(run, k) for k in ("first", "warm", "cold"))
            rows.append([run["scenario"], f"{run['items']:,}", f"{run['orphans']:,}",
                         f"{run['setup_s']} s", _ms(first.get("pass_ms")),
                         _ms(first.get("scan_ms")), _ms(first.get("claim_ms")),
                         _ms(first.get("send_ms")), first.get("hints_sent"),
                         _ms(warm.get("pass_ms")), _ms(cold.get("pass_ms")),
                         (warm.get("hints_sent") or 0) + (cold.get("hints_sent") or 0),
                         run["hint_queue_depth"]])  # fmt: skip
    header = ["scenario", "items", "orphans", "setup", "first pass", "of it: query", "claims",
              "sends", "hints sent", "warm 2nd pass", "cold 2nd pass", "hints re-sent",
              "queue depth"]  # fmt: skip
    parts = ["## 7. Reconciler pass time", "",
             "bench/reconcile_pass.py (wrapped): real `Reconciler.run_pass` over N connection "
             "items on the embedded backend (1% orphaned, page size 500). First pass: query, "
             "claim and send a hint per orphan; warm 2nd pass: same container, the hint ledger "
             "skips the claims; cold 2nd pass: a new container, every claim refused by "
             "DynamoDB, nothing re-sent. The GSI query reads only leases expiring before the "
             "next pass; on moto its cost still grows with the table (moto scans the index).",
             "", _table(header, rows) if rows else "(not run)"]  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts)


def _compat_section(document: dict[str, Any]) -> str:
    items = _results(document, "compat")
    parts = ["## 8. Compatibility: LeaseStore and race tests on dynalite", ""]
    for _, r in items:
        if "skipped" in r:
            parts.append(f"Skipped: {r['skipped']}")
            continue
        if "tests" not in r:
            continue
        parts.append(
            f"tests/integration/test_lease_store.py with `-p bench.dynalite_plugin` (DynamoDB on "
            f"dynalite 4.0.0, SQS on moto): **{r['passed']} passed, {r['failed']} failed, "
            f"{r['skipped_tests']} skipped** ({r['bench_seconds']} s)."
        )
        parts.append("")
        race = r.get("raw_race")
        if race:
            parts.append(
                f"Raw race on dynalite (wsfleet's acquire condition, {race['racers']} threads x "
                f"{race['rounds']} rounds, no LeaseStore error mapping): "
                f"{race['rounds_with_exactly_one_winner']}/{race['rounds']} rounds with exactly "
                f"one winner, max {race['max_winners_in_a_round']} winner(s) in a round, epochs "
                f"all 1: {race['epochs_all_one']} -> atomic conditional writes: {_met(race['ok'])}."
            )
            parts.append("")
        failed = [t for t in r["tests"] if t["outcome"] != "passed"]
        if failed:
            parts.append(
                "Why they fail: dynalite 4.0.0 accepts `ReturnValuesOnConditionCheckFailure="
                "ALL_OLD` (DynamoDB, June 2023) but never returns the item with a "
                "ConditionalCheckFailedException. LeaseStore reads the refusal's item to tell "
                "conflict from stopped from missing, so on dynalite a refused acquire becomes "
                "ConnectionNotFound instead of LeaseConflict (the 32-thread race test then "
                "deadlocks on its barrier, hence its timeout), and a refused START without an "
                "item takes the 'deleted meanwhile' branch and recurses until RecursionError. "
                "The conditional writes themselves are atomic on dynalite (raw race above): "
                "the gap is LeaseStore's reliance on ALL_OLD, fixable with a consistent "
                "GetItem when a refusal carries no item (and a bounded retry in `start`)."
            )
            parts.append("")
            parts.append(_table(["test", "outcome", "first line"],
                                [[t["name"], t["outcome"], t["message"].replace("|", "/")]
                                 for t in failed]))  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts)


def _targets(document: dict[str, Any]) -> str:
    rows = []
    for group, label in (("crash", "1. crash failover p99 <= lease + 1 s"),
                         ("handoff", "2. graceful hand-off p99 < 1 s")):  # fmt: skip
        for name, r in _results(document, group):
            if "seconds" in r:
                rows.append([label, name, f"p99 {r['seconds']['p99']:.2f} s "
                             f"(lease {r['settings']['lease_seconds']:g} s)",
                             _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "stop"):
        if "seconds" in r and r.get("control_channel"):
            rows.append(["3. STOP p99 < 1 s (control channel)", name,
                         f"p99 {r['seconds']['p99']:.2f} s", _met(r.get("target_met"))])
    audits = [r["audit"] for g in ("crash", "handoff") for _, r in _results(document, g)
              if r.get("audit")]  # fmt: skip
    if audits:
        lost = sum(a["lost"] for a in audits)
        dup = sum(a["wrong_content"] + a["stale_epoch"] + a["overlapping_sessions"] for a in audits)
        rows.append(["4. every seq exactly once", f"{len(audits)} runs",
                     f"{lost} lost, {dup} duplicated / stale", _met(all(a["ok"] for a in audits))])
    for name, r in _results(document, "cost"):
        if "phases" in r:
            busy = [p for p in r["phases"] if p["messages_per_second"] >= 90]
            worst = max((p["requests_per_message"] or 0 for p in busy), default=None)
            rows.append(["5. no polling reads", name,
                         f"{sum(p['dynamodb_reads_by_worker'] for p in r['phases'])} reads",
                         _met(r.get("no_polling_reads"))])  # fmt: skip
            rows.append(["5. <= 1 request / 20 messages at >= 100 msg/s", name,
                         f"{worst} requests/message" if worst is not None else "-",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "capacity"):
        if "error" not in r:
            big = (r.get("settings") or {}).get("connections", 0) >= 5000
            label = ("6. >= 5,000 conns, < 100 KB each, lateness <= lease/2" if big
                     else "6. < 100 KB per conn, lateness <= lease/2 (smaller run)")  # fmt: skip
            rows.append([label, name,
                         f"{r.get('owned_at_end_of_window')} held, "
                         f"{r.get('rss_per_connection_kb')} KB/conn, max lateness "
                         f"{r.get('renew_lateness_max_ms_steady')} ms of "
                         f"{r.get('renew_lateness_limit_ms')}",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "flood"):
        if "error" not in r:
            rows.append(["memory: peak RSS under a max-size frame flood < task memory", name,
                         f"{r.get('peak_rss_mib')} MiB of {r.get('task_memory_mib')}, "
                         f"{r.get('connections')} conns, {r.get('lease_lost')} leases lost",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "compat"):
        if "tests" in r:
            rows.append(["8. LeaseStore + race tests pass on dynalite", name,
                         f"{r['passed']} passed / {r['failed']} failed",
                         _met(r["failed"] == 0)])  # fmt: skip
            if r.get("raw_race"):
                rows.append(["8. conditional writes atomic on dynalite", name,
                             f"max {r['raw_race']['max_winners_in_a_round']} winner per round",
                             _met(r["raw_race"]["ok"])])  # fmt: skip
    return "## Targets\n\n" + _table(["target", "run", "measured", "met"], rows)


NOTES = """## Notes: method and what limits the figures

- **The embedded backend is the bottleneck, not wsfleet.** moto runs in one process behind one
  global lock (wsfleet_local.backend), so every DynamoDB and SQS call of every process is
  serialised. On this machine, with other agents running at the same time, a conditional
  UpdateItem took about 15-20 ms and a 25-item BatchWriteItem 13-40 ms (measured while
  building the proxy). Anything that is a chain of N writes (a drain, a takeover of N
  connections) therefore costs N x 15-20 ms here; on DynamoDB the same writes run concurrently
  (16 I/O threads per worker) in single-digit milliseconds each.
- **The backend's SQS long-poll emulation** serves a waiting ReceiveMessage as short polls under
  that same lock, re-polling at once when an SQS write lands and otherwise every 100 ms (for
  delayed messages). SQS itself is slow there: a SendMessageBatch of 10 took about 32 ms (ad hoc
  measurement on an idle machine: 100 hints in 10 batches, 0.32 s), so the 100 hints of a
  100-connection hand-off take about a third of a second to send, one batch after another.
- **Runs named `-dynalite`** keep the tables on dynalite 4.0.0 (node, concurrent: 400 conditional
  UpdateItems took 0.8 s from 16 threads, against 2.9 s on the moto server, measured ad hoc the
  same way) while SQS, the simulator, the Lambdas and the workers are unchanged. They show what
  the serialised moto server costs the K = 100 runs; dynalite has no Streams, so they cannot
  measure STOP.
- **Crash failover follows the lease by design**: the dead worker's last renewal happened
  0-1 heartbeat before the kill, so its leases expire lease - U(0, heartbeat) after it. The
  reconciler's early hint is delayed with SQS DelaySeconds (whole seconds) rounded *down*, so it
  lands in the lease's last second; the worker that receives it waits out the rest
  (`wsfleet.lease.acquire_wait_ms`) and acquires at the expiry; then one connect, and the
  replay from the checkpoint. K = 100 on moto is run at lease 8 s / heartbeat 2 s instead of
  4 s / 1 s: 100 renewals/s on one worker is more than the moto server sustains beside the rest
  (the worker rightly holds back new acquires while its renewals run late). On dynalite it runs
  at 4 s / 1 s.
- **Crash failover of 100 connections on moto** can end past the lease + 1 s, most at the short
  8 s lease: every hint goes out on time (the reconciler log shows all 100 sent in the passes
  around the expiry), but the peers' 100 acquires and 100 connects queue behind the
  reconciler's 100 claim writes and the renewals on the one serialised backend. The same run on
  dynalite, at a 4 s lease, stays within the lease + 1 s.
- **Graceful hand-off of K connections** is K releases (each with the final checkpoint), K hints
  and K acquires by the peers. On moto those are serialised conditional writes, so the last
  connection of 100 waits for all of them; on dynalite the writes overlap and what is left is
  mostly sending and receiving the 100 hints on the moto SQS (see above). With K = 10 the same
  path is a few hundred milliseconds either way.
- **STOP without the control channel** is bounded by the heartbeat (the next renewal is
  refused): up to one heartbeat plus one renewal.
- **Request cost** is counted at the fault proxy, which sees every request of the worker
  process (the proxy injects nothing in these runs). The Lambdas are not behind it: the
  reconciler costs one GSI Query per pass (plus one SendMessageBatch and one conditional
  claim write per orphan), independent of the number of healthy connections; the notifier
  costs one SendMessage per STOP.
- **Capacity** uses bench/worker_capacity.py as is: one worker process, its own backend and
  simulator; RSS per connection is (RSS at N - RSS idle) / N.
- **Chaos suite** (tests/chaos, not a benchmark): see the report of `make test`; it prints the
  seed, the events and the invariant figures of each run.
"""


def render(document: dict[str, Any]) -> str:
    m = document.get("machine", {})
    results = document.get("results", {}).values()
    minutes = sum(r.get("elapsed_seconds") or 0 for r in results) / 60
    end_load = document.get("load_average_at_end") or next(
        (r.get("load_average_after") for r in reversed(list(results))), None
    )
    header = [
        "# wsfleet benchmark results",
        "",
        "Generated by the bench itself; do not edit by hand. Reproduce with:",
        "",
        "```",
        f"{document.get('command', 'python -m bench')}      # or: make bench",
        "```",
        "",
        f"- mode: **{document.get('mode', '?')}**, started {document.get('started_at', '?')}; "
        f"the steps in these tables ran {minutes:.1f} min in total",
        f"- machine: **{m.get('cores')} cores** ({m.get('cpu')}), {m.get('memory_mb')} MB memory, "
        f"Python {m.get('python')}, {m.get('platform')}, commit {m.get('commit')}",
        f"- load average at start {m.get('load_average_at_start')}, at end {end_load} "
        "(1, 5, 15 min): other sessions may share this machine, and every latency below "
        "includes whatever CPU they took",
        *[f"- partial re-run: `{r['command']}` at {r['started_at']} (load average "
          f"{r['machine'].get('load_average_at_start')}); its steps replace those of the full run"
          for r in document.get("reruns", [])],
        "- backend: the embedded moto server (one process, every request serialised) and the "
        "upstream simulator on 127.0.0.1; workers are real `python -m wsfleet_worker` processes; "
        "the router, reconciler and STOP notifier run through their real handlers "
        "(wsfleet_local.fleet.LocalFleet); runs named `-dynalite` keep their tables on dynalite "
        "(DynamoDB only, concurrent; SQS stays on moto) to show what the serialised moto server "
        "costs",
        "- latencies: nearest-rank percentiles over the connections of a run (with K = 10, p95 "
        "and p99 are the maximum); times are taken at the upstream (simulator session log)",
    ]
    sections = [
        "\n".join(header),
        _targets(document),
        _latency_section(
            "## 1. Crash failover (SIGKILL a worker holding K connections)\n\n"
            "Time from the SIGKILL to the first frame the upstream sent to the new owner. The "
            "dead worker's leases run out (expected: lease minus up to one heartbeat); the "
            "reconciler's early hint lands in the lease's last second (SQS DelaySeconds is whole "
            "seconds, rounded down) and the peer that receives it acquires at the expiry.",
            _results(document, "crash"), kind="failover"),
        _latency_section(
            "## 2. Graceful hand-off (SIGTERM a worker holding K connections)\n\n"
            "The worker closes each socket, writes the final checkpoint with the release and sends "
            "a hint per connection; peers acquire at once (no expiry, no reconcile pass).",
            _results(document, "handoff"), kind="failover"),
        _latency_section(
            "## 3. STOP latency (API STOP -> upstream socket closed)\n\n"
            "Control channel: DynamoDB Streams (local poller every 150 ms) -> STOP notifier -> the "
            "owner's control queue -> the session closes. Fallback "
            "(`WORKER_CONTROL_CHANNEL=false`): the next renewal is refused.",
            _results(document, "stop"), kind="stop"),
        _loss_section(document),
        _cost_section(document),
        _capacity_section(document),
        _flood_section(document),
        _reconcile_section(document),
        _compat_section(document),
        NOTES.strip(),
    ]
    return "\n\n".join(sections) + "\n"
