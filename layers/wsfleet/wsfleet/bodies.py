"""Decoding queue message bodies that anyone with SendMessage rights could have written.

Hints and STOP commands are tiny flat JSON objects. Both parsers decode through
:func:`decode_object`, which is bounded and raises nothing but :class:`ValueError`, so one
hostile message (deep nesting, megabytes, a 5,000-digit number, lone surrogates) can never
raise out of a parser and end the task that consumes the queue (issue #11, finding 2).

:func:`excerpt` is what goes into a log line about such a body: never the whole of it.
"""

from __future__ import annotations

import json
from typing import Any

from .record import CONNECTION_PREFIX, is_valid_connection_id

__all__ = [
    "MAX_BODY_CHARS",
    "MAX_EPOCH",
    "connection_pk_field",
    "decode_object",
    "epoch_field",
    "excerpt",
    "json_nesting_depth",
]

#: Longest body accepted. Real hints and STOPs are under 200 characters (a 128-character id
#: plus a few keys); the cap keeps decoding cheap and every number short.
MAX_BODY_CHARS = 1024
#: Largest epoch accepted: DynamoDB stores it as a number, epochs count acquisitions.
MAX_EPOCH = 2**53
_EXCERPT_CHARS = 80


def excerpt(body: object, limit: int = _EXCERPT_CHARS) -> str:
    """A short, printable start of a body for logs: never the whole hostile body.

    >>> excerpt("[" * 5000).endswith("... (5000 chars)"), len(excerpt("[" * 5000)) < 120
    (True, True)
    """
    if not isinstance(body, str):
        return f"<{type(body).__name__}>"
    head = repr(body[:limit])
    return head if len(body) <= limit else f"{head}... ({len(body)} chars)"


def json_nesting_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting outside JSON string literals: a linear scan, no recursion.

    Lets callers refuse deep nesting before json's recursive decoder sees it (it raises
    RecursionError, not ValueError, past about 1,000 levels).

    >>> json_nesting_depth('{"a": [1, "[[["]}'), json_nesting_depth("[" * 5000)
    (2, 5000)
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _flat(body: str) -> bool:
    """True if no JSON array or object sits inside the top-level value."""
    return json_nesting_depth(body) <= 1


def decode_object(body: object, *, what: str) -> dict[str, Any]:
    """The JSON object in ``body``; ValueError for anything else, whatever the input.

    >>> decode_object('{"pk": "CONN#a"}', what="hint")
    {'pk': 'CONN#a'}
    >>> decode_object("[" * 900, what="hint")
    Traceback (most recent call last):
    ...
    ValueError: hint is nested JSON
    """
    if not isinstance(body, str):
        raise ValueError(f"{what} body is not text")
    if len(body) > MAX_BODY_CHARS:
        raise ValueError(f"{what} body is too long ({len(body)} chars)")
    if not _flat(body):
        raise ValueError(f"{what} is nested JSON")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit; belt+braces
        raise ValueError(f"{what} is not JSON: {type(exc).__name__}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{what} is not a JSON object")
    return payload


def connection_pk_field(payload: dict[str, Any], *, what: str) -> str:
    """``payload["pk"]`` if it is a valid connection key (``CONN#`` + a valid id)."""
    pk = payload.get("pk")
    if (
        not isinstance(pk, str)
        or not pk.startswith(CONNECTION_PREFIX)
        or not is_valid_connection_id(pk.removeprefix(CONNECTION_PREFIX))
    ):
        raise ValueError(f"{what} has no valid connection pk")
    return pk


def epoch_field(payload: dict[str, Any], *, what: str, required: bool) -> int | None:
    """``payload["epoch"]`` as a lease epoch (an int in 0..MAX_EPOCH; bools refused)."""
    epoch = payload.get("epoch")
    if epoch is None and not required:
        return None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"{what} has no valid epoch")
    return epoch
