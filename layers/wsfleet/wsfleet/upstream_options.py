"""Per-connection upstream options: how a worker talks to one upstream beyond its URL.

A START may carry an ``upstream`` object. Everything in it is optional; an absent object (or
``{}``) means today's dialogue: connect to ``ws_url`` with ``?<RESUME_PARAM>=<from_seq>``
appended, read JSON frames whose sequence number is the top-level ``SEQ_FIELD``.

.. code-block:: json

    {"headers": {"X-Client": "acme"},
     "subprotocols": ["feed.v2"],
     "credential": {"ref": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/feed",
                    "header": "Authorization", "format": "Bearer {{secret}}"},
     "subscribe": {"op": "subscribe", "channel": "trades", "from": "{{from_seq}}"},
     "seq_pointer": "/meta/seq",
     "resume": "subscribe",
     "normal_close": "reconnect"}

* ``headers``: extra handshake headers, a bounded set. Never ``Host``, hop-by-hop headers or
  the ``Sec-WebSocket-*`` family (the handshake's own), and never ``Authorization``,
  ``Proxy-*`` or ``Cookie``: header values are stored in plain text in DynamoDB,
  so anything secret goes through ``credential``.
* ``subprotocols``: offered in ``Sec-WebSocket-Protocol``.
* ``credential``: a *reference* to a secret (a Secrets Manager secret ARN or an SSM parameter
  ARN, under one of the deployment's ``UPSTREAM_SECRET_PREFIXES``) and where its value goes:
  a ``header`` (rendered through ``format``), a ``query`` parameter, or the ``subscribe``
  message's ``{{secret}}`` placeholder. ``json_key`` picks one key of a JSON secret. The record
  stores the reference only; the worker resolves it at each connect.
* ``subscribe``: one message sent right after the handshake, a JSON object or array (sent as
  compact JSON) or a string (sent as is). Placeholders: ``{{from_seq}}`` (the resume position;
  a JSON string that is exactly the placeholder becomes a number) and ``{{secret}}``.
* ``seq_pointer``: where a frame's sequence number is, as a JSON pointer (RFC 6901); the
  default is ``/<SEQ_FIELD>``. Spelling the default out is the same as leaving it out (it is
  not stored), so a restart that adds or drops ``"seq_pointer": "/seq"`` keeps ``last_seq``.
* ``resume``: how a new session asks to resume: ``query`` (``resume_param``, default
  ``RESUME_PARAM``), ``subscribe`` (the ``{{from_seq}}`` in the subscribe message) or ``none``
  (the upstream cannot replay: a failover loses what was sent while nobody listened, and the
  worker reports that gap, see :func:`resume_gap`).
* ``normal_close``: what a close from the upstream with 1000 or 1001 means. ``reconnect``
  (the default): the same as any other close, back off and resume (servers close routinely:
  1001 on their deploys, 1000 at session limits or to force re-authentication). ``final``:
  the stream is over, the connection ends ``STOPPED`` with ``stop_reason`` ``upstream_closed``
  (for finite feeds: a replay, a file, a match that ends).
* ``handoff``: how a planned hand-off (a SIGTERM drain, a rebalancing move) moves the stream
  to another worker. ``overlap`` (make-before-break, the default): the taker opens its own
  session and buffers before the giver closes, so a live-only stream loses nothing; it needs
  frames that carry a seq (else it falls back to ``break``) and an upstream that allows two
  sessions for a moment. ``break``: the giver closes, then the taker connects (one session at
  a time; a live-only stream loses the hand-off time). See docs/handoff.md.

Parsing is strict (every field bounded, unknown keys refused) and raises
:class:`~wsfleet.exceptions.InvalidUpstreamOptions`, whose ``field`` names the offending
path, so the router answers 422 with it. This module is pure: no I/O, no AWS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .exceptions import InvalidUpstreamOptions

__all__ = [
    "FROM_SEQ_PLACEHOLDER",
    "MAX_HEADERS",
    "MAX_HEADER_VALUE_LENGTH",
    "MAX_SUBPROTOCOLS",
    "MAX_SUBSCRIBE_BYTES",
    "SECRET_PLACEHOLDER",
    "Credential",
    "CredentialPlacement",
    "HandoffMode",
    "InvalidUpstreamOptions",
    "ResumeMode",
    "UpstreamOptions",
    "parse_upstream_options",
    "render_subscribe",
    "resume_gap",
    "seq_at",
]

MAX_HEADERS = 16
MAX_HEADER_VALUE_LENGTH = 1024
MAX_SUBPROTOCOLS = 8
MAX_TOKEN_LENGTH = 64
#: Half the router's 16 KiB body cap (functions/router/app.py MAX_BODY_BYTES): a message at
#: this limit still fits in a START body beside the URL, headers and a JSON-escaped copy of
#: itself, so a too-large message gets this field's 422, never the whole body's 413.
MAX_SUBSCRIBE_BYTES = 8 * 1024
MAX_POINTER_LENGTH = 256
MAX_POINTER_SEGMENTS = 16
MAX_REF_LENGTH = 2048
MAX_FORMAT_LENGTH = 256
MAX_JSON_KEY_LENGTH = 128

FROM_SEQ_PLACEHOLDER = "{{from_seq}}"
SECRET_PLACEHOLDER = "{{secret}}"

#: RFC 7230 token: header names, subprotocols, query parameter names.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Header values: visible ASCII, space and tab; no CR/LF (header injection).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_KNOWN_PLACEHOLDERS = frozenset({"from_seq", "secret"})
_SECRET_ARN = re.compile(
    r"arn:aws(?:-cn|-us-gov|-iso|-iso-b)?:secretsmanager:[a-z0-9-]+:\d{12}:secret:[\w/+=.@-]+"
)
_PARAMETER_ARN = re.compile(
    r"arn:aws(?:-cn|-us-gov|-iso|-iso-b)?:ssm:[a-z0-9-]+:\d{12}:parameter/[\w/.-]+"
)

#: The handshake's own headers, hop-by-hop headers, and headers that would carry a secret in
#: plain text (those go through ``credential``).
_HANDSHAKE_HEADERS = frozenset(
    {
        "host", "connection", "upgrade", "keep-alive", "proxy-connection", "te", "trailer",
        "transfer-encoding", "content-length", "expect",
    }
)
_SECRET_HEADERS = frozenset({"authorization", "cookie"})


class ResumeMode(StrEnum):
    QUERY = "query"
    SUBSCRIBE = "subscribe"
    NONE = "none"


class HandoffMode(StrEnum):
    """How a planned hand-off moves a stream (docs/handoff.md section 3)."""

    OVERLAP = "overlap"  # make-before-break: two sessions for a moment, nothing lost
    BREAK = "break"  # break-before-make: the giver closes before the taker connects


class CredentialPlacement(StrEnum):
    HEADER = "header"
    QUERY = "query"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True)
class Credential:
    """A reference to a secret and where its value goes. Never the value itself."""

    ref: str
    placement: CredentialPlacement
    #: Header name (HEADER) or query parameter name (QUERY); "" for SUBSCRIBE.
    name: str = ""
    #: HEADER only: the header value, with ``{{secret}}`` where the secret goes.
    format: str = SECRET_PLACEHOLDER
    #: The secret is a JSON object; use this key's value.
    json_key: str | None = None

    @property
    def service(self) -> str:
        """``secretsmanager`` or ``ssm``: which API resolves :attr:`ref`."""
        return "ssm" if _PARAMETER_ARN.fullmatch(self.ref) else "secretsmanager"

    def render(self, secret: str) -> str:
        """The header value (HEADER) or the bare secret (QUERY, SUBSCRIBE)."""
        if self.placement is CredentialPlacement.HEADER:
            return self.format.replace(SECRET_PLACEHOLDER, secret)
        return secret

    def to_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"ref": self.ref}
        if self.placement is CredentialPlacement.SUBSCRIBE:
            item["subscribe"] = True
        else:
            item[str(self.placement)] = self.name
        if self.placement is CredentialPlacement.HEADER and self.format != SECRET_PLACEHOLDER:
            item["format"] = self.format
        if self.json_key is not None:
            item["json_key"] = self.json_key
        return item


@dataclass(frozen=True)
class UpstreamOptions:
    """Validated per-connection options (see the module docstring). The default instance is
    today's behaviour; ``None`` fields fall back to the fleet settings."""

    headers: tuple[tuple[str, str], ...] = ()
    subprotocols: tuple[str, ...] = ()
    credential: Credential | None = None
    #: The message text to send after the handshake, placeholders unrendered.
    subscribe: str | None = None
    #: ``subscribe`` is JSON (placeholders are rendered JSON-aware) rather than plain text.
    subscribe_is_json: bool = False
    #: JSON pointer of the sequence number; None: ``/<SEQ_FIELD>``.
    seq_pointer: str | None = None
    resume: ResumeMode = ResumeMode.QUERY
    #: QUERY only: the parameter; None: ``RESUME_PARAM``.
    resume_param: str | None = None
    #: ``normal_close: final``: a close with 1000/1001 ends the stream (else it reconnects).
    final_normal_close: bool = False
    #: ``handoff``: None is the default (``overlap`` where the frames carry a usable seq).
    handoff: HandoffMode | None = None

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_OPTIONS

    def pointer(self, default_seq_field: str) -> str:
        """The seq pointer in effect, given the fleet's ``SEQ_FIELD``."""
        if self.seq_pointer is not None:
            return self.seq_pointer
        return "/" + default_seq_field.replace("~", "~0").replace("/", "~1")

    def to_item(self) -> dict[str, Any]:
        """A plain map for the connection item (defaults left out; no tuples: DynamoDB's
        serializer takes lists). :meth:`from_item` reads it back."""
        item: dict[str, Any] = {}
        if self.headers:
            item["headers"] = {name: value for name, value in self.headers}
        if self.subprotocols:
            item["subprotocols"] = list(self.subprotocols)
        if self.credential is not None:
            item["credential"] = self.credential.to_item()
        if self.subscribe is not None:
            item["subscribe"] = self.subscribe
            item["subscribe_format"] = "json" if self.subscribe_is_json else "text"
        if self.seq_pointer is not None:
            item["seq_pointer"] = self.seq_pointer
        if self.resume is not ResumeMode.QUERY:
            item["resume"] = str(self.resume)
        if self.resume_param is not None:
            item["resume_param"] = self.resume_param
        if self.final_normal_close:
            item["normal_close"] = "final"
        if self.handoff is not None:
            item["handoff"] = str(self.handoff)
        return item

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None) -> UpstreamOptions:
        """Read back what :meth:`to_item` wrote. Stored options were validated at START, so
        this trusts their shape (a hand-edited item that breaks it fails here, loudly)."""
        if not item:
            return DEFAULT_OPTIONS
        cred = item.get("credential")
        credential = None
        if cred:
            if cred.get("subscribe"):
                placement, name = CredentialPlacement.SUBSCRIBE, ""
            elif "header" in cred:
                placement, name = CredentialPlacement.HEADER, str(cred["header"])
            else:
                placement, name = CredentialPlacement.QUERY, str(cred["query"])
            credential = Credential(
                ref=str(cred["ref"]),
                placement=placement,
                name=name,
                format=str(cred.get("format", SECRET_PLACEHOLDER)),
                json_key=None if cred.get("json_key") is None else str(cred["json_key"]),
            )
        subscribe = item.get("subscribe")
        return cls(
            headers=tuple((str(k), str(v)) for k, v in dict(item.get("headers") or {}).items()),
            subprotocols=tuple(str(p) for p in item.get("subprotocols") or ()),
            credential=credential,
            subscribe=None if subscribe is None else str(subscribe),
            subscribe_is_json=item.get("subscribe_format") == "json",
            seq_pointer=None if item.get("seq_pointer") is None else str(item["seq_pointer"]),
            resume=ResumeMode(item.get("resume", ResumeMode.QUERY)),
            resume_param=None if item.get("resume_param") is None else str(item["resume_param"]),
            final_normal_close=item.get("normal_close") == "final",
            handoff=None if item.get("handoff") is None else HandoffMode(str(item["handoff"])),
        )

    def to_view(self) -> dict[str, Any]:
        """The API's view: like :meth:`to_item`, but header values are masked (the same rule
        as ``ws_url``'s query values: they may be identifying even when not secret) and a
        JSON subscribe message is shown as JSON."""
        view = self.to_item()
        if self.headers:
            view["headers"] = {name: "***" for name, _ in self.headers}
        if self.subscribe is not None:
            view.pop("subscribe_format", None)
            if self.subscribe_is_json:
                view["subscribe"] = json.loads(self.subscribe)
        return view


DEFAULT_OPTIONS = UpstreamOptions()


# --------------------------------------------------------------------------- parsing
def parse_upstream_options(
    raw: object, *, secret_prefixes: tuple[str, ...], default_seq_field: str = "seq"
) -> UpstreamOptions:
    """Validate a START's ``upstream`` object. ``None`` or ``{}`` is the default.

    ``secret_prefixes`` are the ARN prefixes a credential reference must start with (the
    deployment's ``UPSTREAM_SECRET_PREFIXES``; the worker role may read only those). Empty
    means credentials by reference are turned off. ``default_seq_field`` is the fleet's
    ``SEQ_FIELD``: a ``seq_pointer`` that names it (``/seq``) is the default and is dropped,
    so the stored options, and the store's same-stream test on restart, see one spelling.

    >>> parse_upstream_options({"resume": "none"}, secret_prefixes=()).resume
    <ResumeMode.NONE: 'none'>
    >>> try:
    ...     parse_upstream_options({"headers": {"Host": "x"}}, secret_prefixes=())
    ... except InvalidUpstreamOptions as exc:
    ...     print(exc.field, "|", exc)
    upstream.headers | upstream.headers: Host is set by the handshake itself and may not be ...
    """
    if raw is None:
        return DEFAULT_OPTIONS
    obj = _object(raw, "upstream")
    _known_keys(
        obj,
        "upstream",
        {"headers", "subprotocols", "credential", "subscribe", "seq_pointer", "resume",
         "resume_param", "normal_close", "handoff"},
    )
    headers = _headers(obj.get("headers"))
    subprotocols = _subprotocols(obj.get("subprotocols"))
    subscribe, subscribe_is_json = _subscribe(obj.get("subscribe"))
    resume = _resume(obj.get("resume"))
    resume_param = obj.get("resume_param")
    if resume_param is not None:
        if resume is not ResumeMode.QUERY:
            raise InvalidUpstreamOptions(
                "resume_param applies only to resume: query", "upstream.resume_param"
            )
        resume_param = _token(resume_param, "upstream.resume_param")
    placeholders = _placeholders(subscribe) if subscribe is not None else set()
    if resume is ResumeMode.SUBSCRIBE and "from_seq" not in placeholders:
        raise InvalidUpstreamOptions(
            "resume: subscribe needs a subscribe message with a {{from_seq}} placeholder",
            "upstream.resume",
        )
    if resume is not ResumeMode.SUBSCRIBE and "from_seq" in placeholders:
        raise InvalidUpstreamOptions(
            "{{from_seq}} in the subscribe message needs resume: subscribe",
            "upstream.subscribe",
        )
    credential = _credential(obj.get("credential"), secret_prefixes)
    wants_secret = "secret" in placeholders
    gives_secret = (
        credential is not None and credential.placement is CredentialPlacement.SUBSCRIBE
    )
    if wants_secret != gives_secret:
        raise InvalidUpstreamOptions(
            "a {{secret}} placeholder in the subscribe message and credential.subscribe: true "
            "go together",
            "upstream.credential" if gives_secret else "upstream.subscribe",
        )
    if (
        credential is not None
        and credential.placement is CredentialPlacement.HEADER
        and any(name.lower() == credential.name.lower() for name, _ in headers)
    ):
        raise InvalidUpstreamOptions(
            f"header {credential.name} is set twice (headers and credential)",
            "upstream.credential.header",
        )
    pointer = None if obj.get("seq_pointer") is None else _pointer(obj["seq_pointer"])
    if pointer == DEFAULT_OPTIONS.pointer(default_seq_field):
        pointer = None
    return UpstreamOptions(
        headers=headers,
        subprotocols=subprotocols,
        credential=credential,
        subscribe=subscribe,
        subscribe_is_json=subscribe_is_json,
        seq_pointer=pointer,
        resume=resume,
        resume_param=resume_param,
        final_normal_close=_normal_close(obj.get("normal_close")),
        handoff=_handoff(obj.get("handoff")),
    )


def _normal_close(raw: object) -> bool:
    if raw is None or raw == "reconnect":
        return False
    if raw == "final":
        return True
    raise InvalidUpstreamOptions(
        "upstream.normal_close must be one of reconnect, final", "upstream.normal_close"
    )


def _handoff(raw: object) -> HandoffMode | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw in {mode.value for mode in HandoffMode}:
        return HandoffMode(raw)
    raise InvalidUpstreamOptions(
        "upstream.handoff must be one of overlap, break", "upstream.handoff"
    )


def _object(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise InvalidUpstreamOptions(f"{where} must be an object", where)
    return raw


def _known_keys(obj: Mapping[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise InvalidUpstreamOptions(
            f"{where} has unknown field(s) {', '.join(unknown[:5])}; known: "
            f"{', '.join(sorted(known))}",
            where,
        )


def _token(value: object, where: str) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise InvalidUpstreamOptions(
            f"{where} must be a token (letters, digits and !#$%&'*+.^_`|~-)", where
        )
    if len(value) > MAX_TOKEN_LENGTH:
        raise InvalidUpstreamOptions(f"{where} is longer than {MAX_TOKEN_LENGTH}", where)
    return value


def _header_name(value: object, where: str, *, secret_allowed: bool) -> str:
    name = _token(value, where)
    lower = name.lower()
    if lower in _HANDSHAKE_HEADERS or lower.startswith(("sec-websocket-", "proxy-")):
        raise InvalidUpstreamOptions(
            f"{name} is set by the handshake itself and may not be overridden", where
        )
    if lower in _SECRET_HEADERS and not secret_allowed:
        raise InvalidUpstreamOptions(
            f"{name} may carry a secret, and headers are stored in plain text: name a secret "
            "in upstream.credential instead",
            where,
        )
    return name


def _headers(raw: object) -> tuple[tuple[str, str], ...]:
    where = "upstream.headers"
    if raw is None:
        return ()
    obj = _object(raw, where)
    if len(obj) > MAX_HEADERS:
        raise InvalidUpstreamOptions(f"{where} may hold at most {MAX_HEADERS} headers", where)
    seen: set[str] = set()
    headers = []
    for name, value in obj.items():
        name = _header_name(name, where, secret_allowed=False)
        if name.lower() in seen:
            raise InvalidUpstreamOptions(f"header {name} is given twice", where)
        seen.add(name.lower())
        headers.append((name, _header_value(value, where)))
    return tuple(headers)


def _header_value(value: object, where: str) -> str:
    if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
        raise InvalidUpstreamOptions(
            f"{where} values must be strings of printable ASCII (no line breaks)", where
        )
    if len(value) > MAX_HEADER_VALUE_LENGTH:
        raise InvalidUpstreamOptions(
            f"{where} values are limited to {MAX_HEADER_VALUE_LENGTH} characters", where
        )
    return value


def _subprotocols(raw: object) -> tuple[str, ...]:
    where = "upstream.subprotocols"
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw or len(raw) > MAX_SUBPROTOCOLS:
        raise InvalidUpstreamOptions(
            f"{where} must be a list of 1 to {MAX_SUBPROTOCOLS} tokens", where
        )
    names = tuple(_token(p, where) for p in raw)
    if len(set(names)) != len(names):
        raise InvalidUpstreamOptions(f"{where} lists a subprotocol twice", where)
    return names


def _subscribe(raw: object) -> tuple[str | None, bool]:
    where = "upstream.subscribe"
    if raw is None:
        return None, False
    if isinstance(raw, str):
        text, is_json = raw, False
        if not text:
            raise InvalidUpstreamOptions(f"{where} must not be empty", where)
    elif isinstance(raw, (Mapping, list)):
        try:
            text = json.dumps(raw, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise InvalidUpstreamOptions(f"{where} is not valid JSON", where) from None
        is_json = True
    else:
        raise InvalidUpstreamOptions(f"{where} must be a JSON object or array, or a string", where)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidUpstreamOptions(f"{where} must be valid Unicode", where) from None
    if size > MAX_SUBSCRIBE_BYTES:
        raise InvalidUpstreamOptions(
            f"{where} is larger than {MAX_SUBSCRIBE_BYTES} bytes", where
        )
    _placeholders(text)  # refuses unknown ones
    return text, is_json


def _placeholders(text: str) -> set[str]:
    names = {m.group(1) for m in _PLACEHOLDER.finditer(text)}
    unknown = names - _KNOWN_PLACEHOLDERS
    if unknown:
        raise InvalidUpstreamOptions(
            f"upstream.subscribe has unknown placeholder(s) {sorted(unknown)[:3]}; known: "
            "{{from_seq}}, {{secret}}",
            "upstream.subscribe",
        )
    if any(m.group(0) not in (FROM_SEQ_PLACEHOLDER, SECRET_PLACEHOLDER)
           for m in _PLACEHOLDER.finditer(text)):
        raise InvalidUpstreamOptions(
            "upstream.subscribe placeholders are written without spaces: {{from_seq}}, "
            "{{secret}}",
            "upstream.subscribe",
        )
    return names


def _resume(raw: object) -> ResumeMode:
    if raw is None:
        return ResumeMode.QUERY
    try:
        return ResumeMode(str(raw))
    except ValueError:
        raise InvalidUpstreamOptions(
            "upstream.resume must be one of query, subscribe, none", "upstream.resume"
        ) from None


def _pointer(raw: object) -> str:
    where = "upstream.seq_pointer"
    if not isinstance(raw, str) or not raw.startswith("/") or len(raw) > MAX_POINTER_LENGTH:
        raise InvalidUpstreamOptions(
            f"{where} must be a JSON pointer such as /seq or /meta/seq "
            f"(at most {MAX_POINTER_LENGTH} characters)",
            where,
        )
    segments = raw[1:].split("/")
    if len(segments) > MAX_POINTER_SEGMENTS:
        raise InvalidUpstreamOptions(
            f"{where} may have at most {MAX_POINTER_SEGMENTS} segments", where
        )
    if re.search(r"~(?![01])", raw) or not raw.isprintable():
        raise InvalidUpstreamOptions(f"{where} has an invalid ~ escape (only ~0 and ~1)", where)
    return raw


def _credential(raw: object, secret_prefixes: tuple[str, ...]) -> Credential | None:
    where = "upstream.credential"
    if raw is None:
        return None
    obj = _object(raw, where)
    _known_keys(obj, where, {"ref", "header", "format", "query", "subscribe", "json_key"})
    if not secret_prefixes:
        raise InvalidUpstreamOptions(
            "credentials by reference are turned off in this deployment "
            "(UPSTREAM_SECRET_PREFIXES is empty)",
            where,
        )
    ref = obj.get("ref")
    if not isinstance(ref, str) or len(ref) > MAX_REF_LENGTH or not (
        _SECRET_ARN.fullmatch(ref) or _PARAMETER_ARN.fullmatch(ref)
    ):
        raise InvalidUpstreamOptions(
            "credential.ref must be a Secrets Manager secret ARN or an SSM parameter ARN",
            f"{where}.ref",
        )
    if not ref.startswith(secret_prefixes):
        raise InvalidUpstreamOptions(
            "credential.ref is outside the secrets this deployment may read "
            "(UPSTREAM_SECRET_PREFIXES)",
            f"{where}.ref",
        )
    targets = [k for k in ("header", "query", "subscribe") if k in obj]
    if len(targets) != 1:
        raise InvalidUpstreamOptions(
            "credential needs exactly one of header, query or subscribe", where
        )
    fmt = obj.get("format")
    if fmt is not None and targets != ["header"]:
        raise InvalidUpstreamOptions("credential.format applies only to header", f"{where}.format")
    json_key = obj.get("json_key")
    if json_key is not None and (
        not isinstance(json_key, str) or not json_key or len(json_key) > MAX_JSON_KEY_LENGTH
    ):
        raise InvalidUpstreamOptions(
            f"credential.json_key must be a string of 1 to {MAX_JSON_KEY_LENGTH} characters",
            f"{where}.json_key",
        )
    target = targets[0]
    if target == "subscribe":
        if obj["subscribe"] is not True:
            raise InvalidUpstreamOptions("credential.subscribe must be true", f"{where}.subscribe")
        return Credential(ref, CredentialPlacement.SUBSCRIBE, json_key=json_key)
    if target == "query":
        return Credential(
            ref, CredentialPlacement.QUERY, _token(obj["query"], f"{where}.query"),
            json_key=json_key,
        )
    name = _header_name(obj["header"], f"{where}.header", secret_allowed=True)
    if fmt is None:
        fmt = SECRET_PLACEHOLDER
    if (
        not isinstance(fmt, str)
        or len(fmt) > MAX_FORMAT_LENGTH
        or fmt.count(SECRET_PLACEHOLDER) != 1
        or not _HEADER_VALUE.fullmatch(fmt)
    ):
        raise InvalidUpstreamOptions(
            "credential.format must be printable ASCII with exactly one {{secret}} "
            f"(at most {MAX_FORMAT_LENGTH} characters), e.g. 'Bearer {{{{secret}}}}'",
            f"{where}.format",
        )
    return Credential(ref, CredentialPlacement.HEADER, name, fmt, json_key)


# --------------------------------------------------------------------------- using options
_MISSING = object()


def seq_at(payload: object, pointer: str) -> tuple[bool, object]:
    """Resolve a JSON pointer in a decoded frame: ``(found, value)``. Never raises.

    >>> seq_at({"meta": {"seq": 7}}, "/meta/seq")
    (True, 7)
    >>> seq_at({"a/b": 1}, "/a~1b"), seq_at([5, 6], "/1"), seq_at({"x": 1}, "/seq")
    ((True, 1), (True, 6), (False, None))
    """
    node: object = payload
    for segment in pointer[1:].split("/"):
        key = segment.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(key, _MISSING)
        elif isinstance(node, list) and key.isdigit() and (key == "0" or key[0] != "0"):
            index = int(key)
            node = node[index] if index < len(node) else _MISSING
        else:
            return False, None
        if node is _MISSING:
            return False, None
    return True, node


def render_subscribe(
    options: UpstreamOptions, *, from_seq: int | None, secret: str | None = None
) -> str | None:
    """The subscribe message to send, placeholders filled; None if there is none.

    In a JSON message, the string ``"{{from_seq}}"`` becomes the number (``null`` when
    ``from_seq`` is None: a START with ``resume: false`` asks for live data only), and a
    placeholder inside a longer string is replaced by its text, JSON-escaped. In a text
    message both are replaced by their text (``from_seq`` None: empty).

    >>> o = UpstreamOptions(subscribe='{"from":"{{from_seq}}","k":"{{secret}}"}',
    ...                     subscribe_is_json=True, resume=ResumeMode.SUBSCRIBE)
    >>> render_subscribe(o, from_seq=42, secret='a"b')
    '{"from":42,"k":"a\\\\"b"}'
    """
    text = options.subscribe
    if text is None:
        return None
    seq_text = "" if from_seq is None else str(int(from_seq))
    if options.subscribe_is_json:
        text = text.replace(f'"{FROM_SEQ_PLACEHOLDER}"', seq_text or "null")
        if secret is not None:
            secret = json.dumps(secret)[1:-1]
    text = text.replace(FROM_SEQ_PLACEHOLDER, seq_text)
    if secret is not None:
        text = text.replace(SECRET_PLACEHOLDER, secret)
    return text


def resume_gap(highest_seq: int, first_seq: int) -> int:
    """Frames the upstream never delivered across a resume: the first seq received after the
    (re)connect minus the highest seq the stream already has minus one, never negative. The
    caller picks ``highest_seq``: the highest seq the session received, at a takeover the
    checkpoint it acquired with, or for an upstream that cannot replay the highest seq stored
    (frames stored above the last checkpoint are not lost). With ``resume: none`` this is what
    a failover cost; with a replaying upstream it should be 0.

    A brand-new stream (nothing received or stored: 0) has no gap: feeds may start anywhere.

    >>> resume_gap(100, 101), resume_gap(100, 131), resume_gap(100, 90), resume_gap(0, 500)
    (0, 30, 0, 0)
    """
    if highest_seq <= 0:
        return 0
    return max(0, first_seq - highest_seq - 1)
