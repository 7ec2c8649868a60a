"""Upstream shapes through a crash and a hand-off: lost frames and the gap the fleet reports.

``python -m bench --only shapes``. One stream per simulator shape on a local fleet
(:class:`wsfleet_local.fleet.LocalFleet`, short lease profile):

==============  ===========================================  ============================
stream          upstream (simulator shape)                   connection options (#13)
==============  ===========================================  ============================
``plain``       replays from ``?from_seq=``                  defaults (resume ``query``)
``auth``        ``header_auth``: 401 without the header       credential by reference (a
                                                             Secrets Manager secret) in
                                                             ``Authorization``
``subscribe``   waits for a JSON subscribe message, replays  ``subscribe`` message,
                from its ``from_seq``                        resume ``subscribe``
``live_only``   ignores ``from_seq``: live frames only       resume ``none``
==============  ===========================================  ============================

Sequence: every stream on worker 0; two peers join; worker 0 is SIGKILLed (crash: its
connections wait for its worker lease to lapse); once all four flow again a fourth worker joins
and the two peers get SIGTERM (hand-off: they release, the new one acquires at once); then
every stream is STOPped (final checkpoints) and audited. Per stream: frames lost (seqs between
the first and the last stored that are not stored) and the gap the record reports
(``resume_gaps``, ``gap_frames``; the totals the worker stored with ``note_gap``).

Expected: the replaying shapes lose nothing and report no gap; ``live_only`` loses what was
produced while nobody listened, and reports exactly that: a takeover of a stream whose
upstream cannot replay measures from the highest seq already stored, not from the record's
checkpoint, because the dead owner may have stored frames above its last checkpoint (counting
them would over-report) or written no checkpoint at all (measuring from 0 reported nothing:
the undercount this bench was written to catch). What could still differ: a frame the dead
owner had in flight when it was killed, landed *below* a later one (a hole under the highest
stored seq), which is lost but not part of the gap.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from .fleet_bench import Profile, fleet_for_bench, stop_all, timings_for
from .harness import aws_client, by_stream, records_by_id
from .waiting import WaitTimeout as BenchTimeout, wait_until

__all__ = ["SHAPES", "lost_seqs", "run_shapes"]

RATE = 20.0
SECRET_PREFIX = "wsfleet/"
#: stream id -> (simulator shape, upstream options without the credential reference)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("plain", {}),
    "auth": ("header_auth", {}),
    "subscribe": ("subscribe", {"subscribe": {"op": "subscribe", "from_seq": "{{from_seq}}"},
                                "resume": "subscribe"}),
    "live_only": ("live_only", {"resume": "none"}),
}


def _start(fleet: Any, run_id: str) -> list[str]:
    """Shape the simulator's streams and write the STARTs (the router's store write + hint;
    the credential reference is parsed with this run's prefix)."""
    from wsfleet.hint_sender import HintSender
    from wsfleet.hints import Hint
    from wsfleet.store import DynamoDBLeaseStore
    from wsfleet.upstream_options import parse_upstream_options

    secrets = aws_client("secretsmanager", fleet.endpoint_url)
    token = f"bench-{uuid.uuid4().hex}"
    arn = secrets.create_secret(Name=f"{SECRET_PREFIX}{run_id}", SecretString=token)["ARN"]
    prefix = arn.split(":secret:")[0] + ":secret:" + SECRET_PREFIX
    store = DynamoDBLeaseStore(
        aws_client("dynamodb", fleet.dynamodb_endpoint_url), fleet.resources.connections_table
    )
    hints = HintSender(aws_client("sqs", fleet.endpoint_url), fleet.resources.hint_queue_url)
    simulator = fleet.simulator
    ids = []
    for name, (shape, raw) in SHAPES.items():
        stream_id = f"{name}-{run_id}"
        options = dict(raw)
        if shape == "header_auth":
            simulator.set_shape(stream_id, shape, header="Authorization", value=f"Bearer {token}")
            options["credential"] = {"ref": arn, "header": "Authorization",
                                     "format": "Bearer {{secret}}"}
        else:
            simulator.set_shape(stream_id, shape)
        upstream = parse_upstream_options(options, secret_prefixes=(prefix,))
        record = store.start(stream_id, simulator.url_for(stream_id), upstream=upstream).record
        hints.send(Hint(record.pk))
        ids.append(stream_id)
    return ids


def _flowing_since(fleet: Any, ids: list[str], since: float) -> bool:
    grouped = by_stream(fleet.simulator.sessions())
    return all(
        any(s.opened_at > since and s.first_frame_at for s in grouped.get(i, [])) for i in ids
    )


def lost_seqs(seqs: list[int], upto: int) -> list[int]:
    """Seqs from the lowest stored up to ``upto`` that are not stored."""
    have = set(seqs)
    first = min(have) if have else 1
    return [s for s in range(first, upto + 1) if s not in have]


def run_shapes(run_dir: Path) -> dict[str, Any]:
    from wsfleet.messages import MessageStore
    from wsfleet.record import connection_pk

    timings = timings_for(Profile.SHORT, max_connections=100)
    run_id = uuid.uuid4().hex[:6]
    result: dict[str, Any] = {
        "benchmark": "shapes",
        "settings": {"lease_seconds": timings.lease_seconds,
                     "heartbeat_seconds": timings.heartbeat_seconds,
                     "checkpoint_seconds": timings.checkpoint_seconds,
                     "frames_per_second_per_stream": RATE, "workers": "1 + 2, then 1"},
    }
    with fleet_for_bench(workers=1, timings=timings, rate=RATE, run_dir=run_dir,
                         worker_env={}) as plain:
        fleet = plain.fleet
        ids = _start(fleet, run_id)
        began = time.time() - 1
        wait_until(lambda: _flowing_since(fleet, ids, began), timeout=60, interval=0.5,
                   message="every shape streaming on worker 0")
        fleet.add_worker()
        fleet.add_worker()
        time.sleep(2 * timings.heartbeat_seconds + 2)
        try:
            crashed_at = time.time()
            fleet.kill_worker(0, signal.SIGKILL)
            wait_until(lambda: _flowing_since(fleet, ids, crashed_at),
                       timeout=timings.lease_seconds * 2 + 60, interval=0.25, message="takeover")
            time.sleep(2 * timings.heartbeat_seconds + 2)
            fleet.add_worker()
            handed_at = time.time()
            fleet.kill_worker(1, signal.SIGTERM)
            fleet.kill_worker(2, signal.SIGTERM)
            wait_until(lambda: _flowing_since(fleet, ids, handed_at), timeout=60,
                       interval=0.25, message="hand-off")
            time.sleep(2 * timings.heartbeat_seconds + 2)
            stop_all(fleet, ids, timeout=120)
        except BenchTimeout as exc:
            result["error"] = str(exc)
            return result
        messages = MessageStore(
            aws_client("dynamodb", fleet.dynamodb_endpoint_url), fleet.resources.messages_table
        )
        records = records_by_id(fleet)
        sessions = by_stream(fleet.simulator.sessions())
        per_shape: dict[str, Any] = {}
        for name, stream_id in zip(SHAPES, ids, strict=True):
            record = records[stream_id]
            seqs = [int(i["seq"]) for i in messages.read_all(connection_pk(stream_id))
                    if i.get("seq") is not None]
            lost = lost_seqs(seqs, record.last_seq)
            upstream_sessions = sessions.get(stream_id, [])
            per_shape[name] = {
                "upstream_sessions": len(upstream_sessions),
                "stored": len(seqs),
                "checkpoint": record.last_seq,
                "lost": len(lost),
                "resume_gaps": record.resume_gaps,
                "gap_frames": record.gap_frames,
                "auth_rejects": fleet.simulator.auth_rejects(stream_id),
            }
        result["shapes"] = per_shape
        replaying = [per_shape[n] for n in ("plain", "auth", "subscribe")]
        live = per_shape["live_only"]
        result["target"] = ("plain/auth/subscribe: 0 lost, 0 gap; live_only: lost == gap "
                            "frames, 2 gapped resumes")
        result["target_met"] = (
            all(s["lost"] == 0 and s["gap_frames"] == 0 for s in replaying)
            and live["lost"] == live["gap_frames"] > 0
        )
        print(json.dumps(per_shape, indent=1))
    return result
