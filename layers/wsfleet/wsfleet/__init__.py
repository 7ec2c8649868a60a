"""wsfleet shared package: the connection record, lease rules and store, hints and settings.

Shipped as the SAM layer ``SharedLayer`` and installed into the worker image from the same
source. Handlers and the worker import it; nothing here knows which of them is calling.
"""

from .exceptions import (
    ConfigurationError,
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseError,
    LeaseLost,
    StoreError,
    WsfleetError,
)
from .hints import Hint, HintSender
from .lease import Lease
from .record import ConnectionRecord, DesiredState, WorkerRecord, connection_pk
from .settings import Settings
from .store import LeaseStore

__all__ = [
    "ConfigurationError",
    "ConnectionNotFound",
    "ConnectionRecord",
    "ConnectionStopped",
    "DesiredState",
    "Hint",
    "HintSender",
    "Lease",
    "LeaseConflict",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "Settings",
    "StoreError",
    "WorkerRecord",
    "WsfleetError",
    "connection_pk",
]
