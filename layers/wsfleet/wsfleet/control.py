"""The control channel: STOP delivered straight to the worker that owns a connection.

Each worker creates its own SQS queue named ``<prefix><worker-id>`` at start (tagged with its
worker id), registers it in its worker item, and deletes it on a graceful exit. The stream
notifier looks up the owner's worker item and sends a :class:`StopCommand` there, so STOP takes
effect in milliseconds instead of at the next heartbeat.

Planned hand-offs in ``overlap`` mode (make-before-break, docs/handoff.md sections 2-4) talk
over the same queues: the giver sends :class:`PrepareCommand` to the taker, the taker answers
:class:`ReadyReply` or :class:`DeclineReply` on the giver's queue, and the giver ends with
:class:`CommitNotice`. Each is only a reason to act: the taker confirms PREPARE and COMMIT with
a consistent read, and the giver acts on READY only for the move it has pending.

The queue's name says whose it is (:func:`control_queue_name`, read back by
:func:`worker_id_from_queue_name`); :mod:`wsfleet.control_janitor` deletes the queues of
workers gone for good.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .bodies import MAX_EPOCH, connection_pk_field, decode_object, epoch_field
from .record import ConnectionRecord, DesiredState

__all__ = [
    "HANDOFF_DECLINE_REASONS",
    "MAX_WORKER_ID_CHARS",
    "QUEUE_NAME_LIMIT",
    "WORKER_ID_TAG",
    "CommitNotice",
    "ControlMessage",
    "DeclineReply",
    "HandoffHint",
    "PrepareCommand",
    "ReadyReply",
    "StopCommand",
    "control_queue_name",
    "control_queue_policy",
    "parse_control_message",
    "queue_name_of",
    "sibling_queue_url",
    "stop_confirmed",
    "worker_id_from_queue_name",
]

#: SQS queue names: 1-80 characters of [A-Za-z0-9_-].
QUEUE_NAME_LIMIT = 80
#: Tag on each control queue naming its worker, so orphaned queues can be traced back.
WORKER_ID_TAG = "wsfleet:worker_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def control_queue_name(prefix: str, worker_id: str) -> str:
    """A valid, deterministic SQS queue name for a worker's control queue.

    Characters SQS refuses become ``-``; names too long keep their start and gain a short hash
    so two long worker ids never collide.

    >>> control_queue_name("app-ctl-", "ip-10-0-0-1.ec2.internal-7-ab12cd")
    'app-ctl-ip-10-0-0-1-ec2-internal-7-ab12cd'
    """
    name = prefix + _UNSAFE.sub("-", worker_id)
    if len(name) <= QUEUE_NAME_LIMIT:
        return name
    digest = hashlib.sha256(worker_id.encode()).hexdigest()[:10]
    return f"{name[:QUEUE_NAME_LIMIT - 11]}-{digest}"


def sibling_queue_url(queue_url: str, queue_name: str) -> str:
    """The URL of queue ``queue_name`` beside ``queue_url`` (same endpoint and account): how a
    taker reaches the giver's control queue, named by the giver id the record confirmed,
    without a URL taken from a message body.

    >>> sibling_queue_url("http://127.0.0.1:5000/123456789012/app-ctl-t", "app-ctl-g")
    'http://127.0.0.1:5000/123456789012/app-ctl-g'
    """
    return queue_url.rstrip("/").rsplit("/", 1)[0] + "/" + queue_name


def queue_name_of(queue_url: str) -> str:
    """The queue name, i.e. the last path segment of its URL (hosts differ across endpoints).

    >>> queue_name_of("https://sqs.eu-west-1.amazonaws.com/123456789012/app-ctl-w1")
    'app-ctl-w1'
    """
    return queue_url.rstrip("/").rsplit("/", 1)[-1]


def worker_id_from_queue_name(prefix: str, queue_name: str) -> str | None:
    """Best-effort worker id for a control queue without the worker-id tag.

    Exact for ids made only of ``[A-Za-z0-9_-]`` (``control_queue_name`` rewrites other
    characters), which is why the tag is the primary source.
    """
    if not queue_name.startswith(prefix) or len(queue_name) == len(prefix):
        return None
    return queue_name[len(prefix) :]


def control_queue_policy(queue_name: str, region: str, sender_arns: Sequence[str]) -> str:
    """The queue policy a worker sets at CreateQueue: only ``sender_arns`` may send to it.

    An Allow in a queue policy does not keep out a same-account principal whose own IAM
    policy allows ``sqs:SendMessage``, so the policy is an explicit Deny for every principal
    whose ``aws:PrincipalArn`` (the role ARN, also for its assumed-role sessions) is not
    listed. The queue ARN is built from the first sender's partition and account (the
    notifier runs in the stack's account) and the worker's region, because the worker may
    not call GetQueueAttributes or SetQueueAttributes to learn it after creating the queue.

    >>> import json
    >>> doc = json.loads(control_queue_policy("s-ctl-w1", "eu-west-1",
    ...                                       ["arn:aws:iam::123456789012:role/notifier"]))
    >>> doc["Statement"][0]["Resource"]
    'arn:aws:sqs:eu-west-1:123456789012:s-ctl-w1'
    """
    senders = [arn for arn in sender_arns if arn]
    parts = senders[0].split(":") if senders else []
    if len(parts) < 6 or parts[0] != "arn" or not parts[4]:
        raise ValueError("control queue senders must be IAM role ARNs")
    queue_arn = f"arn:{parts[1]}:sqs:{region}:{parts[4]}:{queue_name}"
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OnlyTheNotifierSends",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnNotEquals": {"aws:PrincipalArn": senders}},
            },
            {
                "Sid": "NotifierSends",
                "Effect": "Allow",
                "Principal": {"AWS": senders},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
            },
        ],
    }
    return json.dumps(policy, separators=(",", ":"))


@dataclass(frozen=True)
class StopCommand:
    """Close connection ``pk`` if you still hold it under ``epoch``."""

    pk: str
    epoch: int

    def body(self) -> str:
        command = {"type": "STOP", "pk": self.pk, "epoch": self.epoch}
        return json.dumps(command, separators=(",", ":"))

    @classmethod
    def parse(cls, body: str) -> StopCommand:
        """ValueError for anything that is not a well-formed STOP command."""
        payload = decode_object(body, what="control message")
        if payload.get("type") != "STOP":
            raise ValueError("control message is not a STOP")
        pk = connection_pk_field(payload, what="STOP")
        epoch = epoch_field(payload, what="STOP", required=True)
        assert epoch is not None
        return cls(pk, epoch)


@dataclass(frozen=True)
class HandoffHint:
    """A rebalancing hand-off addressed to one worker: "connection ``pk``, released under
    ``epoch``, is yours to take now". Like every hint it is only a reason to try: the
    acquire decides."""

    pk: str
    epoch: int

    def body(self) -> str:
        command = {"type": "HANDOFF", "pk": self.pk, "epoch": self.epoch}
        return json.dumps(command, separators=(",", ":"))


#: Longest worker id a hand-off message may name (ids are ``<task_id>.<process>`` or an
#: operator's ``WORKER_ID``: far shorter).
MAX_WORKER_ID_CHARS = 256
_WORKER_ID = re.compile(r"[!-~]+")  # visible ASCII: no spaces, no control characters
#: Why a taker declined a PREPARE (a closed set: a reason is a log field, never free text).
HANDOFF_DECLINE_REASONS = frozenset(
    {"moved", "full", "draining", "budget", "no_frame", "no_seq", "connect_failed", "failed"}
)
_MAX_FIRST_SEQ = 2**53 - 1  # MAX_SAFE_SEQ of the worker's frame parser


def _worker_field(payload: dict[str, object], key: str, what: str) -> str:
    value = payload.get(key)
    if (
        not isinstance(value, str)
        or len(value) > MAX_WORKER_ID_CHARS
        or not _WORKER_ID.fullmatch(value)
    ):
        raise ValueError(f"{what} has no valid {key}")
    return value


def _compact(command: dict[str, object]) -> str:
    return json.dumps(command, separators=(",", ":"))


@dataclass(frozen=True)
class PrepareCommand:
    """Giver -> taker (step 1): "open your own session of ``pk``, which I, ``giver``, hold
    under ``epoch``; buffer, write nothing, answer READY or DECLINE"."""

    pk: str
    epoch: int
    giver: str
    #: The giver's stored seq when it asked: a replaying upstream is asked to resume the
    #: taker's session from ``durable`` (:func:`wsfleet.lease.prepared_resume_seq`; not from
    #: an older checkpoint, which would fill the taker's buffer with frames already stored).
    #: A position hint only: the transfer carries the real checkpoint.
    durable: int = 0
    #: The *name* of the giver's control queue (READY and DECLINE go there): the taker puts
    #: it beside its own queue (:func:`sibling_queue_url`), so a message can never point it
    #: at another endpoint or account. Empty: ``control_queue_name`` of the taker's prefix.
    reply_to: str = ""

    def body(self) -> str:
        return _compact({"type": "PREPARE", "pk": self.pk, "epoch": self.epoch,
                         "giver": self.giver, "durable": self.durable,
                         "reply_to": self.reply_to})


@dataclass(frozen=True)
class ReadyReply:
    """Taker -> giver (step 3): "I hold every frame of ``pk`` from ``first_seq`` on"."""

    pk: str
    epoch: int
    taker: str
    first_seq: int

    def body(self) -> str:
        return _compact({"type": "READY", "pk": self.pk, "epoch": self.epoch,
                         "taker": self.taker, "first_seq": self.first_seq})


@dataclass(frozen=True)
class DeclineReply:
    """Taker -> giver: "I will not take ``pk`` over the overlap; break" (``reason`` is one of
    :data:`HANDOFF_DECLINE_REASONS`)."""

    pk: str
    epoch: int
    taker: str
    reason: str

    def body(self) -> str:
        return _compact({"type": "DECLINE", "pk": self.pk, "epoch": self.epoch,
                         "taker": self.taker, "reason": self.reason})


@dataclass(frozen=True)
class CommitNotice:
    """Giver -> taker (step 6): "the transfer landed; ``pk`` is yours under ``epoch``"
    (the new epoch). The taker believes the record, not this message."""

    pk: str
    epoch: int

    def body(self) -> str:
        return _compact({"type": "COMMIT", "pk": self.pk, "epoch": self.epoch})


ControlMessage = (
    StopCommand | HandoffHint | PrepareCommand | ReadyReply | DeclineReply | CommitNotice
)


def parse_control_message(body: str) -> ControlMessage:
    """A control queue message; ValueError for anything else (unknown types included), so a
    caller drops it with a trace and nothing a body holds can raise anything else.

    >>> parse_control_message('{"type": "HANDOFF", "pk": "CONN#a", "epoch": 2}')
    HandoffHint(pk='CONN#a', epoch=2)
    >>> parse_control_message('{"type": "READY", "pk": "CONN#a", "epoch": 2, "taker": "t",'
    ...                       ' "first_seq": 41}')
    ReadyReply(pk='CONN#a', epoch=2, taker='t', first_seq=41)
    """
    payload = decode_object(body, what="control message")
    kind = payload.get("type")
    if kind == "STOP":
        return StopCommand.parse(body)
    if not isinstance(kind, str) or kind not in _PARSERS:
        raise ValueError("control message has an unknown type")
    pk = connection_pk_field(payload, what=kind)
    epoch = epoch_field(payload, what=kind, required=True)
    assert epoch is not None
    return _PARSERS[kind](payload, pk, epoch)


_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _queue_name(payload: dict[str, object]) -> str:
    name = payload.get("reply_to", "")
    if not isinstance(name, str) or (name and not _QUEUE_NAME.fullmatch(name)):
        raise ValueError("PREPARE has no valid reply_to queue name")
    return name


def _durable(payload: dict[str, object]) -> int:
    durable = payload.get("durable", 0)
    if (
        not isinstance(durable, int)
        or isinstance(durable, bool)
        or not 0 <= durable <= _MAX_FIRST_SEQ
    ):
        raise ValueError("PREPARE has no valid durable")
    return durable


def _ready(payload: dict[str, object], pk: str, epoch: int) -> ReadyReply:
    first_seq = payload.get("first_seq")
    if (
        not isinstance(first_seq, int)
        or isinstance(first_seq, bool)
        or not 1 <= first_seq <= _MAX_FIRST_SEQ
    ):
        raise ValueError("READY has no valid first_seq")
    return ReadyReply(pk, epoch, _worker_field(payload, "taker", "READY"), first_seq)


def _decline(payload: dict[str, object], pk: str, epoch: int) -> DeclineReply:
    reason = payload.get("reason")
    if not isinstance(reason, str) or reason not in HANDOFF_DECLINE_REASONS:
        raise ValueError("DECLINE has no valid reason")
    return DeclineReply(pk, epoch, _worker_field(payload, "taker", "DECLINE"), reason)


def _commit(payload: dict[str, object], pk: str, epoch: int) -> CommitNotice:
    if epoch < 1 or epoch > MAX_EPOCH:
        raise ValueError("COMMIT has no valid epoch")
    return CommitNotice(pk, epoch)


_PARSERS: dict[str, Callable[[dict[str, object], str, int], ControlMessage]] = {
    "HANDOFF": lambda payload, pk, epoch: HandoffHint(pk, epoch),
    "PREPARE": lambda payload, pk, epoch: PrepareCommand(
        pk, epoch, _worker_field(payload, "giver", "PREPARE"), _durable(payload),
        _queue_name(payload),
    ),
    "READY": _ready,
    "DECLINE": _decline,
    "COMMIT": _commit,
}


def stop_confirmed(command: StopCommand, record: ConnectionRecord | None) -> bool:
    """Whether the connection record backs a STOP command (read with a consistent GetItem).

    A control queue is reachable by whoever may send to it, so a STOP is a hint to look, not an
    order: the session closes only if the record says so - the item is gone (DELETE), or it is
    STOPPED under the epoch the command names. Anything else (STARTED, or STOPPED under
    another epoch: a stale or forged command) leaves the stream running; the lease renewal
    still notices a real STOP within one heartbeat.

    >>> from wsfleet.record import ConnectionRecord, DesiredState
    >>> rec = ConnectionRecord(
    ...     pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="", lease_epoch=3
    ... )
    >>> stop_confirmed(StopCommand("CONN#a", 3), rec)
    False
    """
    if record is None:
        return True
    return (
        record.pk == command.pk
        and record.desired_state is DesiredState.STOPPED
        and record.lease_epoch == command.epoch
    )
