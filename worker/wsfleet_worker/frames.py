"""Upstream frames and URLs: pure functions, no I/O.

* :func:`parse_frame` turns one WebSocket message into a :class:`Frame`: its sequence number
  (read from a configurable field, ``seq`` by default), what to store, and whether it was
  well-formed. It never raises: a frame the worker cannot understand is still stored (under a
  worker-local key) and counted, because dropping data silently is the one thing a feed
  recorder must not do.
* :func:`resume_url` adds ``<param>=<from_seq>`` to the upstream URL so a new session picks up
  exactly after the last durable checkpoint.
* :func:`redact_url` is what may appear in logs: upstream URLs often carry tokens in their
  query string or user-info.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit, urlunsplit

from wsfleet.messages import MAX_SEQ

__all__ = ["Frame", "FrameKind", "parse_frame", "redact_url", "resume_url"]


class FrameKind(StrEnum):
    """How a received frame was understood."""

    SEQUENCED = "sequenced"  # JSON object with a valid sequence number: stored under seq_sk
    NOSEQ = "noseq"  # JSON object without the sequence field: stored under a local key
    INVALID = "invalid"  # not JSON, not an object, or a malformed seq: stored, local key, counted


@dataclass(frozen=True, slots=True)
class Frame:
    """One upstream message as the worker will store it.

    ``data`` is the frame's ``data`` field (JSON-encoded if it is not a string), else the raw
    frame; binary frames that are not UTF-8 stay bytes.
    """

    kind: FrameKind
    data: str | bytes
    seq: int | None = None


def _parse_seq(value: Any) -> int | None:
    """A sequence number is a positive integer (or a string of digits) that fits 20 digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, int) and 1 <= value <= MAX_SEQ:
        return value
    return None


def _data_of(payload: dict[str, Any], text: str) -> str:
    if "data" not in payload:
        return text
    data = payload["data"]
    return data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))


def parse_frame(raw: str | bytes, seq_field: str = "seq") -> Frame:
    """Classify one received message. Never raises.

    >>> parse_frame('{"seq": 7, "data": "s1:7"}')
    Frame(kind=<FrameKind.SEQUENCED: 'sequenced'>, data='s1:7', seq=7)
    >>> parse_frame('{"data": "hello"}').kind, parse_frame("<<garbage>>").kind
    (<FrameKind.NOSEQ: 'noseq'>, <FrameKind.INVALID: 'invalid'>)
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Frame(FrameKind.INVALID, raw)
    else:
        text = raw
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return Frame(FrameKind.INVALID, text)
    if not isinstance(payload, dict):
        return Frame(FrameKind.INVALID, text)
    if seq_field not in payload:
        return Frame(FrameKind.NOSEQ, _data_of(payload, text))
    seq = _parse_seq(payload[seq_field])
    if seq is None:
        return Frame(FrameKind.INVALID, _data_of(payload, text))
    return Frame(FrameKind.SEQUENCED, _data_of(payload, text), seq)


def resume_url(ws_url: str, param: str, from_seq: int, *, enabled: bool = True) -> str:
    """``ws_url`` with ``param=from_seq`` appended to its query, existing parameters kept.

    Any earlier value of ``param`` is replaced; other parameters keep their exact original
    encoding (they may be signed tokens). The fragment is dropped: WebSocket URIs have none.
    With ``enabled=False`` (the record's ``resume`` flag) or an empty ``param`` the URL is
    returned without a fragment and otherwise untouched.

    >>> resume_url("wss://feed.example/s?token=a%2Bb&from_seq=3", "from_seq", 42)
    'wss://feed.example/s?token=a%2Bb&from_seq=42'
    >>> resume_url("ws://h/s", "from_seq", 1, enabled=False)
    'ws://h/s'
    """
    parts = urlsplit(ws_url)
    if not enabled or not param:
        return urlunsplit(parts._replace(fragment=""))
    kept = [
        pair
        for pair in parts.query.split("&")
        if pair and unquote_plus(pair.partition("=")[0]) != param
    ]
    kept.append(f"{quote(param, safe='')}={from_seq}")
    return urlunsplit(parts._replace(query="&".join(kept), fragment=""))


def redact_url(url: str) -> str:
    """The URL without user-info, query or fragment: safe to log.

    >>> redact_url("wss://user:secret@feed.example:8443/s?token=abc")
    'wss://feed.example:8443/s'
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable url>"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))
