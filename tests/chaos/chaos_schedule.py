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
============  ==============================================================================

The seed fixes the schedule, the runner's choices and the proxy's fault draws; process timing
is the machine's, so a replay reproduces the scenario, not every interleaving.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAULT_MENUS", "POISON_BODIES", "Action", "make_schedule"]

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

    def describe(self) -> str:
        parts = [f"t+{self.at:5.1f}s {self.kind}"]
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
) -> list[Action]:
    """Primary actions at exponential gaps over ``duration`` s, with their follow-ups.

    A slot gets a new disruption only after its previous one is over (revived or resumed), so
    the runner never has to signal a worker in an undefined state.

    >>> actions = make_schedule(random.Random(1), duration=30, workers=3, lease_seconds=4)
    >>> actions == make_schedule(random.Random(1), duration=30, workers=3, lease_seconds=4)
    True
    """
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    busy_until = [0.0] * workers
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
            elif kind in ("kill", "term"):
                delay = rng.uniform(1.0, 4.0)
                actions.append(Action(t, kind, slot))
                actions.append(Action(t + delay, "revive", slot))
                busy_until[slot] = t + delay + 3.0
            else:
                actions.append(Action(t, "restart", slot))
                actions.append(Action(t + 0.1, "revive", slot))
                busy_until[slot] = t + 4.0
        else:
            actions.append(Action(t, kind))
        t += rng.expovariate(1 / mean_gap)
    faults = _fault_windows(rng, duration)
    # Drawn last, so adding these tracks left the other tracks of a seed unchanged.
    poison = _poison_track(rng, duration)
    hostile = [Action(rng.uniform(0.2, 0.6) * duration, "hostile")]
    return sorted(actions + faults + poison + hostile)


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
