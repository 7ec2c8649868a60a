"""Upstream frames and URLs: pure functions, no I/O.

* :func:`parse_frame` turns one WebSocket message into a :class:`Frame`: its sequence number
  (read from a configurable field, ``seq`` by default), what to store, and whether it was
  well-formed. It never raises: a frame the worker cannot understand is still stored (under a
  worker-local key) and counted, because dropping data silently is the one thing a feed
  recorder must not do.
* :func:`resume_url` adds ``<param>=<from_seq>`` to the upstream URL so a new session picks up
  exactly after the last durable checkpoint.

URLs that may appear in logs go through :func:`wsfleet.upstream_url.redact_url`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit, urlunsplit

from wsfleet.upstream_options import seq_at

__all__ = [
    "MAX_SAFE_SEQ",
    "Frame",
    "FrameKind",
    "parse_frame",
    "resume_url",
    "with_query_param",
]

#: The largest accepted sequence number: 2**53 - 1, the largest integer every JSON parser
#: represents exactly (I-JSON, RFC 7493). A larger seq cannot be told apart from its
#: neighbours by a JavaScript or float-based producer anyway, and 16 digits can never reach
#: Python's int-parsing digit limit. Sequence numbers start at 1 (0 is "nothing stored").
MAX_SAFE_SEQ = 2**53 - 1
_MAX_SEQ_DIGITS = len(str(MAX_SAFE_SEQ))


class FrameKind(StrEnum):
    """How a received frame was understood."""

    SEQUENCED = "sequenced"  # JSON object with a valid sequence number: stored under seq_sk
    NOSEQ = "noseq"  # JSON object without the sequence field: stored under a local key
    INVALID = "invalid"  # not JSON, not an object, or a bad seq: stored, local key, counted


@dataclass(frozen=True, slots=True)
class Frame:
    """One upstream message as the worker will store it.

    ``data`` is the frame's ``data`` field (compact JSON, non-ASCII kept as is, if it is not a
    string), else the raw frame; binary frames that are not UTF-8 stay bytes. ``reason`` says
    why an INVALID frame is invalid (``"not-utf8"``, ``"not-json"``, ``"not-object"``,
    ``"bad-seq"``, ``"seq-jump"``), for logs and metrics.
    """

    kind: FrameKind
    data: str | bytes
    seq: int | None = None
    reason: str = field(default="", compare=False)  # detail for logs, not identity


_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """``json.loads(text)``: the scanner straight away for a document with nothing around
    it (every frame of a well-behaved feed), ``json.loads`` for anything else (whitespace
    around it, trailing data, an error to raise). Per frame, loads' own layers of calls cost
    as much as the scan."""
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _parse_seq(value: Any) -> int | None:
    """A sequence number is an integer in ``1..MAX_SAFE_SEQ``, or a string of ASCII digits.

    The digit count is checked before ``int()``: a 5,000-digit string would raise ValueError
    (Python's int digit limit) and crash the session on every reconnect.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= _MAX_SEQ_DIGITS):
            return None
        value = int(value)
    if isinstance(value, int) and 1 <= value <= MAX_SAFE_SEQ:
        return value
    return None


def _storable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (DynamoDB strings must; lone surrogates do not).

    ASCII text (most frames) is answered without encoding a copy of it.
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _data_of(payload: dict[str, Any], text: str) -> str:
    """The frame's ``data`` field as stored, else the whole frame.

    Compact and unescaped (``ensure_ascii=False``): escaping made non-ASCII data up to six times
    larger, pushing frames well under the size limit past DynamoDB's 400 KB item limit. If the
    field cannot be stored as it is (a ``"\\ud800"`` escape decodes to a lone surrogate, which
    UTF-8 cannot encode; nesting too deep to re-encode), the raw frame is stored instead: it
    came off the wire as valid UTF-8.
    """
    if "data" not in payload:
        return text
    data = payload["data"]
    if not isinstance(data, str):
        try:
            data = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        except (ValueError, RecursionError):
            return text
    return data if _storable(data) else text


def parse_frame(
    raw: str | bytes,
    seq_field: str = "seq",
    *,
    highest_seq: int = 0,
    max_seq_jump: int | None = None,
    seq_pointer: str | None = None,
) -> Frame:
    """Classify one received message. Never raises, whatever ``raw`` holds.

    The accepted seq rule, both parts enforced here:

    * **absolute**: an integer (or string of ASCII digits) in ``1..MAX_SAFE_SEQ`` (2**53 - 1);
    * **relative**: with ``max_seq_jump`` set (``None`` or 0 turns it off) and ``highest_seq``
      (the session's highest seq seen, which starts at the checkpoint) above 0, a seq greater
      than ``highest_seq + max_seq_jump`` is refused. Without it a single bogus frame (seq
      9007199254740991, say) moves the checkpoint so far that every later genuine frame is a
      "duplicate" and the stream is jammed for good. A brand-new stream (checkpoint 0) takes
      its first seq unchecked: feeds may start anywhere.

    A frame failing either rule is INVALID: stored under a local key and counted, never
    dropped, and it does not move the checkpoint.

    ``seq_pointer`` (a connection's ``upstream.seq_pointer``, a JSON pointer such as
    ``/meta/seq``) reads the seq elsewhere than the top-level ``seq_field``; the frame itself
    must still be a JSON object.

    >>> parse_frame('{"seq": 7, "data": "s1:7"}')
    Frame(kind=<FrameKind.SEQUENCED: 'sequenced'>, data='s1:7', seq=7, reason='')
    >>> parse_frame('{"data": "hello"}').kind, parse_frame("<<garbage>>").kind
    (<FrameKind.NOSEQ: 'noseq'>, <FrameKind.INVALID: 'invalid'>)
    >>> parse_frame('{"seq": "' + "9" * 5000 + '"}').reason
    'bad-seq'
    >>> parse_frame('{"seq": 2000000, "data": "x"}', highest_seq=10, max_seq_jump=1000).reason
    'seq-jump'
    >>> parse_frame('{"meta": {"n": 5}, "data": "x"}', seq_pointer="/meta/n").seq
    5
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Frame(FrameKind.INVALID, raw, reason="not-utf8")
    elif _storable(raw):
        text = raw
    else:  # not from websockets (text frames are valid UTF-8), but never raise
        return Frame(FrameKind.INVALID, raw.encode("utf-8", "surrogatepass"), reason="not-utf8")
    try:
        payload = _loads(text)
    except (ValueError, RecursionError):  # ValueError covers numbers past the digit limit
        return Frame(FrameKind.INVALID, text, reason="not-json")
    if not isinstance(payload, dict):
        return Frame(FrameKind.INVALID, text, reason="not-object")
    data = _data_of(payload, text)
    if seq_pointer is None:
        found, raw_seq = seq_field in payload, payload.get(seq_field)
    else:
        found, raw_seq = seq_at(payload, seq_pointer)
    if not found:
        return Frame(FrameKind.NOSEQ, data)
    seq = _parse_seq(raw_seq)
    if seq is None:
        return Frame(FrameKind.INVALID, data, reason="bad-seq")
    if max_seq_jump and highest_seq > 0 and seq > highest_seq + max_seq_jump:
        return Frame(FrameKind.INVALID, data, reason="seq-jump")
    return Frame(FrameKind.SEQUENCED, data, seq)


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
    if not enabled or not param:
        return urlunsplit(urlsplit(ws_url)._replace(fragment=""))
    return with_query_param(ws_url, param, str(from_seq))


def with_query_param(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` (value percent-encoded) replacing any earlier ``name``;
    other parameters keep their exact encoding, the fragment is dropped.

    >>> with_query_param("wss://h/s?a=1&token=old", "token", "a b/c")
    'wss://h/s?a=1&token=a%20b%2Fc'
    """
    parts = urlsplit(url)
    kept = [p for p in parts.query.split("&") if p and unquote_plus(p.partition("=")[0]) != name]
    kept.append(f"{quote(name, safe='')}={quote(value, safe='')}")
    return urlunsplit(parts._replace(query="&".join(kept), fragment=""))
