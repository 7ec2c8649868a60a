"""The API's view of a connection: pure functions of a record, its owner's worker item and ``now``.

One definition for every reader: the router answers with :func:`connection_view`, and the CLI
builds its ``wsfleet status`` rows from the same view, whether it got it from the API or
computed it from a scan of the table (``--table``). No I/O and no clock here: callers pass
``now``.

A connection carries no expiry of its own (lease model v2): it is alive while its owner's
worker lease is, so ``owner`` is that worker's item (None when the connection is free, or when
the item is gone) and the lease's state and time left come from
:func:`wsfleet.lease.lease_state` and :func:`wsfleet.lease.lease_expires_in_ms`.

Upstream URLs are secrets-bearing: a view shows ``ws_url`` through
:func:`wsfleet.upstream_url.redact_url` (query values masked) and the upstream options through
:meth:`wsfleet.upstream_options.UpstreamOptions.to_view` (header values masked).
"""

from __future__ import annotations

from typing import Any

from . import lease as lease_rules
from .record import ConnectionRecord, WorkerRecord
from .upstream_url import redact_url

__all__ = ["connection_view", "lease_view"]


def lease_view(record: ConnectionRecord, owner: WorkerRecord | None, now: int) -> dict[str, Any]:
    """The ``lease`` object of a connection view: ``{"state", "owner", "epoch",
    "expires_in_ms"}``; ``owner`` is the worker item of ``record.lease_owner``."""
    return {
        "state": lease_rules.lease_state(record, owner, now).value,
        "owner": record.lease_owner or None,
        "epoch": record.lease_epoch,
        "expires_in_ms": lease_rules.lease_expires_in_ms(record, owner, now),
    }


def connection_view(
    record: ConnectionRecord, owner: WorkerRecord | None, now: int
) -> dict[str, Any]:
    """The JSON shape of one connection (``ws_url`` redacted: query values masked); ``owner``
    is the worker item of ``record.lease_owner`` (see :func:`lease_view`).

    The key order is the API's (docs/openapi.json); the router's response models document it.
    """
    return {
        "connection_id": record.connection_id,
        "desired_state": record.desired_state.value,
        "ws_url": redact_url(record.ws_url),
        "resume": record.resume,
        "last_seq": record.last_seq,
        "lease": lease_view(record, owner, now),
        "stop_reason": record.stop_reason,
        "last_error": record.last_error,
        # Crash-loop breaker: failures counted at checkpoint at_seq (FAILED once it tripped).
        "failures": {"count": record.failure_count, "at_seq": record.failure_seq},
        "upstream": record.upstream.to_view(),
        "gaps": {"resumes": record.resume_gaps, "frames": record.gap_frames},
        # At-least-once sinks: takeovers that inherited frames sent above the checkpoint, the
        # frames re-sent inside those windows, and the last window (seqs, inclusive).
        "replayed": {
            "takeovers": record.replayed_takeovers,
            "frames": record.replayed_frames,
            "from_seq": record.replayed_from_seq,
            "to_seq": record.replayed_to_seq,
        },
        "created_at_ms": record.created_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }
