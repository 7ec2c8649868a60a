"""Render bench/results.json as bench/RESULTS.md (tables, command, machine, settings, targets)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .handoff_stages import BREAK_STAGES, OVERLAP_STAGES

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


def _section(
    title: str, intro: str, header: Sequence[str], rows: list[Any], items: list[Any]
) -> str:
    """A section: its title, what the bench did, its table (or "(not run)"), then one line per
    run that failed."""
    parts = [title, "", intro, "", _table(header, rows) if rows else "(not run)"]
    return "\n".join(parts + _error_rows(items))


def _latency_section(title: str, items: list[tuple[str, dict[str, Any]]], *, kind: str) -> str:
    rows = []
    for _, r in items:
        if "seconds" not in r:
            continue
        s, st = r["seconds"], r["settings"]
        ratio = r.get("ratio_to_lease", {})
        if kind == "stop":
            label = "control channel" if r.get("control_channel") else "sweep fallback"
            rows.append([label, st["streams"],
                         f"{st['lease_seconds']:g} / {st['heartbeat_seconds']:g} / "
                         f"{st.get('sweep_seconds', '-')}",
                         _s(s["p50"]), _s(s["p95"]), _s(s["p99"]), _s(s["max"]),
                         r.get("target") or r.get("bound"), _met(r.get("target_met"))])  # fmt: skip
        else:
            exit_event = " + exit event" if st.get("task_exit_events") else ""
            on = st.get("dynamodb", "moto") + exit_event
            rows.append([r["connections"], on,
                         f"{st['lease_seconds']:g} / {st['heartbeat_seconds']:g}",
                         st["frames_per_second_per_stream"], _s(s["p50"]), _s(s["p95"]),
                         _s(s["p99"]), _s(s["max"]),
                         f"{ratio.get('p50', 0):.2f} / {ratio.get('p99', 0):.2f}",
                         r.get("target"), _met(r.get("target_met"))])  # fmt: skip
    if kind == "stop":
        header = ["path", "streams", "lease / heartbeat / sweep (s)", "p50", "p95", "p99", "max",
                  "target", "met"]  # fmt: skip
    else:
        header = ["K", "DynamoDB", "lease / heartbeat (s)", "frames/s/stream", "p50", "p95", "p99",
                  "max", "p50 / p99 as x lease", "target", "met"]  # fmt: skip
    parts = [title, "", _table(header, rows)] if rows else [title, "", "(not run)"]
    breakdown = [
        [name, *(f"{_s(b[k]['p50'])} / {_s(b[k]['p99'])}" if k in b else "-"
                 for k in ("old_session_closed", "new_session_opened")),
         f"{_s(r['seconds']['p50'])} / {_s(r['seconds']['p99'])}"]
        for name, r in items if (b := r.get("breakdown_seconds")) and "seconds" in r
    ]  # fmt: skip
    if breakdown:
        parts += ["", "Where the time went (seconds after the signal, p50 / p99, from the "
                  "upstream's session log): the old session's socket closed; the new owner's "
                  "session opened (release, hint, acquire, connect); its first frame.", "",
                  _table(["run", "old session closed", "new session opened", "first frame"],
                         breakdown)]  # fmt: skip
    parts += _stage_tables(items)
    parts += _stall_table(items)
    parts += _hop_floor_table(items)
    parts += _error_rows(items)
    return "\n".join(parts)


#: What each path's stage table says above it (bench/handoff_stages.py has the sources).
_PATH_INTROS = {
    "overlap": "make-before-break moves (the giver decided a transfer): PREPARE sent (its "
               "SendMessageBatch returned) and seen by the taker, the taker's upstream session "
               "opened and its first frame sent (upstream), READY sent by the taker and seen "
               "by the giver, the transfer write landed, COMMIT sent and seen, the taker "
               "adopted (its consistent read showed the transfer), its first frame stored (its "
               "sink acknowledged it); the giver's socket closed (upstream) is off this path "
               "(the taker streams across it)",
    "break": "break-before-make moves (a connection that cannot overlap, no peer with room, or "
             "a fallback after PREPARE): the giver's socket closed (upstream), its release "
             "landed, the hint (or HANDOFF) sent; the taker received it, its acquire landed, "
             "its upstream session opened (upstream), the first frame sent (upstream) and the "
             "first frame stored by the taker",
}


#: Why the overlap path's last step is a frame interval at 1 frame/s (docs/handoff.md).
_CADENCE_NOTE = (
    " At 1 frame/s adopted -> first stored is mostly the wait for the stream's next frame: "
    "the first frame a taker stores is the first the upstream produces after the giver's last "
    "stored one (the giver stores what it receives until it transfers), up to one frame "
    "interval after the transfer; over uniform frame phases its p99 is about 0.99 s, so "
    "SIGTERM -> first stored cannot reach p99 <= 0.5 s at 1 frame/s whatever the protocol "
    "costs. The 20 frames/s row is the one that measures the protocol."
)


def _stage_tables(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Issue #26's stage tables: per path a row per run (p50 / p99 seconds after the SIGTERM
    per stage), then per step (one stage to the next, per connection)."""
    parts: list[str] = []
    for path, stages in (("overlap", OVERLAP_STAGES), ("break", BREAK_STAGES)):
        staged = [(name, r, timed) for name, r in items
                  if (timed := r.get("stage_paths", {}).get(path))]  # fmt: skip
        if not staged:
            continue
        columns = [*stages, "giver_closed"] if path == "overlap" else list(stages)
        steps = [f"{a}->{b}" for a, b in itertools.pairwise(stages)]

        def cell(stats: dict[str, Any] | None) -> str:
            return f"{_s(stats['p50'])} / {_s(stats['p99'])}" if stats else "-"

        parts += ["", f"Hand-off stages, {path} path (issue #26; seconds after the SIGTERM, "
                  f"p50 / p99 over the connections that took it; bench/handoff_stages.py): "
                  f"{_PATH_INTROS[path]}. The target, p99 <= 0.5 s, is on first stored over "
                  f"every connection (last column).", "",
                  _table(["run", "frames/s/stream", "moves",
                          *(c.replace("_", " ") for c in columns), "target met"],
                         [[name, r["settings"]["frames_per_second_per_stream"],
                           r["stage_moves"].get(path, 0),
                           *(cell(timed["stages"].get(c)) for c in columns),
                           _met(r.get("first_stored_target_met"))]
                          for name, r, timed in staged]),
                  "", "The same moves per step (seconds from one stage to the next for each "
                  "connection, p50 / p99): where a connection spends its hand-off."
                  + (_CADENCE_NOTE if path == "overlap" else ""), "",
                  _table(["run", *(step.replace("_", " ") for step in steps)],
                         [[name, *(cell(timed["steps"].get(step)) for step in steps)]
                          for name, _, timed in staged])]  # fmt: skip
    return parts


def _p(stats: dict[str, Any] | None) -> str:
    """``p50 / p99`` of a percentiles dict, "-" without one."""
    return f"{_s(stats['p50'])} / {_s(stats['p99'])}" if stats else "-"


def _stall_table(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Issue #26: what a reader of the messages table feels (bench/handoff_stages.py,
    ``store_stalls``) beside the SIGTERM -> first stored figure."""
    rows = [[name, r["settings"]["frames_per_second_per_stream"],
             _p(r.get("first_stored_seconds") or r.get("stages_seconds", {}).get("first_stored")),
             _p(stall.get("store_stall_lower")), _p(stall.get("store_stall")),
             _p(stall.get("giver_last_received")),
             _p(stall.get("first_frame_age")), stall.get("missing", 0)]
            for name, r in items if (stall := r.get("store_stall_seconds"))]  # fmt: skip
    if not rows:
        return []
    return ["", "What a reader of the stream feels (issue #26; p50 / p99 over the connections, "
            "seconds; bench/handoff_stages.py `store_stalls`, from the stored items and each "
            "taker's `first frame stored` line). **Store stall**: the giver's last stored frame "
            "-> the taker's first stored frame, i.e. the pause in the messages table around "
            "the hand-off (the giver keeps storing until its transfer). Items carry no write "
            "time, so it is bracketed: **from** the giver's transfer (or release) write, "
            "which its last frame's write preceded (a lower bound), **to** the giver's last "
            "item's receipt time (an upper bound, by the giver's store delay: a flush wait "
            "and one write, seconds when its writes fall behind). At 1 frame/s a frame "
            "interval (1 s) of it is the stream's own cadence. **Giver's last frame**: that "
            "frame's receipt, seconds after the SIGTERM (below 0: the giver's writes were "
            "that far behind at the signal). **Taker's first frame, received -> "
            "stored**: how late that frame reached the table (the taker received and buffered "
            "it before the transfer).", "",
            _table(["run", "frames/s/stream", "SIGTERM -> first stored",
                    "store stall from (giver's transfer or release -> taker's first stored)",
                    "store stall to (giver's last frame received -> taker's first stored)",
                    "giver's last frame (after SIGTERM)", "taker's first frame, received -> "
                    "stored", "streams without figures"], rows)]  # fmt: skip


#: The stage table's steps that are one SQS hop each on the overlap path.
_HOP_STEPS = ("prepare_sent->prepare_seen", "ready_sent->ready_seen", "commit_sent->commit_seen")
_WINDOWS = {"idle": "idle rig (fleet up, no stream yet)",
            "steady": "steady (K streams, peers up, before the SIGTERM)",
            "control": "hand-off's messages (SIGTERM -> last PREPARE/READY/COMMIT/hint seen)",
            "handoff": "hand-off (SIGTERM -> last first stored)"}  # fmt: skip


def _hop_floor_table(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Issue #26: the rig's SQS hop floor (bench/hop_probe.py) per window, the path floor
    (3 hops) against the target, and the hand-off's own three hops from its stage table."""
    rows = []
    for name, r in items:
        probe = r.get("hop_probe")
        if not probe:
            continue
        floors = probe.get("path_floor_seconds", {})
        steps = (r.get("stage_paths", {}).get("overlap") or {}).get("steps", {})
        own = [steps[k]["p50"] for k in _HOP_STEPS if k in steps]
        for window, label in _WINDOWS.items():
            w = probe["windows"].get(window)
            if w is None:
                continue
            floor = floors.get(window)
            hops = _s(round(3 * w["hop"]["p50"], 3)) if w.get("hop") else "-"
            if window == "control" and len(own) == 3:
                hops += f" (own: {_s(round(sum(own), 3))})"
            rows.append([name, label, _s(w["window_seconds"]), f"{w['received']} / {w['sent']}",
                         _p(w.get("send_call")), _p(w.get("send_to_receive")), _p(w.get("hop")),
                         _s(floor), "-" if floor is None else
                         ("below" if floor < 0.5 else "**at or above**"), hops])  # fmt: skip
    if not rows:
        return []
    return ["", "The rig's SQS hop floor (issue #26; bench/hop_probe.py): a child process sends "
            "a small message every 0.1 s to a queue of its own on the same moto server and "
            "long-polls it as the workers' control channels do (WaitTimeSeconds 20, deletes "
            "beside the next receive); p50 / p99 seconds over the messages sent in each window. "
            "**Send call**: the SendMessage request; **send -> receive**: its start -> the "
            "ReceiveMessage that returned it; **hop**: the send's return -> that receive (what "
            "the stage table's `x sent->x seen` steps measure; below 0 when the receive "
            "returned before the send's response reached the sender). **Path floor**: 3 x the "
            "send -> receive p50, the three hops on a make-before-break hand-off's critical "
            "path (PREPARE, READY, COMMIT) alone, against the 0.5 s target. **3 x hop**: the "
            "same without the send calls, and in brackets on the messages row the hand-off's "
            "own three hops measured the same way (the p50s of the stage steps prepare "
            "sent->seen, ready sent->seen and commit sent->seen, summed). The hand-off's "
            "windows are short (a few seconds: 10 samples a second), so their p99 is close to "
            "the maximum.", "",
            _table(["run", "window", "length", "received / sent", "send call",
                    "send -> receive", "hop", "path floor (3 x send -> receive p50)",
                    "vs 0.5 s", "3 x hop p50 (hand-off's own)"], rows)]  # fmt: skip


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
                      "After the takeover every stream is STOPped through the API (the STOP "
                      "writes the final checkpoint). Every seq from 1 to the record's checkpoint "
                      "must be stored exactly once, with content `<id>:<seq>`, under its own sort "
                      "key; no frame under an older epoch after a newer one; no two upstream "
                      "sessions of one stream open at the same time (no tolerance: any overlap "
                      "is a violation).", "",
                      _table(header, rows) if rows else "(not run)"])  # fmt: skip


def _n(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _coordination_part(name: str, r: dict[str, Any]) -> list[str]:
    st = r["settings"]
    prod, comp = st["production_cadences_seconds"], st["compressed_cadences_seconds"]
    cadence = ", ".join(f"{k.replace('_', ' ')} {prod[k]:g} s ({comp[k]:g} s)" for k in prod)
    parts = [
        f"`{name}`: **{st['connections']:,} connections on one worker**, "
        f"{st['frames_per_second_per_stream']} frames/s each. Production cadences, run "
        f"**time-compressed by {st['time_compression_factor']:g}** (every cadence divided by "
        f"it, every measured rate divided by it; the run's cadence in brackets): {cadence}. "
        f"Window {st['window_seconds_wall']:g} s wall = {st['window_seconds_production']:g} s "
        f"of production time (checkpoint periods: {st['checkpoint_periods_in_window']}, so every "
        "connection checkpoints the same number of times in it). The worker and each Lambda "
        f"({', '.join(st['lambdas_behind_proxy'])}) talk to DynamoDB through the counting proxy "
        "under their own label. Writes and their index writes come from the table's stream "
        "images, reads from the proxy's journal; units with DynamoDB's rules (write: ceil(size "
        "/ 1 KB) of the larger image; index write per index entry that appears, disappears, "
        "changes key or changes a projected attribute; read: ceil(bytes / 4 KB), half when "
        "eventually consistent). Streams still streaming at the end: "
        f"{_met(r.get('still_streaming_at_end'))}; a steady state (no worker registered, "
        f"nobody killed in the window): {_met(r.get('steady_state'))}.",
        "",
    ]
    writes, reads = r["writes_per_connection_hour"], r["reads_per_connection_hour"]
    rows = [[c, _n(w["requests"], 3), _n(w["write_units"], 3), _n(w["gsi_writes"], 3),
             _n(w["gsi_write_units"], 3), "", ""] for c, w in writes.items()]  # fmt: skip
    rows += [[c, "", "", "", "", _n(x["requests"], 3), _n(x["read_units"], 3)]
             for c, x in reads.items()]  # fmt: skip
    t = r["totals_per_connection_hour"]
    rows.append(["**v2 total**", f"**{_n(t['writes'], 3)}**", f"**{_n(t['write_units'], 3)}**",
                 f"**{_n(t['gsi_writes'], 3)}**", f"**{_n(t['gsi_write_units'], 3)}**",
                 f"**{_n(t['reads'], 3)}**", f"**{_n(t['read_units'], 3)}**"])  # fmt: skip
    v1 = r.get("v1_per_connection_hour") or {}
    if v1:
        rows.append(["v1 for comparison (per-connection renewal, 720/h x 3 WCU)",
                     _n(v1.get("writes"), 0), _n(v1.get("write_units"), 0),
                     _n(v1.get("gsi_writes"), 0), _n(v1.get("gsi_write_units"), 0), "-",
                     _n(v1.get("read_units"), 3)])  # fmt: skip
    parts.append(_table(["per connection-hour", "writes", "WCU", "GSI writes", "GSI WCU",
                         "reads", "RCU"], rows))  # fmt: skip
    parts += ["", f"Target: {r['target']}: {_met(r.get('target_met'))}. v1 figures: "
              f"{v1.get('source', '-')} (its reads: the v1 reconciler's query per pass, recorded "
              "at 50 connections per worker).", ""]  # fmt: skip
    return parts


def _cost_section(document: dict[str, Any]) -> str:
    parts = ["## 5. Request cost (steady state, one worker, counted at the proxy)", "",
             "### 5a. Coordination cost per connection-hour (issue #12: <= 10 writes, <= 10 "
             "reads at 1,000 connections per worker)", ""]  # fmt: skip
    items = _results(document, "cost")
    for name, r in items:
        if "writes_per_connection_hour" in r:
            parts += _coordination_part(name, r)
    parts += ["### 5b. Messages table: requests per message", ""]
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
                         p["wcu_per_message"], p.get("connection_table_updates"),
                         p["dynamodb_reads_by_worker"],
                         p["sqs_requests_per_worker_hour"]])  # fmt: skip
        parts.append(_table(
            ["streams", "frames/s/stream", "msg/s stored", "BatchWriteItem", "messages",
             "requests/message", "messages/request", "WCU/message",
             "connections-table updates in window", "worker DynamoDB reads in window",
             "SQS requests per worker-hour"], rows))  # fmt: skip
        first = r["phases"][0] if r["phases"] else None
        if first:
            parts.append("")
            parts.append(
                f"Item sizes: connection item {first['connection_item_bytes']} B, message item "
                f"{first['message_item_bytes']} B. The window is shorter than CHECKPOINT_SECONDS "
                "(600 s), so the connections-table updates here are the worker-lease renewals "
                "(5a has the full accounting); the worker's reads are its sweep's gsi_owner "
                "queries (every 30 s). <= 1 request per 20 messages at >= 100 msg/s: "
                f"{_met(r.get('target_met'))}."
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
    header = ["connections", "frames/s/conn", "lease / heartbeat / margin (s)",
              "worker-lease renewals/s",
              "ramp (s)", "held at end", "RSS KB/conn", "RSS idle / peak (MB)", "CPU % of a core",
              "msg/s", "CPU ms/msg", "max renew lateness steady (ms)",
              "incl. ramp (ms)", "limit: half lease (ms)", "self-fenced / lost", "target met"]
    intro = ("bench/worker_capacity.py (wrapped), at the production lease (20 s / heartbeat "
             "5 s): in v2 a worker renews one item per heartbeat whatever it holds, so the "
             "renewal lateness is the worker lease's (`RenewLatenessMs`). The embedded backend "
             "serialises every request (a few hundred writes/s), so the frame rate is chosen "
             "for it to sustain; a run is met only if every connection streams (at least half "
             "the offered frames stored).")  # fmt: skip
    return _section("## 6. Capacity: one worker process", intro, header, rows, items)


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
    intro = ("bench/frame_flood.py (wrapped; `python -m bench --only flood`). An upstream sends "
             "every connection frames of the largest accepted size as fast as TCP lets it; one "
             "worker with its default byte budgets (WORKER_QUEUE_BYTES, "
             "WORKER_SESSION_QUEUE_BYTES) stores them on the moto server. Peak RSS is the "
             "worker's VmHWM over the whole run. For comparison, the same run (50 connections, "
             "60 s) against the worker before the byte budgets (commit 1b1a72f, caps in frames "
             "only) peaked at 3,133 MiB, three times the task's memory.")  # fmt: skip
    return _section("## 6b. Memory under a flood of maximum-size frames", intro, header, rows,
                    items)  # fmt: skip


def _shapes_section(document: dict[str, Any]) -> str:
    items = _results(document, "shapes")
    rows = []
    for _, r in items:
        for name, figures in (r.get("shapes") or {}).items():
            rows.append([name, figures.get("upstream_sessions"), figures.get("stored"),
                         figures.get("lost"), figures.get("resume_gaps"),
                         figures.get("gap_frames"), figures.get("auth_rejects")])
    header = ["stream (shape)", "upstream sessions", "frames stored", "frames lost",
              "gapped resumes reported", "gap frames reported", "401s"]
    met = ", ".join(_met(r.get("target_met")) for _, r in items if "error" not in r)
    intro = ("bench/shapes.py (`python -m bench --only shapes`). One stream per simulator shape "
             "(plain replay, header-authenticated with a Secrets Manager credential by "
             "reference, subscribe-to-resume, live-only without replay) on a local fleet, "
             "short lease profile: worker 0 SIGKILLed, then its successors SIGTERMed with a "
             "fresh peer ready, then STOP and audit. Lost: seqs between the first and the "
             "final checkpoint not stored. Reported: the record's resume_gaps / gap_frames "
             "(what `GET /connections/{id}` shows). Expected: the replaying shapes 0 and 0; "
             "live-only loses what was produced while nobody listened and reports exactly "
             f"that. Target met: {met or '(not run)'}.")  # fmt: skip
    return _section("## 6d. Upstream shapes through a crash and a hand-off (issue #13)", intro,
                    header, rows, items)  # fmt: skip


def _handoff_modes_section(document: dict[str, Any]) -> str:
    items = _results(document, "handoff-modes")
    rows = []
    for name, r in items:
        rate = r.get("settings", {}).get("frames_per_second_per_stream")
        load = f"{r.get('load_average_before')} -> {r.get('load_average_after')}"
        for cohort, f in (r.get("cohorts") or {}).items():
            overlap = f.get("overlap_seconds") or {}
            rows.append([f"{r.get('disruption')} @ {rate:g}/s" if rate else name, cohort,
                         f.get("streams"), f.get("moves"), f.get("frames_lost"),
                         f.get("lost_per_move"), f.get("gap_frames_reported"),
                         f.get("gapped_resumes_reported"), f.get("upstream_overlaps"),
                         f"{_s(overlap.get('p50'))} / {_s(overlap.get('max'))}"
                         if overlap else "-",
                         f.get("refused_handshakes"), load])
    header = ["run", "upstream / mode", "streams", "moves", "frames lost", "lost per move",
              "gap reported", "gapped resumes", "overlaps at upstream", "overlap p50 / max",
              "409s", "load avg (1, 5, 15 min) before -> after"]
    notes = []
    for name, r in items:
        if r.get("not_even"):
            notes.append(f"- `{name}`: the spread did not even out: {r['not_even']}")
        for target, met in (r.get("targets") or {}).items():
            notes.append(f"- `{name}` {target}: {_met(met)}")
    intro = ("bench/handoff_modes.py (`python -m bench --only handoff-modes`). Issue #26: "
             "cohorts of streams, one per upstream behaviour (live-only; live-only allowing "
             "one session per account; live-only cutting the first session when a second "
             "opens; replaying) and hand-off mode (`upstream.handoff`: "
             "`break` = break-before-make, `overlap` = make-before-break), through the same "
             "SIGTERM drains (worker 0, then worker 1, a fresh peer ready) or the same 3 -> 6 "
             "rebalance, in one run; short lease profile. Lost: seqs between the first and the "
             "last stored that are not stored. Gap reported: the records' gap_frames. Overlaps: "
             "pairs of one stream's sessions open together at the upstream (simulator session "
             "log). Targets: live/overlap 0 lost; one-session and cut-first gap == lost; replay 0 "
             "and 0; "
             "break never overlaps.")  # fmt: skip
    section = _section("## 6e. Hand-off modes: make-before-break beside break-before-make "
                       "(issue #26)", intro, header, rows, items)  # fmt: skip
    return "\n".join([section, *notes])


def _throughput_section(document: dict[str, Any]) -> str:
    items = _results(document, "throughput")
    parts = ["## 6c. Throughput: frames stored per second per worker vCPU", "",
             "bench/throughput.py (wrapped): the tables on dynalite (SQS on moto), an upstream "
             "sending small numbered frames as fast as the worker reads, one worker holding the "
             "connections. Frames stored (MessagesWritten) over the worker's CPU seconds (user + "
             "system, all threads, from /proc) in the same interval = frames/s per vCPU. The "
             "upstream and dynalite share the machine's cores (their use is shown). A second pass "
             "runs under cProfile for the profile; afterwards every stream is read back: seqs "
             "1..max each once with its own content. Target: >= 10,000 frames/s per vCPU.", ""]
    for name, r in items:
        if "error" in r:
            continue
        v = r.get("verify") or {}
        others = r.get("other_processes_cores_used") or {}
        parts.append(_table(
            ["run", "connections (active)", "frames stored/s", "worker cores used",
             "frames/s per vCPU", "CPU us/frame", "write requests/frame",
             "upstream / dynalite cores", "exactly once (frames)", "target met"],
            [[name, f"{r['settings']['connections']} ({r.get('active_connections')})",
              r.get("frames_stored_per_second"), r.get("worker_cores_used"),
              r.get("frames_per_cpu_second"), r.get("cpu_us_per_frame"),
              r.get("write_requests_per_frame"),
              " / ".join(str(x) for x in others.values()),
              f"{_met(v.get('exactly_once'))} ({v.get('frames_stored')})",
              _met(r.get("target_met"))]]))  # fmt: skip
        for title, key, column in (("cProfile, % of busy CPU time", "profile_cprofile",
                                    "own_percent"),
                                   ("py-spy, % of samples", "profile_py_spy", "percent")):
            profile = r.get(key) or {}
            if profile.get("by_own"):
                parts += ["", f"Top of the profile by own time ({title}):", ""]
                parts.append(_table(["%", "function"],
                                    [[row[column], f"`{row['function']}`"]
                                     for row in profile["by_own"][:12]]))  # fmt: skip
        parts.append("")
    parts += _error_rows(items)
    return "\n".join(parts)


def _sinks_section(document: dict[str, Any]) -> str:
    """Issue #27: throughput and cost per frame sink (bench/sink_bench.py)."""
    from .sink_bench import floor_verdict, table

    items = _results(document, "sinks")
    parts = ["## 6f. Frame sinks: frames per worker vCPU-second and cost per million frames "
             "(issue #27)", "",
             "bench/sink_bench.py: for each sink and load one bench/throughput.py run (its own "
             "upstream, embedded moto server for Kinesis, Firehose and S3, dynalite tables, one "
             "worker). Frames stored over the worker's CPU seconds in a steady window; the load "
             "average (1 min) of the shared 2-core machine before and after each run is shown, "
             "since CPU time per frame grows when other processes compete for the cores and "
             "caches. Afterwards every stream is read back from its sink (the table, the stream, "
             "or every object Firehose delivered to S3): seq 1..max, each with its own content; "
             "duplicates counted (Kinesis and Firehose are at-least-once). Cost: the units the "
             "backend was sent. DynamoDB: write request units of the items read back "
             "(ceil(item / 1 KB), one write per frame). Kinesis and Firehose: every record the "
             "service took, counted at a proxy in front of it (bench/sink_requests.py); Kinesis "
             "provisioned = PUT payload units (25 KB per record) + shard-hours at full shard use "
             "(1 MB/s or 1,000 records/s), Kinesis on-demand = data in with each record rounded "
             "up to 1 KB (last column), Firehose Direct PUT = ingestion with each record rounded "
             "up to 5 KB. Fixed charges (an on-demand stream-hour, S3 behind Firehose) are not "
             "per frame and left out. A frame's record is its JSON with connection id, key, seq, "
             "lease epoch, receive time and worker id (about 130 bytes more than the frame). "
             "The upstream paces frames as a feed does (every 50 ms what is due: one frame per "
             "socket read at 20 frames/s), so the 100 x 20 rows pay a wake-up of the event loop "
             "per frame and a request per 100 ms flush, where 10 x 1,000 reads ~50 frames at a "
             "time. Where frames/s is below the offered rate the backend set the pace (dynalite, "
             "or the moto server, which serialises every request and is slow on PutRecords of "
             "500 plain records) and the worker held the rest back (backpressure, no loss). "
             "The receive-floor rows, measured first in the same run (bench/receive_floor.py): "
             "a bare client in its own process opens the same number of connections with "
             "websockets' asyncio client to the same upstream, at the same rate and frame "
             "size, and only counts frames (`async for msg in ws: count += 1`); "
             "receive-floor+parse also runs the worker's parse_frame on each. Its CPU is "
             "measured as the worker's (/proc, user + system, between two of its once-a-second "
             "count lines after the same warm-up, over the same window). No worker can store "
             "frames for less CPU than that; '% of receive floor' is each sink's frames per "
             "vCPU-second over the floor's at the same load.", ""]
    for _name, r in items:
        if "error" in r:
            continue
        prices = r.get("prices") or {}
        parts.append(f"Prices (USD, {prices.get('region')}, billing rules checked against the "
                     f"public price pages on {prices.get('checked')}): "
                     + ", ".join(f"{k} {v}" for k, v in prices.items()
                                 if k not in ("region", "checked")) + ".")  # fmt: skip
        parts += ["", table(r), ""]
        verdict = floor_verdict(r)
        if verdict:
            parts += [verdict, ""]
    parts += _error_rows(items)
    if items:
        parts += [_SINK_CPU_NOTE, ""]
    return "\n".join(parts) if items else ""


#: Issue #27's open row, measured beside the table (bench/throughput.py --sink kinesis
#: --connections 100 --rate 20 --frame-bytes 200, MESSAGE_KINESIS_AGGREGATION=true; py-spy).
_SINK_CPU_NOTE = (
    "**Kinesis aggregated at 100 x 20 (target >= 30,000 frames per vCPU-second): not met.** "
    "The figures of this note were measured on the machine before the one the table above ran "
    "on (about 3x faster per CPU): compare them with each other, not with the table. "
    "Before the changes of 2026-12-02 (commit 283b518; bench/throughput.py, 20 s window, load "
    "0.4-1.4): 10,525 / 11,459 / 9,983 / 10,835 frames per vCPU-second (87-100 us of CPU per "
    "frame, 91 % user time). Changed: PutRecords and PutRecordBatch bodies are built by the "
    "sink (botocore validates and serialises a one-record skeleton, not 100 records: "
    "wsfleet.sinks.base.PrebuiltBody, as the DynamoDB sink already did), a successful answer "
    "is read as JSON instead of through botocore's per-record parser, KPL packing keyed by pk "
    "with per-length record prefixes, frame_json as one f-string, and the flusher's collector "
    "wakes once per batch instead of once per frame (a task switch and a timer per frame). "
    "One put_batch of 200 frames in 100 records against the moto server (client thread CPU): "
    "3.5 ms -> 2.3 ms. Where the CPU of a frame went after the first of these changes (commit "
    "88d7f72, 81.3 us per frame, load 1.9-2.3; py-spy samples of the GIL-holding thread, "
    "grouped by component, scaled to the measured CPU): receiving 27.5 us (epoll and the "
    "event loop 12.0, the transport's read 5.3, websockets' frame parser 5.3, its message "
    "queue and recv 4.9), the session 25.5 us (storing and checkpointing 11.2, parse_frame's "
    "JSON 6.7, the rest of the session 6.5, metrics 1.1), the flusher 6.3 us, encoding and "
    "packing the records 8.1 us, PutRecords in botocore 12.1 us, other 1.9 us; the later "
    "changes (the JSON answer, frame_json) took about 5 us more off the sink's share. After "
    "all of them: 14,231 frames per vCPU-second (70.3 us per frame) in the sinks run of "
    "2026-12-02 09:42 UTC. What "
    "is left is spread over per-frame Python calls, none above a few microseconds: each frame "
    "arriving in its own socket read costs the event loop, websockets' parser and its message "
    "queue, and the wake-up of the session's task (websockets alone, 100 clients at 20 "
    "frames/s, no storage: 36 us per message with asyncio, 30 us if frames skipped the "
    "message queue and the task wake-up, 18 us with uvloop; in the worker an uvloop run gave "
    "74 instead of 78 us per frame, so neither was taken; the receive-floor rows above now "
    "measure the first of these in the same run as the sinks); the session's work is many small "
    "calls (measured alone, hot in the cache: 0.4 us for the metrics counter under its lock, "
    "0.9 us for the frozen Message, 1.5 us for parse_frame; in the worker, 100 connections "
    "interleaved, each costs several times that), so those two were left as they are. The one "
    "large lever left is the flush: at 100 ms a record carries about 2 frames and a request "
    "100 records (one per connection), so the request's fixed cost (signing, HTTP, ~0.9 ms of "
    "client CPU) is paid every 200 frames. MESSAGE_FLUSH_MS=250 measured 16,472 frames per "
    "vCPU-second (60.7 us per frame; flush latency max 316 ms) beside 13,259 (75.4 us; 149 "
    "ms) at the default 100, load 0.9-2.1; the default stays 100 ms (KPL's own default "
    "buffering time): a feed's consumers pay the latency."
)


def _sink_replay_section(document: dict[str, Any]) -> str:
    """Issue #27's delivery contract: loss and re-sends per hand-off (bench/sink_replay.py)."""
    items = _results(document, "sink-replay")
    rows = []
    for _name, r in items:
        if "error" in r:
            continue
        load = f"{r.get('load_before')} / {r.get('load_after')}"
        for kind, c in (r.get("kinds") or {}).items():
            widths = [high - low + 1 for _, low, high in c.get("windows") or []]
            rows.append([r["sink"], kind, c["handoffs"], c["re_sent"], c["reported"],
                         max(widths, default="-"), c["outside"], r["lost"], load,
                         _met(r.get("met"))])  # fmt: skip
    parts = ["## 6g. Frame sinks: frames lost and re-sent after a SIGKILL, a rebalance and a "
             "SIGTERM (issue #27)", "",
             "bench/sink_replay.py (`python -m bench --only sink-replay`): one local fleet per "
             "sink (moto server: tables, stream, S3), 6 streams at 20 frames/s on two workers, "
             "lease 4 s / heartbeat 1 s, MESSAGE_REPLAY_WINDOW=60 and CHECKPOINT_SECONDS=600 so "
             "the send limit drives the checkpoints. The worker holding the most streams is "
             "SIGKILLed (its peer takes over, task exit event), a third worker joins "
             "(rebalancing moves), the other first worker is SIGTERMed (drain); then every "
             "stream is STOPped and read back from the sink. A copy of a seq beyond the first "
             "is *re-sent*, counted against the hand-off that gave its epoch the stream. "
             "*Reported*: the `replayed.frames` the connection views gained in that step (frames "
             "the new holder wrote inside its inherited window: an upper bound of the "
             "duplicates); *window*: the widest `replayed.from_seq..to_seq` reported; "
             "*outside*: re-sent copies outside every reported window. Lost: a seq up to the "
             "final checkpoint missing from the sink (whole run). Target: lost 0, re-sent <= "
             "reported, outside 0, 0 re-sent after a SIGTERM. A make-before-break hand-off's "
             "transfer write carries the giver's final window as a release does (sent_limit = "
             "last_seq with nothing in flight), so a graceful row reports 0; before that fix "
             "its taker reported the giver's last window though it re-sent nothing (123 on "
             "kinesis sigterm, 37 on firehose rebalance, load 2.4-4.3). "
             "Load: 1-minute load average before / after the run.", "",
             _table(["sink", "hand-off", "hand-offs", "re-sent", "reported", "window",
                     "outside", "lost", "load", "target met"], rows), ""]  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts) if items else ""


def _scale_models(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(v, (r.get(v) or {}).get("model") or {}) for v in ("v1", "v2") if r.get(v)]


def _scale_section(document: dict[str, Any]) -> str:
    items = _results(document, "scale")
    parts = ["## 9. Scale model: the hottest partition key", "",
             "bench/scale_record.py records a local fleet's request stream per partition-key "
             "value (every cadence divided by 10; the Lambdas behind the proxy too) and "
             "bench/scale_model.py scales it: the write and read rate of every key of the table "
             "and of each index per 1,000 connections (1,000 per worker), and the fleet size at "
             "which the hottest key reaches 50 % / 100 % of DynamoDB's per-partition limits "
             "(1,000 WCU/s, 3,000 RCU/s). The full tables are in **bench/SCALE.md**; v1 is the "
             "baseline recorded on main before v2 (bench/scale_v1.json).", ""]
    for _name, r in items:
        if "error" in r:
            continue
        rows = []
        for version, m in _scale_models(r):
            hot = m.get("hottest") or {}
            pch = m.get("per_connection_hour") or {}
            rows.append([version, f"{hot.get('target')} `{hot.get('key')}`",
                         _n(hot.get("wcu_per_s_at_1000"), 3), _n(hot.get("rcu_per_s_at_1000"), 3),
                         _n(m.get("ceiling_50"), 0), _n(m.get("ceiling_100"), 0),
                         _n(pch.get("connection_item_wcu")),
                         _n(pch.get("index_wcu_from_connection_items")),
                         _met(m.get("target_met"))])  # fmt: skip
        parts.append(_table(["model", "hottest key", "its WCU/s per 1,000 conns",
                             "its RCU/s per 1,000 conns", "connections at 50 % of a partition",
                             "at 100 %", "connection-item WCU per conn-hour",
                             "index WCU per conn-hour", ">= 1,000,000 at < 50 %"], rows))
        parts.append("")
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
    intro = ("bench/reconcile_pass.py (wrapped): real `Reconciler.run_pass` (lease model v2) "
             "over N connection items on the embedded backend; `steady`: every worker alive, "
             "1% of the connections free and STARTED past the grace (a lost hint). A v2 pass "
             "reads the worker items (gsi_workers + BatchGetItem), gsi_owner of lapsed workers "
             "only and the 16 gsi_unowned shards: live connections cost it nothing. First "
             "pass: find, claim and hint every orphan; warm 2nd pass: same container, the hint "
             "ledger skips the claims; cold 2nd pass: a new container, every claim refused by "
             "DynamoDB, nothing re-sent. moto's GSI query still reads the whole table per page, "
             "so on moto a pass grows with the table; the figures show where its time goes, "
             "not production latency.")  # fmt: skip
    return _section("## 7. Reconciler pass time", intro, header, rows, items)


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
                f"Raw race on dynalite (a conditional acquire, {race['racers']} threads x "
                f"{race['rounds']} rounds, no LeaseStore error mapping): "
                f"{race['rounds_with_exactly_one_winner']}/{race['rounds']} rounds with exactly "
                f"one winner, max {race['max_winners_in_a_round']} winner(s) in a round, epochs "
                f"all 1: {race['epochs_all_one']} -> atomic conditional writes: {_met(race['ok'])}."
            )
            parts.append("")
        failed = [t for t in r["tests"] if t["outcome"] != "passed"]
        if failed:
            parts.append(
                "On dynalite: dynalite 4.0.0 accepts `ReturnValuesOnConditionCheckFailure="
                "ALL_OLD` but never returns the item with a ConditionalCheckFailedException, so "
                "LeaseStore's fallback (a consistent GetItem when a refusal carries no item) "
                "serves every refusal there. `test_refusals_without_the_old_item_are_still_"
                "classified` exercises that fallback by stripping the item from moto's answers "
                "and ends by asserting that the wrapper stripped more than 5 items: on dynalite "
                "there is nothing to strip (`assert 0 > 5`), after every classification "
                "assertion before it passed. A premise of the test (the server sends ALL_OLD), "
                "not a failure of the store."
            )
            parts.append("")
            parts.append(_table(["test", "outcome", "first line"],
                                [[t["name"], t["outcome"], t["message"].replace("|", "/")]
                                 for t in failed]))  # fmt: skip
    parts += _error_rows(items)
    return "\n".join(parts)


def _rebalance_section(document: dict[str, Any]) -> str:
    items = _results(document, "rebalance")
    rows = []
    for name, r in items:
        if "spread_after" not in r:
            continue
        st = r.get("settings", {})
        gap, reconnect = r.get("gap_seconds") or {}, r.get("reconnect_seconds") or {}
        audit = r.get("audit") or {}
        rows.append([
            name, f"{r.get('connections')} on {st.get('workers_before')} -> "
            f"{st.get('workers_after')} ({st.get('dynamodb')})",
            " / ".join(str(v) for v in (r.get("spread_before") or {}).values()),
            " / ".join(str(v) for v in (r.get("spread_after") or {}).values()),
            _s(r.get("seconds_to_even")), r.get("moves"), r.get("moved_twice"),
            f"{_s(gap.get('p50'))} / {_s(gap.get('p99'))} / {_s(gap.get('max'))}",
            f"{_s(reconnect.get('p50'))} / {_s(reconnect.get('max'))}",
            f"{audit.get('lost')} / {audit.get('overlapping_sessions')}",
            _met(r.get("target_met")),
        ])
    header = ["run", "connections, workers", "held before", "held after", "even after",
              "moves", "moved twice", "gap p50 / p99 / max", "reconnect p50 / max",
              "lost / overlaps", "target met"]
    intro = ("bench/rebalance_bench.py (`python -m bench --only rebalance`). Production "
             "cadences (lease 20 s, heartbeat 5 s, reconcile pass 10 s, REBALANCE_SECONDS 10, "
             "REBALANCE_MAX_MOVES 20 per giver and plan, band 10 %). Three workers hold the "
             "connections; three more join; measured from just before the first joins until "
             "every worker holds its share +/- 10 %, then 30 s more (nothing else may move). "
             "Gap: the old upstream session's close to the new one's first frame, per move "
             "(reconnect: to the new one's open). Then every stream is STOPped and the messages "
             "table audited.")  # fmt: skip
    return _section("## 6d. Rebalancing after a scale-out", intro, header, rows, items)


def _targets(document: dict[str, Any]) -> str:
    rows = []
    for name, r in _results(document, "cost"):
        t = r.get("totals_per_connection_hour")
        if t:
            n = r["settings"]["connections"]
            steady = bool(r.get("steady_state", r.get("still_streaming_at_end")))
            rows.append(["request cost: coordination writes <= 10 per conn-hour at 1,000/worker",
                         name, f"{t['writes']:.2f} writes, {t['write_units']:.2f} WCU "
                         f"(+ {t['gsi_write_units']:.2f} GSI WCU) at {n:,} on one worker; "
                         "v1: 720 writes, 2,160 WCU" + ("" if steady else "; NOT a steady state"),
                         _met(steady and t["writes"] <= 10 and t["write_units"] <= 10)])
            rows.append(["request cost: coordination reads <= 10 per conn-hour at 1,000/worker",
                         name, f"{t['reads']:.2f} reads, {t['read_units']:.2f} RCU"
                         + ("" if steady else "; NOT a steady state"),
                         _met(steady and t["reads"] <= 10 and t["read_units"] <= 10)])
    for name, r in _results(document, "scale"):
        models = dict(_scale_models(r))
        v2 = models.get("v2")
        if v2:
            hot = v2.get("hottest") or {}
            v1 = models.get("v1") or {}
            v1_hot = v1.get("hottest") or {}
            rows.append(["scale: >= 1,000,000 connections with the hottest key < 50 % of its "
                         "limit (bench/SCALE.md)", name,
                         f"v2 hottest {hot.get('target')} `{hot.get('key')}`: 50 % at "
                         f"{_n(v2.get('ceiling_50'), 0)} connections; v1 hottest "
                         f"{v1_hot.get('target')} `{v1_hot.get('key')}`: 50 % at "
                         f"{_n(v1.get('ceiling_50'), 0)}",
                         _met(v2.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "throughput"):
        if "error" not in r:
            rows.append(["throughput >= 10,000 frames/s per vCPU at 100 conns (dynalite)", name,
                         f"{_n(r.get('frames_per_cpu_second'), 0)} frames/s per vCPU "
                         f"({r.get('frames_stored_per_second')} frames/s on "
                         f"{r.get('worker_cores_used')} cores)",
                         _met(r.get("target_met"))])  # fmt: skip
    from .sink_bench import FLOOR, TARGET_KINESIS_AGGREGATED, TARGET_LOADS

    for name, r in _results(document, "sinks"):
        for row in r.get("rows", []):
            if row.get("sink") == FLOOR and row.get("frames_per_cpu_second") \
                    and row["load"] in TARGET_LOADS:
                rows.append(["sinks: receive floor (websockets on asyncio, counting only) "
                             f">= {TARGET_KINESIS_AGGREGATED:,} frames/s per vCPU, i.e. #27's "
                             "target reachable",
                             f"{name} {row['load']}",
                             f"{_n(row['frames_per_cpu_second'], 0)} frames/s per vCPU "
                             f"({row.get('cpu_us_per_frame')} us per frame) at load "
                             f"{row['load_average_after'][0]}",
                             _met(row["frames_per_cpu_second"]
                                  >= TARGET_KINESIS_AGGREGATED)])  # fmt: skip
            if "target" in row:
                rows.append([f"sinks: Kinesis aggregated {row['target']} (#27)",
                             f"{name} {row['load']}",
                             f"{_n(row.get('frames_per_cpu_second'), 0)} frames/s per vCPU at "
                             f"load {row['load_average_after'][0]}, no loss: "
                             f"{_met(row.get('no_loss'))}", _met(row.get("target_met"))])
    for name, r in _results(document, "handoff-modes"):
        live = (r.get("cohorts") or {}).get("live/overlap")
        broken = (r.get("cohorts") or {}).get("live/break") or {}
        rate = r.get("settings", {}).get("frames_per_second_per_stream")
        if "error" in r:
            continue
        rows.append(["live-only: 0 frames lost per planned move with overlap (#26)", name,
                     (f"overlap {live['frames_lost']} lost in {live['moves']} moves"
                      if live else "overlap: no figures")
                     + f"; break {broken.get('lost_per_move')} per move at {rate:g} frames/s "
                     f"(load {r.get('load_average_after')})",
                     _met(r.get("target_met"))])  # fmt: skip
    for group, label in (("crash", "crash failover p99 <= lease + 1 s"),
                         ("handoff", "graceful hand-off p99 < 1 s")):  # fmt: skip
        for name, r in _results(document, group):
            on = r.get("settings", {}).get("dynamodb", "moto")
            k = r.get("connections")
            issue = " (#12 target)" if on == "dynalite" and k == 100 else ""
            if r.get("settings", {}).get("task_exit_events"):
                label, issue = "crash failover from the task exit event p99 <= 2 s", " (#14 target)"
            elif group == "crash":
                label = "crash failover p99 <= lease + 1 s"
                if issue and r.get("profile") == "default":
                    issue = " (#14 lease-bound baseline)"
            if "seconds" in r:
                rows.append([f"{label}{issue}", name, f"p99 {r['seconds']['p99']:.2f} s "
                             f"(lease {r['settings']['lease_seconds']:g} s, K = {k}, {on})",
                             _met(r.get("target_met"))])  # fmt: skip
            if stored := r.get("first_stored_seconds"):
                rate = r["settings"]["frames_per_second_per_stream"]
                rows.append(["graceful hand-off, SIGTERM -> first frame stored by the taker, "
                             "p99 <= 0.5 s (#26 target)", name,
                             f"p99 {stored['p99']:.2f} s (K = {k}, {on}, {rate:g} frames/s)",
                             _met(r.get("first_stored_target_met"))])  # fmt: skip
            elif "error" in r:
                rows.append([f"{label}{issue}", name, f"failed: {r['error'][:80]}", _met(False)])
    for name, r in _results(document, "rebalance"):
        label = "rebalance: 3 -> 6 workers, even within 2 min, gap < 1 s, 0 lost, 0 moved twice"
        if "error" in r and r.get("seconds_to_even") is None:
            rows.append([label, name, f"failed: {str(r['error'])[:80]}", _met(False)])
        else:
            gap = (r.get("gap_seconds") or {}).get("max")
            rows.append([label, name, f"even in {_s(r.get('seconds_to_even'))}, "
                         f"{r.get('moves')} moves, max gap {_s(gap)}, "
                         f"{(r.get('audit') or {}).get('lost')} lost, "
                         f"{r.get('moved_twice')} moved twice", _met(r.get("target_met"))])
    for name, r in _results(document, "stop"):
        label = ("STOP p99 < 1 s (control channel)" if r.get("control_channel")
                 else "STOP without the control channel p99 <= sweep interval + 1 s")
        if "seconds" in r:
            sweep = "" if r.get("control_channel") else (
                f" (sweep every {r['settings'].get('sweep_seconds')} s)")
            rows.append([label, name, f"p99 {r['seconds']['p99']:.2f} s{sweep}",
                         _met(r.get("target_met"))])
        elif "error" in r:
            rows.append([label, name, f"failed: {r['error'][:80]}", _met(False)])
    audits = [r["audit"] for g in ("crash", "handoff") for _, r in _results(document, g)
              if r.get("audit")]  # fmt: skip
    if audits:
        lost = sum(a["lost"] for a in audits)
        dup = sum(a["wrong_content"] for a in audits)
        stale = sum(a["stale_epoch"] for a in audits)
        overlaps = sum(a["overlapping_sessions"] for a in audits)
        rows.append(["0 lost, 0 duplicated, 0 stale-epoch, 0 overlapping sessions",
                     f"{len(audits)} runs", f"{lost} lost, {dup} wrong content, {stale} stale "
                     f"epoch, {overlaps} overlaps", _met(all(a["ok"] for a in audits))])
    for name, r in _results(document, "cost"):
        if "phases" in r:
            busy = [p for p in r["phases"] if p["messages_per_second"] >= 90]
            worst = max((p["requests_per_message"] or 0 for p in busy), default=None)
            rows.append(["messages: <= 1 request / 20 messages at >= 100 msg/s", name,
                         f"{worst} requests/message" if worst is not None else "-",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "capacity"):
        if "error" not in r:
            big = (r.get("settings") or {}).get("connections", 0) >= 5000
            label = ("capacity: >= 5,000 conns, < 100 KB each, lateness <= lease/2" if big
                     else "capacity: < 100 KB per conn, lateness <= lease/2 (smaller run)")
            rows.append([label, name,
                         f"{r.get('owned_at_end_of_window')} held, "
                         f"{r.get('messages_per_second')} msg/s, "
                         f"{r.get('rss_per_connection_kb')} KB/conn, max worker-lease renew "
                         f"lateness {r.get('renew_lateness_max_ms_steady')} ms of "
                         f"{r.get('renew_lateness_limit_ms')}",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "flood"):
        if "error" not in r:
            rows.append(["memory: peak RSS under a max-size frame flood < task memory", name,
                         f"{r.get('peak_rss_mib')} MiB of {r.get('task_memory_mib')}, "
                         f"{r.get('connections')} conns, {r.get('received_mib')} MiB received, "
                         f"{r.get('lease_lost')} leases lost",
                         _met(r.get("target_met"))])  # fmt: skip
    for name, r in _results(document, "compat"):
        if "tests" in r:
            rows.append(["LeaseStore + race tests pass on dynalite", name,
                         f"{r['passed']} passed / {r['failed']} failed",
                         _met(r["failed"] == 0)])  # fmt: skip
            if r.get("raw_race"):
                rows.append(["conditional writes atomic on dynalite", name,
                             f"max {r['raw_race']['max_winners_in_a_round']} winner per round",
                             _met(r["raw_race"]["ok"])])  # fmt: skip
    return "## Targets\n\n" + _table(["target", "run", "measured", "met"], rows)


NOTES = """## Notes: method and what limits the figures

- **Lease model v2.** Each worker holds one liveness lease (its `WORKER#<id>` item), renewed
  every heartbeat whatever it holds; connection items carry the owner and an epoch (the fence)
  and are written only on acquire / release, STOP, checkpoint (at most every
  CHECKPOINT_SECONDS, 600 s, when advanced) and error notes. The v1 figures shown beside the v2
  ones (one lease per connection, renewed every heartbeat) are labelled as such and come from
  the last v1 run of this bench (RESULTS.md of commit eedcb49) and bench/scale_v1.json.
- **The embedded backend is the bottleneck, not wsfleet.** moto runs in one process behind one
  global lock (wsfleet_local.backend), so every DynamoDB and SQS call of every process is
  serialised; a chain of N writes (a drain, a takeover of N connections) costs N x 15-20 ms
  here, while DynamoDB runs them concurrently (16 I/O threads per worker). SQS is slow there
  too: a SendMessageBatch of 10 took about 32 ms, so the 100 hints of a 100-connection
  hand-off take about a third of a second to send, one batch after another.
- **Runs named `-dynalite`** keep the tables on dynalite 4.0.0 (node, concurrent) while SQS,
  the simulator, the Lambdas and the workers are unchanged: issue #12's K = 100 crash and
  hand-off targets are judged on them. dynalite has no Streams, so they cannot measure STOP.
- **Crash failover follows the worker lease by design**: the dead worker's last renewal
  happened 0-1 heartbeat before the kill, so its lease expires lease - U(0, heartbeat) after
  it. The reconciler finds the worker lapsing (gsi_workers, BatchGetItem of worker items),
  claims the hinting once, lists its connections from gsi_owner and sends their hints delayed
  to land in the lease's last second; the peer that receives one waits out the rest and takes
  over at the expiry (killing the dead worker's item first, one conditional write by the
  first taker); then one connect and the replay from the last checkpoint.
- **K = 100 on moto** (crash-medium-100, crash-default-100, handoff-default-100) is not what
  issue #12's targets are judged on: the 100 takeovers (each a consistent read of the dead
  worker's item, a conditional update, a connect) and 100 hint receives queue behind one another
  and behind everything else on the one serialised moto server. The same runs on dynalite
  (`-dynalite`) are the targets' runs.
- **Coordination cost at time compression 2.5, not 10.** At 10 (lease 2 s, fence 1.8 s after a
  renewal) the worker's lease renewals on the loaded moto server (load average up to 6 from
  other sessions) ran up to 2.7 s late at 1,000 connections: the worker self-fenced and started
  over under a new id several times in the window, which measured a recovery, not a steady
  state (the step reports `steady_state` and is only met with it). At 2.5 (lease 8 s) the run
  was steady.
- **Graceful hand-off of K connections** is K releases (each with the final checkpoint), K hints
  and K acquires by the peers, then K connects and the replay of what the giver did not store.
  On moto those are serialised conditional writes, so the last connection of 100 waits for all
  of them. On dynalite the hand-off stage tables under section 2 time each step per connection
  (issue #26): the giver closes every socket within about 0.05 s; its releases and the takers'
  acquires (one conditional write each, concurrent) are the largest coordination steps, both
  limited by the one dynalite process and the workers' Python sharing two cores; the hint
  itself (sent -> seen) is a few tens of ms since the poller frees a hint's place when its own
  acquire ends. At 20 frames/s the takers' message writes (each new session replays about a
  second of frames) are most of the figure on a loaded machine. Issue #26's target (p99 <= 0.5
  s to the first stored frame) is not met here; docs/handoff.md section 1 has the A/B runs.
- **STOP without the control channel** (`WORKER_CONTROL_CHANNEL=false`) is noticed by the
  worker's sweep: every WORKER_SWEEP_SECONDS it queries gsi_owner for its own connections
  (desired_state is projected), confirms a STOPPED one with a consistent read and closes it.
  Bound: the sweep interval plus the index's propagation and the close.
- **Request cost.** 5a counts every request of the worker *and* of the Lambdas (router,
  reconciler, notifier: each behind the proxy under its own label) to the connections table,
  time-compressed (see 5a). The reconciler's reads are per pass, not per connection: at one
  worker they are spread over 1,000 connections, in a larger fleet over more (its 16
  gsi_unowned shard queries are per fleet). 5b is counted at the proxy for the worker only.
- **Capacity** uses bench/worker_capacity.py as is: one worker process, its own backend and
  simulator; RSS per connection is (RSS at N - RSS idle) / N; "renew lateness" is the worker
  lease renewal's (`RenewLatenessMs`: one renewal per heartbeat for all N connections).
- **Chaos suite** (tests/chaos, not a benchmark): see the report of `make test`; it prints the
  seed, the events and the invariant figures of each run.
"""


#: What `make sam-local` measured (containers/tests, written with WSFLEET_FIGURES=this path).
CONTAINERS_JSON = Path(__file__).with_name("containers.json")


def _mb(size: Any) -> str:
    return f"{size / 1e6:.0f} MB" if isinstance(size, int | float) else "-"


def _containers_section() -> str:
    """Section 10, from bench/containers.json (not part of `python -m bench`'s own run)."""
    if not CONTAINERS_JSON.exists():
        return ""
    c = json.loads(CONTAINERS_JSON.read_text())
    parts = [
        "## 10. In containers: images, cold starts, the worker image (issue #24)", "",
        f"Measured by `{c.get('command', 'make sam-local')}` (docs/sam-local.md) at "
        f"{c.get('measured_at', '?')}, commit {c.get('commit', '?')}, load average "
        f"{c.get('load_average_at_start')} at start, {c.get('load_average_at_end')} at end: "
        "one run, on stand-in base images built here (Debian 12), Docker "
        f"{c.get('docker_version', '?')}; not by `python -m bench`.", "",
        _table(["image", "size"], [(f"`{name}`", _mb(size))
                                   for name, size in sorted(c.get("image_bytes", {}).items())]),
        "",
        "Cold start: the first `sam local invoke` of each function (every invoke is a new "
        "container). *wall* is the whole command (SAM CLI start, container creation with the "
        "layer, runtime start, import, the call); *in container* is the emulator's REPORT "
        "Duration, from the invoke reaching the runtime to the answer, imports included. The "
        "reconciler's sample runs passes until its 60 s timeout nears, by design: its figure is "
        "that run, not a cold start.", "",
        _table(["function", "sample", "wall", "in container"],
               [(name, f"`{r['event']}`", _s(r.get("wall_seconds")),
                 _ms(r.get("duration_ms")) if r.get("duration_ms") is not None else "-")
                for name, r in sorted(c.get("cold_start", {}).items())]),
        "",
        "The worker image (`wsfleet-worker:sam-local`, run as the task definition runs it, in a "
        "local fleet with lease 4 s, heartbeat 1 s, drain timeout 10 s):", "",
        _table(["what", "seconds"], [
            ("`docker run` + START -> first frame stored in the messages table",
             _s(c.get("docker_run_to_first_frame_seconds"))),
            ("`docker stop` returned (drain, release, exit 0)", _s(c.get("docker_stop_seconds"))),
            ("`docker stop` -> a host worker owns the connection (hand-off)",
             _s(c.get("docker_stop_to_new_owner_seconds"))),
            ("`docker kill` -> a host worker owns the connection (lease lapse)",
             _s(c.get("docker_kill_to_new_owner_seconds"))),
            ("worker image build (cached layers reused)", _s(c.get("worker_image_build_seconds"))),
        ]),
    ]
    return "\n".join(parts)


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
            "dead worker's *worker lease* runs out (expected: lease minus up to one heartbeat; "
            "connection items have no expiry in v2); the reconciler's early hints land in the "
            "lease's last second (SQS DelaySeconds is whole seconds, rounded down) and the peers "
            "that receive them take over at the expiry. Issue #12's target is the K = 100 run "
            "on dynalite tables. Rows marked *+ exit event* (issue #14) deliver the killed "
            "process's ECS task state change event to the task exit function, as the template's "
            "EventBridge rule does: it kills the worker lease at once (a fenced write) and hints "
            "every connection, so peers take over without waiting for the lease.",
            _results(document, "crash"), kind="failover"),
        _latency_section(
            "## 2. Graceful hand-off (SIGTERM a worker holding K connections)\n\n"
            "The worker hands each connection to a peer: make-before-break where the stream "
            "has a seq (PREPARE, the taker's own session, READY, one transfer write, COMMIT; "
            "docs/handoff.md section 2), else it closes the socket, writes the final "
            "checkpoint with the release and sends a hint, and the peer acquires at once (no "
            "expiry, no reconcile pass). Issue #12's target is the K = 100 run on dynalite "
            "tables; issue #26's (first frame stored by the taker) is in the stage tables "
            "below.",
            _results(document, "handoff"), kind="failover"),
        _latency_section(
            "## 3. STOP latency (API STOP -> upstream socket closed)\n\n"
            "Control channel: DynamoDB Streams (local poller every 150 ms) -> STOP notifier -> the "
            "owner's control queue -> the session closes. Fallback "
            "(`WORKER_CONTROL_CHANNEL=false`): the worker's sweep (every WORKER_SWEEP_SECONDS, "
            "gsi_owner) finds the connection STOPPED and closes it.",
            _results(document, "stop"), kind="stop"),
        _loss_section(document),
        _cost_section(document),
        _capacity_section(document),
        _flood_section(document),
        _throughput_section(document),
        _sinks_section(document),
        _sink_replay_section(document),
        _shapes_section(document),
        _handoff_modes_section(document),
        _rebalance_section(document),
        _reconcile_section(document),
        _compat_section(document),
        _scale_section(document),
        _containers_section(),
        NOTES.strip(),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"
