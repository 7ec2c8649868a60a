"""Package exports resolved on first use (PEP 562), for ``wsfleet`` and ``wsfleet_worker``.

A package's ``__init__`` names its exports and the module each lives in; importing the package
then imports none of them, so a light entry point (the worker's health check, the simulator
importing :mod:`wsfleet.exceptions`) does not pay for boto3 and botocore.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["resolve_export"]


def resolve_export(package: str, exports: Mapping[str, str], name: str) -> Any:
    """The body of a package's ``__getattr__``: ``name`` from its module in ``exports``
    (relative to ``package``), imported now; AttributeError for a name not exported."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", package), name)
