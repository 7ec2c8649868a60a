"""template.yaml's Rules accept exactly the parameter combinations the code accepts.

For every combination of HeartbeatSeconds, LeaseSeconds and ReconcilePassSeconds that the
parameters themselves allow (AllowedValues, MinValue..MaxValue), the Rules section is evaluated
as CloudFormation evaluates it, and each component is built from the environment the template
gives it with those values (wsfleet.settings.Settings for every function and the worker, the
reconciler's pass check, the worker's WorkerConfig). A combination the Rules accept must start
every component; one they refuse must be refused by some component.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wsfleet.exceptions import ConfigurationError
from wsfleet.settings import Settings
from wsfleet_local.backend import load_template
from wsfleet_local.stack import StackResolver, read_stack
from wsfleet_worker.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
VARIED = ("HeartbeatSeconds", "LeaseSeconds", "ReconcilePassSeconds")
FUNCTIONS = ("router", "reconciler", "stream_notifier", "task_exit")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


#: The other parameters as a stack gets them without overrides (rules about them, such as the
#: message sink's, then hold or are not applicable); "" for the required ones.
OTHER_DEFAULTS = {
    name: str(spec.get("Default", "")).lower() if isinstance(spec.get("Default"), bool)
    else str(spec.get("Default", ""))
    for name, spec in load_template(ROOT / "template.yaml")["Parameters"].items()
}


def allowed(spec: Mapping[str, Any]) -> list[str]:
    """Every value CloudFormation accepts for a Number parameter, as the string it passes on."""
    if "AllowedValues" in spec:
        return [str(value) for value in spec["AllowedValues"]]
    return [str(value) for value in range(int(spec["MinValue"]), int(spec["MaxValue"]) + 1)]


# ---------------------------------------------------------------------------- rules
def evaluate(node: Any, values: Mapping[str, str]) -> Any:
    """A rule expression with ``values`` for its Refs (the functions Rules may use here)."""
    if isinstance(node, list):
        return [evaluate(item, values) for item in node]
    if not isinstance(node, dict):
        return str(node)
    ((function, argument),) = node.items()
    if function == "Ref":
        return values[argument]
    if function == "Fn::Equals":
        left, right = (evaluate(item, values) for item in argument)
        return left == right
    if function == "Fn::Not":
        (inner,) = argument
        return not evaluate(inner, values)
    if function == "Fn::And":
        return all(evaluate(item, values) for item in argument)
    if function == "Fn::Or":
        assert 2 <= len(argument) <= 10  # CloudFormation's bounds
        return any(evaluate(item, values) for item in argument)
    if function == "Fn::Contains":
        members, value = argument
        return evaluate(value, values) in _members(members, values)
    raise AssertionError(f"the test does not evaluate {function}")


_LITERALS: dict[int, frozenset[str]] = {}


def _members(members: Any, values: Mapping[str, str]) -> Any:
    """Fn::Contains's list; a literal list (no Ref in it) is built once."""
    if isinstance(members, list) and all(not isinstance(m, dict) for m in members):
        key = id(members)
        if key not in _LITERALS:
            _LITERALS[key] = frozenset(str(m) for m in members)
        return _LITERALS[key]
    return evaluate(members, values)


def rules_accept(
    rules: Mapping[str, Any], values: Mapping[str, str], others: Mapping[str, str] | None = None
) -> bool:
    """Whether every rule holds; parameters other than ``values`` take ``others`` (their
    template Defaults, by default)."""
    values = {**(others if others is not None else OTHER_DEFAULTS), **values}
    for rule in rules.values():
        condition = rule.get("RuleCondition")
        if condition is not None and not evaluate(condition, values):
            continue
        if not all(evaluate(a["Assert"], values) for a in rule["Assertions"]):
            return False
    return True


# ---------------------------------------------------------------------------- code
def component_environments(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each component's environment with a placeholder where a varied parameter goes."""
    resolver = StackResolver(
        stack_name="wsfleet", region="eu-west-1", names={},
        parameters=template["Parameters"], conditions=template["Conditions"],
        overrides={name: f"@{name}@" for name in VARIED},
    )
    stack = read_stack(template)
    logging.disable(logging.WARNING)  # resource ARNs the resolver cannot know are left out
    try:
        environments = {
            name: resolver.environment(stack.function(name)) for name in FUNCTIONS
        }
        environments["worker"] = resolver.resolve_variables(
            stack.worker_environment, owner="worker"
        )
    finally:
        logging.disable(logging.NOTSET)
    return environments


FIELDS = {  # the Settings field each varied parameter's variable fills
    "LeaseSeconds": "lease_seconds",
    "HeartbeatSeconds": "heartbeat_seconds",
    "ReconcilePassSeconds": "reconcile_pass_seconds",
}


def read_component(
    component: str, environment: Mapping[str, str]
) -> Settings | WorkerConfig:
    """What ``component`` builds from its environment at start-up (raises when it refuses)."""
    if component == "worker":
        return WorkerConfig.from_env(environment)
    settings = Settings.from_env(environment)
    if component == "reconciler":
        settings.check_reconcile_pass()
    return settings


class Code:
    """The components' verdict on a combination, fast enough for every combination.

    Each component's environment is read once (with the template's defaults); a combination
    is then judged by rebuilding the settings with its three values, which runs the same
    checks (``__post_init__``, the reconciler's pass check) without parsing every variable
    again. ``test_the_fast_verdict_is_the_start_up_verdict`` compares the two."""

    def __init__(self, environments: Mapping[str, Mapping[str, str]], defaults: Mapping[str, str]):
        self.base = {
            name: read_component(name, fill(env, defaults)) for name, env in environments.items()
        }

    def accepts(self, values: Mapping[str, str]) -> bool:
        changes = {FIELDS[name]: float(value) for name, value in values.items()}
        try:
            for component, base in self.base.items():
                if isinstance(base, WorkerConfig):
                    replace(base, settings=replace(base.settings, **changes))
                    continue
                settings = replace(base, **changes)
                if component == "reconciler":
                    settings.check_reconcile_pass()
        except ConfigurationError:
            return False
        return True


def fill(environment: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """The environment with the varied parameters' values in place of their placeholders."""
    return {
        variable: values[value[1:-1]] if value[1:-1] in VARIED else value
        for variable, value in environment.items()
    }


def start_up_accepts(
    environments: Mapping[str, Mapping[str, str]], values: Mapping[str, str]
) -> bool:
    """Whether every component starts, reading its whole environment as it does."""
    try:
        for component, environment in environments.items():
            read_component(component, fill(environment, values))
    except ConfigurationError:
        return False
    return True


def defaults(template: dict[str, Any]) -> dict[str, str]:
    return {name: str(template["Parameters"][name]["Default"]) for name in VARIED}


def combinations(template: dict[str, Any]) -> Iterator[dict[str, str]]:
    ranges = [allowed(template["Parameters"][name]) for name in VARIED]
    for combination in itertools.product(*ranges):
        yield dict(zip(VARIED, combination, strict=True))


# ---------------------------------------------------------------------------- tests
def test_the_varied_parameters_reach_the_code(template: dict[str, Any]) -> None:
    environments = component_environments(template)
    for component, environment in environments.items():
        assert environment["LEASE_SECONDS"] == "@LeaseSeconds@", component
        assert environment["HEARTBEAT_EVERY"] == "@HeartbeatSeconds@", component
        # the self-fence margin is the code's default (the template does not set it)
        assert "LEASE_SAFETY_MARGIN_SECONDS" not in environment, component
    assert environments["reconciler"]["RECONCILE_PASS_SECONDS"] == "@ReconcilePassSeconds@"


def test_the_fast_verdict_is_the_start_up_verdict(template: dict[str, Any]) -> None:
    # every heartbeat and pass length, and the lease values around every boundary
    environments = component_environments(template)
    code = Code(environments, defaults(template))
    judged = 0
    for values in combinations(template):
        if int(values["LeaseSeconds"]) <= 46 or values["LeaseSeconds"] in ("300", "600"):
            assert code.accepts(values) == start_up_accepts(environments, values), values
            judged += 1
    assert judged > 2900


def test_the_rules_accept_exactly_what_the_code_accepts(template: dict[str, Any]) -> None:
    # GIVEN every combination the parameters allow
    rules = template["Rules"]
    code = Code(component_environments(template), defaults(template))
    accepted = refused = 0
    mismatches = []
    for values in combinations(template):
        # WHEN CloudFormation's Rules and the components judge it
        by_rules = rules_accept(rules, values)
        by_code = code.accepts(values)
        # THEN they agree
        if by_rules != by_code:
            mismatches.append((values, "rules accept" if by_rules else "rules refuse"))
        accepted += by_rules
        refused += not by_rules
    assert mismatches == [], mismatches[:10]
    assert accepted and refused  # both sides were exercised


@pytest.mark.parametrize(
    ("heartbeat", "lease", "passes", "accepted"),
    [
        ("2", "4", "1", False),  # 2 x heartbeat, but no room for the 2 s self-fence margin
        ("1", "2", "1", False),
        ("1", "3", "1", False),
        ("1", "4", "1", True),
        ("5", "20", "10", True),  # the defaults
        ("5", "15", "10", False),  # the pass is not shorter than lease - heartbeat
        ("5", "16", "10", True),
        ("15", "30", "15", False),
        ("15", "31", "15", True),
    ],
)
def test_known_combinations(
    template: dict[str, Any], heartbeat: str, lease: str, passes: str, accepted: bool
) -> None:
    values = {"HeartbeatSeconds": heartbeat, "LeaseSeconds": lease, "ReconcilePassSeconds": passes}
    assert rules_accept(template["Rules"], values) is accepted
    assert start_up_accepts(component_environments(template), values) is accepted


def test_the_defaults_pass_the_rules(template: dict[str, Any]) -> None:
    assert rules_accept(template["Rules"], defaults(template))


def test_the_deploy_doc_lists_every_constraint() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for constraint in (
        "`LeaseSeconds` >= 2 x `HeartbeatSeconds`",
        "`LeaseSeconds` - `HeartbeatSeconds` > 2",
        "`ReconcilePassSeconds` < `LeaseSeconds` - `HeartbeatSeconds`",
    ):
        assert constraint in doc, constraint
