"""The chaos schedule: which disruption happens when, drawn from one seed (pure, no I/O).

A schedule is a sorted list of :class:`Action`. Worker actions name a *slot* (the worker in
that position at the time); stream actions name nothing: the runner draws the stream from its
own seeded RNG when the action runs, among the streams that are in the right state then.

Disruptions and their follow-ups are generated together, as ECS would follow them:

============  ==============================================================================
kind          what happens
============  ==============================================================================
kill          SIGKILL the slot's worker (a crash); ``revive`` it ``delay`` later
term          SIGTERM (a deploy: graceful drain); ``revive`` it ``delay`` later
pause         SIGSTOP for longer than the lease (a zombie owner); ``resume`` (SIGCONT) after
restart       a rolling deploy: SIGTERM, and a new worker replaces it as soon as it exited
stop          STOP a random STARTED stream through the API
start         re-START a random STOPPED stream through the API
faults        inject DynamoDB/SQS faults through the proxy for ``duration`` s; ``clear`` after
              (its own track of non-overlapping windows, every menu in turn)
hostile       arm one of each hostile frame (bad seqs, a maximum-size non-ASCII frame) on the
              hostile-frames stream (its own track, drawn after the poison track)
poison        send every :data:`POISON_BODIES` body to the hint queue and to each running
              worker's control queue, plus a forged well-formed STOP (current epoch) of a
              stream that worker holds (its own track, drawn after the others)
handoff       a planned hand-off disrupted midway (issue #26; its own track, drawn last): the
              slot's worker is SIGTERMed (a drain: with ``upstream.handoff: overlap`` its
              connections are prepared on takers) and ``duration`` later one of
              :data:`HANDOFF_VARIANTS` strikes; every slot touched is revived or resumed
============  ==============================================================================

Hand-off variants (``Action.variant``): ``kill_giver`` SIGKILLs the draining worker;
``kill_taker`` SIGKILLs another worker (a taker, or about to be one); ``pause_taker``
SIGSTOPs another worker for longer than the lease; ``partition`` cuts every worker off
DynamoDB (every request answered 503, as a partitioned task sees it) for a moment;
``mute_taker`` mutes, just before the SIGTERM, the upstream streams the draining worker holds:
the sessions its takers open get no frame until the mute ends.

The seed fixes the schedule, the runner's choices and the proxy's fault draws; process timing
is the machine's, so a replay reproduces the scenario, not every interleaving.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAULT_MENUS",
    "HANDOFF_VARIANTS",
    "PARTITION_RULES",
    "POISON_BODIES",
    "Action",
    "make_schedule",
]

#: Fault sets a ``faults`` action picks from (FaultRule fields). Probabilities are per request.
FAULT_MENUS: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = (
    ("dynamodb throttling", (
        {"kind": "throttle", "service": "dynamodb", "probability": 0.25},
    )),
    ("ambiguous lease writes", (
        {"kind": "500", "service": "dynamodb", "operations": ["UpdateItem"], "after": True,
         "probability": 0.15},
    )),
    ("message writes failing", (
        {"kind": "throttle", "service": "dynamodb", "operations": ["BatchWriteItem"],
         "probability": 0.4},
        {"kind": "503", "service": "dynamodb", "operations": ["BatchWriteItem"], "after": True,
         "probability": 0.1},
    )),
    ("sqs trouble", (
        {"kind": "503", "service": "sqs", "probability": 0.3},
        {"kind": "throttle", "service": "sqs", "probability": 0.2},
    )),
    ("everything flaky", (
        {"kind": "500", "service": "dynamodb", "probability": 0.05, "after": True},
        {"kind": "throttling", "service": "dynamodb", "probability": 0.1},
        {"kind": "503", "service": "sqs", "probability": 0.1},
    )),
)  # fmt: skip

#: Unusable queue bodies (label, body) the ``poison`` action sends. None may cost a worker its
#: life or stay in a queue: each is counted (InvalidHints / InvalidControlMessages) and deleted.
#: SQS itself refuses a body over 256 KiB or with characters outside its XML range, so the
#: "huge" body may be refused at the door (the runner records which were sent).
POISON_BODIES: tuple[tuple[str, str], ...] = (
    ("deep nesting", "[" * 5000),
    ("300 KB garbage", "\u00e9garbage!" * 30_000),
    ("250 KB garbage", "#" * 250_000),
    ("mojibake", "caf\u00c3\u00a9 \ufffd\ufffd \u00ff\u00fe\u00bf\u00bd \U0001f4a9 \ud7ff"),
    ("wrong types", '{"pk": 5, "epoch": "seven", "type": ["STOP"]}'),
    ("pk list", '{"pk": ["CONN#chaos-000"], "epoch": 1}'),
    ("bool epoch", '{"type": "STOP", "pk": "CONN#chaos-000", "epoch": true}'),
    ("huge epoch", '{"type": "STOP", "pk": "CONN#chaos-000", "epoch": 1e400}'),
    ("not an object", '"CONN#chaos-000"'),
    ("null", "null"),
)

#: How a planned hand-off is disrupted midway (see the module docstring).
HANDOFF_VARIANTS = ("kill_giver", "kill_taker", "pause_taker", "partition", "mute_taker")
#: A partition from DynamoDB, as the fault proxy plays it: every request refused.
PARTITION_RULES: tuple[dict[str, Any], ...] = (
    {"kind": "503", "service": "dynamodb", "probability": 1.0},
)

#: Relative weights of the primary actions.
WEIGHTS = {
    "kill": 3,
    "term": 2,
    "pause": 2,
    "restart": 1,
    "stop": 3,
    "start": 2,
}


@dataclass(frozen=True, order=True)
class Action:
    """One step of the scenario, ``at`` seconds after the chaos phase began."""

    at: float
    kind: str = field(compare=False)
    slot: int | None = field(default=None, compare=False)
    duration: float = field(default=0.0, compare=False)
    menu: int | None = field(default=None, compare=False)
    variant: str = field(default="", compare=False)

    def describe(self) -> str:
        parts = [f"t+{self.at:5.1f}s {self.kind}"]
        if self.variant:
            parts.append(self.variant)
        if self.slot is not None:
            parts.append(f"slot {self.slot}")
        if self.duration:
            parts.append(f"for {self.duration:.1f}s")
        if self.menu is not None:
            parts.append(f"({FAULT_MENUS[self.menu][0]})")
        return " ".join(parts)


def make_schedule(
    rng: random.Random,
    *,
    duration: float,
    workers: int,
    lease_seconds: float,
    mean_gap: float = 2.5,
    handoffs: int = 0,
) -> list[Action]:
    """Primary actions at exponential gaps over ``duration`` s, with their follow-ups;
    ``handoffs`` disrupted hand-offs on their own track (drawn last, on slots the primary
    track leaves alone at the time, so a seed's other tracks do not change).

    A slot gets a new disruption only after its previous one is over (revived or resumed), so
    the runner never has to signal a worker in an undefined state.

    >>> actions = make_schedule(random.Random(1), duration=30, workers=3, lease_seconds=4)
    >>> actions == make_schedule(random.Random(1), duration=30, workers=3, lease_seconds=4)
    True
    """
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    busy_until = [0.0] * workers
    spans: list[list[tuple[float, float]]] = [[] for _ in range(workers)]  # busy, per slot
    actions: list[Action] = []
    t = rng.uniform(0.5, mean_gap)
    while t < duration:
        kind = rng.choices(kinds, weights)[0]
        if kind in ("kill", "term", "pause", "restart"):
            free = [s for s in range(workers) if busy_until[s] <= t]
            if len(free) <= 1:  # keep one worker untouched at any time, so the fleet converges
                t += rng.expovariate(1 / mean_gap)
                continue
            slot = rng.choice(free)
            if kind == "pause":
                length = lease_seconds + rng.uniform(1.0, 3.0)
                actions.append(Action(t, "pause", slot, duration=length))
                actions.append(Action(t + length, "resume", slot))
                busy_until[slot] = t + length + 1.0
                spans[slot].append((t, busy_until[slot]))
            elif kind in ("kill", "term"):
                delay = rng.uniform(1.0, 4.0)
                actions.append(Action(t, kind, slot))
                actions.append(Action(t + delay, "revive", slot))
                busy_until[slot] = t + delay + 3.0
                spans[slot].append((t, busy_until[slot]))
            else:
                actions.append(Action(t, "restart", slot))
                actions.append(Action(t + 0.1, "revive", slot))
                busy_until[slot] = t + 4.0
                spans[slot].append((t, busy_until[slot]))
        else:
            actions.append(Action(t, kind))
        t += rng.expovariate(1 / mean_gap)
    faults = _fault_windows(rng, duration)
    # Drawn last, so adding these tracks left the other tracks of a seed unchanged.
    poison = _poison_track(rng, duration)
    hostile = [Action(rng.uniform(0.2, 0.6) * duration, "hostile")]
    handoff = _handoff_track(rng, duration, spans, lease_seconds, handoffs)
    return sorted(actions + faults + poison + hostile + handoff)


def _handoff_track(
    rng: random.Random, duration: float, spans: list[list[tuple[float, float]]],
    lease_seconds: float, count: int,
) -> list[Action]:  # fmt: skip
    """``count`` disrupted hand-offs, every variant in turn (shuffled), each on a giver and a
    second slot no other action touches meanwhile (``spans``: each slot's busy intervals,
    extended by these), while a third stays untouched; a hand-off with no room is left out."""

    def idle(slot: int, start: float, end: float) -> bool:
        return all(end <= a or b <= start for a, b in spans[slot])

    variants = list(HANDOFF_VARIANTS)
    rng.shuffle(variants)
    actions: list[Action] = []
    for index in range(count):  # spread over the middle of the run, one per slice
        t = (0.15 + 0.7 * (index + rng.uniform(0.0, 0.5)) / max(count, 1)) * duration
        variant = variants[index % len(variants)]
        strike = rng.uniform(0.2, 1.0)  # into the hand-off: within the prepare bound
        revive = t + strike + rng.uniform(1.0, 3.0)
        length = lease_seconds + rng.uniform(1.0, 2.0)
        end = max(revive, t + strike + length) + 3.0
        free = [s for s in range(len(spans)) if idle(s, t, end)]
        if len(free) < 3:
            continue
        giver, other = rng.sample(free, 2)
        actions.append(Action(t, "handoff", giver, duration=strike, variant=variant))
        actions.append(Action(revive, "revive", giver))
        spans[giver].append((t, revive + 3.0))
        match variant:
            case "kill_giver":
                actions.append(Action(t + strike, "kill_draining", giver))
            case "kill_taker":
                actions.append(Action(t + strike, "kill", other))
                actions.append(Action(revive, "revive", other))
                spans[other].append((t, revive + 3.0))
            case "pause_taker":
                actions.append(Action(t + strike, "pause", other, duration=length))
                actions.append(Action(t + strike + length, "resume", other))
                spans[other].append((t, t + strike + length + 1.0))
            case "partition":
                actions.append(Action(t + strike, "partition", duration=lease_seconds / 2))
                actions.append(Action(t + strike + lease_seconds / 2, "clear"))
            case "mute_taker":
                actions.append(Action(t + strike + lease_seconds, "unmute"))
    return actions


def _poison_track(rng: random.Random, duration: float, count: int = 2) -> list[Action]:
    """``count`` poison deliveries in the first two thirds of the run: late enough that the
    fleet is busy, early enough that the queues are watched draining under chaos."""
    return [Action(rng.uniform(0.15, 0.66) * duration, "poison") for _ in range(count)]


def _fault_windows(rng: random.Random, duration: float) -> list[Action]:
    """A separate track of non-overlapping fault windows, every menu at least once if time
    allows (shuffled), so each run exercises every kind of AWS trouble."""
    menus = list(range(len(FAULT_MENUS)))
    rng.shuffle(menus)
    actions: list[Action] = []
    t = rng.uniform(1.0, 3.0)
    index = 0
    while t < duration:
        length = rng.uniform(3.0, 6.0)
        actions.append(Action(t, "faults", duration=length, menu=menus[index % len(menus)]))
        actions.append(Action(t + length, "clear"))
        index += 1
        t += length + rng.uniform(1.0, 4.0)
    return actions
