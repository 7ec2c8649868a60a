"""wsfleet shared package: the connection record, lease rules and store, hints and settings.

Shipped as the SAM layer ``SharedLayer`` and installed into the worker image from the same
source. Handlers and the worker import it; nothing here knows which of them is calling.
"""

from __future__ import annotations

from typing import Any

from .lazy_exports import resolve_export

# Exports resolve lazily: importing wsfleet.exceptions (e.g. from the simulator) must not drag
# boto3 and botocore in, which costs ~12 MB and 0.2 s per process.
_EXPORTS = {
    "ConfigurationError": "exceptions",
    "ConnectionNotFound": "exceptions",
    "ConnectionStopped": "exceptions",
    "LeaseConflict": "exceptions",
    "LeaseError": "exceptions",
    "LeaseLost": "exceptions",
    "StoreError": "exceptions",
    "WsfleetError": "exceptions",
    "Hint": "hints",
    "HintSender": "hint_sender",
    "Lease": "lease",
    "ConnectionRecord": "record",
    "DesiredState": "record",
    "WorkerRecord": "record",
    "connection_pk": "record",
    "Settings": "settings",
    "LeaseStore": "store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return resolve_export(__name__, _EXPORTS, name)
