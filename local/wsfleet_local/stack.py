"""What template.yaml says about the functions, read once so local wiring cannot drift from AWS.

The local runtime invokes the same handlers AWS does, and it must wire them the same way: the
routes API Gateway exposes, the environment each function gets, the stream event source's
FilterCriteria and retry settings, the task exit function's EventBridge rule. Rather than
restating any of that in Python, :func:`read_stack` extracts it from the template (parsed by
:func:`wsfleet_local.backend.load_template`, which turns ``!Ref`` into ``{"Ref": ...}``), and
:class:`StackResolver` evaluates the intrinsic functions in environment variables against the
locally created resources, including the template's ``Conditions`` (``Fn::If`` with
``AWS::NoValue`` leaves a variable or a list entry out, as CloudFormation does). The embedded
backend's provisioner (:func:`wsfleet_local.backend.provision_resources`) uses the same
resolver for the properties of the tables and queues it creates, so both read the template's
intrinsics one way.

Pure: a template dict in, dataclasses out. No boto3, no files except through the loader.

Example::

    >>> from wsfleet_local.backend import find_template, load_template
    >>> stack = read_stack(load_template(find_template()))
    >>> stack.function("router").routes[0]
    Route(method='POST', path='/events')
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from wsfleet.exceptions import ConfigurationError

__all__ = [
    "NO_VALUE",
    "FunctionSpec",
    "Route",
    "RuleSource",
    "StackResolver",
    "StackSpec",
    "StreamSource",
    "Unresolvable",
    "cfn_string",
    "container_environment",
    "read_stack",
]

logger = logging.getLogger(__name__)

FUNCTION_TYPE = "AWS::Serverless::Function"
TASK_DEFINITION_TYPE = "AWS::ECS::TaskDefinition"
#: SAM's default function timeout when neither the function nor Globals set one.
DEFAULT_TIMEOUT_SECONDS = 3
LOCAL_ACCOUNT_ID = "123456789012"


class _NoValue:
    """What ``Ref AWS::NoValue`` resolves to: the property, map entry or list item is left
    out. :meth:`StackResolver.resolve` drops it from maps and lists; only a top-level value
    can come back as it (then the caller leaves the variable unset, as CloudFormation does)."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()


@dataclass(frozen=True)
class Route:
    """One API Gateway route of a function (``Events: {Type: Api}``)."""

    method: str
    path: str  # a resource path, e.g. "/connections/{id}"

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """Path parameters if ``method path`` hits this route, else None.

        >>> Route("GET", "/connections/{id}").match("GET", "/connections/abc")
        {'id': 'abc'}
        """
        if method.upper() != self.method and self.method != "ANY":
            return None
        wanted = [part for part in self.path.split("/") if part]
        given = [part for part in path.split("/") if part]
        greedy = bool(wanted) and wanted[-1].endswith("+}")
        if len(given) != len(wanted) and not (greedy and len(given) >= len(wanted)):
            return None
        parameters: dict[str, str] = {}
        for index, part in enumerate(wanted):
            if part.startswith("{") and part.endswith("}"):
                name = part[1:-1]
                if name.endswith("+"):
                    parameters[name[:-1]] = "/".join(given[index:])
                    break
                parameters[name] = given[index]
            elif part != given[index]:
                return None
        return parameters


@dataclass(frozen=True)
class StreamSource:
    """A DynamoDB Streams event source of a function (``Events: {Type: DynamoDB}``)."""

    stream: Any  # unresolved, e.g. {"Fn::GetAtt": ["ConnectionsTable", "StreamArn"]}
    starting_position: str = "LATEST"
    batch_size: int = 100
    maximum_retry_attempts: int = -1  # -1: retry until the record expires (AWS default)
    bisect_batch_on_function_error: bool = False
    report_batch_item_failures: bool = False
    maximum_record_age_seconds: float = -1  # -1: no limit (AWS default)
    filter_criteria: Mapping[str, Any] | None = None
    on_failure_destination: Any = None  # unresolved, e.g. {"Fn::GetAtt": ["StopDLQ", "Arn"]}

    @property
    def table_logical_id(self) -> str | None:
        """The logical id of the table whose stream this is, when the template says so."""
        if isinstance(self.stream, Mapping) and "Fn::GetAtt" in self.stream:
            target = self.stream["Fn::GetAtt"]
            return str(target[0] if isinstance(target, list) else str(target).split(".")[0])
        return None


@dataclass(frozen=True)
class RuleSource:
    """An EventBridge rule that invokes a function (``Events: {Type: EventBridgeRule}``)."""

    pattern: Mapping[str, Any]  # unresolved (may hold !GetAtt)


@dataclass(frozen=True)
class FunctionSpec:
    """One ``AWS::Serverless::Function`` as wsfleet's local runtime needs it."""

    name: str  # the directory under functions/ (router, reconciler, stream_notifier)
    logical_id: str
    handler: str
    timeout_seconds: float
    memory_mb: int
    environment: Mapping[str, Any]  # Globals merged with the function's own; unresolved
    routes: tuple[Route, ...] = ()
    streams: tuple[StreamSource, ...] = ()
    rules: tuple[RuleSource, ...] = ()


@dataclass(frozen=True)
class StackSpec:
    """The functions of the template, by local name, plus its parameters."""

    functions: Mapping[str, FunctionSpec]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: The template's ``Conditions``, unevaluated (give them to :class:`StackResolver`).
    conditions: Mapping[str, Any] = field(default_factory=dict)
    #: The worker container's environment (ECS task definition), unresolved; {} if none.
    worker_environment: Mapping[str, Any] = field(default_factory=dict)

    def function(self, name: str) -> FunctionSpec:
        try:
            return self.functions[name]
        except KeyError:
            raise ConfigurationError(
                f"template.yaml has no function with CodeUri functions/{name}/ "
                f"(found: {', '.join(sorted(self.functions)) or 'none'})"
            ) from None


def _bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def _function_name(properties: Mapping[str, Any], logical_id: str) -> str:
    code_uri = properties.get("CodeUri")
    if isinstance(code_uri, str) and code_uri.strip("/"):
        return PurePosixPath(code_uri.strip("/")).name
    return logical_id


def _events(
    properties: Mapping[str, Any],
) -> tuple[list[Route], list[StreamSource], list[RuleSource]]:
    """The function's API routes, stream sources and EventBridge rules (schedules are left to
    :class:`wsfleet_local.scheduler.ReconcileScheduler`, which runs on a local cadence)."""
    routes: list[Route] = []
    streams: list[StreamSource] = []
    rules: list[RuleSource] = []
    for event in (properties.get("Events") or {}).values():
        kind = event.get("Type")
        props = event.get("Properties") or {}
        if kind == "Api":
            routes.append(Route(str(props["Method"]).upper(), str(props["Path"])))
        elif kind == "DynamoDB":
            types = props.get("FunctionResponseTypes") or []
            streams.append(
                StreamSource(
                    stream=props.get("Stream"),
                    starting_position=str(props.get("StartingPosition", "LATEST")),
                    batch_size=int(props.get("BatchSize", 100)),
                    maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
                    bisect_batch_on_function_error=_bool(
                        props.get("BisectBatchOnFunctionError", False)
                    ),
                    report_batch_item_failures="ReportBatchItemFailures" in types,
                    maximum_record_age_seconds=float(props.get("MaximumRecordAgeInSeconds", -1)),
                    filter_criteria=props.get("FilterCriteria"),
                    on_failure_destination=(
                        ((props.get("DestinationConfig") or {}).get("OnFailure") or {}).get(
                            "Destination"
                        )
                    ),
                )
            )
        elif kind in ("EventBridgeRule", "CloudWatchEvent"):
            rules.append(RuleSource(pattern=props.get("Pattern") or {}))
    return routes, streams, rules


def read_stack(template: Mapping[str, Any]) -> StackSpec:
    """Extract every serverless function of a parsed template, keyed by its functions/ name."""
    globals_ = ((template.get("Globals") or {}).get("Function")) or {}
    global_env = ((globals_.get("Environment") or {}).get("Variables")) or {}
    functions: dict[str, FunctionSpec] = {}
    for logical_id, resource in (template.get("Resources") or {}).items():
        if not isinstance(resource, Mapping) or resource.get("Type") != FUNCTION_TYPE:
            continue
        properties = resource.get("Properties") or {}
        own_env = ((properties.get("Environment") or {}).get("Variables")) or {}
        routes, streams, rules = _events(properties)
        name = _function_name(properties, logical_id)
        functions[name] = FunctionSpec(
            name=name,
            logical_id=logical_id,
            handler=str(properties.get("Handler", globals_.get("Handler", "app.lambda_handler"))),
            timeout_seconds=float(
                properties.get("Timeout", globals_.get("Timeout", DEFAULT_TIMEOUT_SECONDS))
            ),
            memory_mb=int(properties.get("MemorySize", globals_.get("MemorySize", 128))),
            environment={**global_env, **own_env},
            routes=tuple(routes),
            streams=tuple(streams),
            rules=tuple(rules),
        )
    return StackSpec(
        functions=functions,
        parameters=dict(template.get("Parameters") or {}),
        conditions=dict(template.get("Conditions") or {}),
        worker_environment=_worker_environment(template),
    )


def _worker_environment(template: Mapping[str, Any]) -> dict[str, Any]:
    """``Environment`` of the worker container: the task definition's container named
    ``worker`` (else its first container), as a name -> unresolved value map."""
    for resource in (template.get("Resources") or {}).values():
        if not isinstance(resource, Mapping) or resource.get("Type") != TASK_DEFINITION_TYPE:
            continue
        containers = (resource.get("Properties") or {}).get("ContainerDefinitions") or []
        chosen = next((c for c in containers if c.get("Name") == "worker"), None)
        chosen = chosen or (containers[0] if containers else None)
        if chosen:
            return container_environment(chosen.get("Environment") or [])
    return {}


def container_environment(entries: Iterable[Any]) -> dict[str, Any]:
    """An ECS container's ``Environment`` list as name -> unresolved value. An entry chosen by
    a condition (``Fn::If`` between an entry and ``AWS::NoValue``) becomes its value under the
    same condition, so resolving it leaves the variable undeclared where the stack would.

    >>> container_environment([{"Name": "A", "Value": "1"},
    ...     {"Fn::If": ["On", {"Ref": "AWS::NoValue"}, {"Name": "B", "Value": "2"}]}])
    {'A': '1', 'B': {'Fn::If': ['On', {'Ref': 'AWS::NoValue'}, '2']}}
    """
    out: dict[str, Any] = {}
    for entry in entries:
        condition = entry.get("Fn::If") if isinstance(entry, Mapping) and len(entry) == 1 else None
        if condition is None:
            out[entry["Name"]] = entry.get("Value", "")
            continue
        name, *branches = condition
        for branch in branches:
            if isinstance(branch, Mapping) and "Name" in branch:
                out[branch["Name"]] = {"Fn::If": [name, *(
                    b.get("Value", "") if isinstance(b, Mapping) and b.get("Name") == branch["Name"]
                    else {"Ref": "AWS::NoValue"} for b in branches
                )]}  # fmt: skip
    return out


class Unresolvable(ConfigurationError):
    """An intrinsic function refers to something that does not exist locally."""


@dataclass(frozen=True)
class StackResolver:
    """Evaluates Ref / GetAtt / Sub / Join / Split / Select and the condition functions (If,
    Equals, Not, And, Or, Condition) against locally created resources.

    ``names`` maps logical ids to what ``Ref`` returns (table names, queue URLs);
    ``attributes`` maps ``(logical_id, attribute)`` to what ``GetAtt`` returns. Parameters take
    ``overrides`` first, then their template ``Default``. ``conditions`` is the template's
    ``Conditions`` section; ``Fn::If`` picks a branch by evaluating one, and a branch that is
    ``Ref AWS::NoValue`` leaves its map entry or list item out (:data:`NO_VALUE` at the top).
    Anything else (an unknown name or condition, an unsupported ``Fn::``) raises
    :class:`Unresolvable`.

    Example::

        >>> r = StackResolver(stack_name="demo", region="us-east-1",
        ...                   names={"HintQueue": "http://q"}, parameters={})
        >>> r.resolve({"Fn::Sub": "${AWS::StackName}-ctl-"}), r.resolve({"Ref": "HintQueue"})
        ('demo-ctl-', 'http://q')
    """

    stack_name: str
    region: str
    names: Mapping[str, str]
    parameters: Mapping[str, Any]
    overrides: Mapping[str, Any] = field(default_factory=dict)
    attributes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    conditions: Mapping[str, Any] = field(default_factory=dict)

    def ref(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": self.region,
            "AWS::StackName": self.stack_name,
            "AWS::AccountId": LOCAL_ACCOUNT_ID,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }
        if name in pseudo:
            return pseudo[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.names:
            return self.names[name]
        if name in self.overrides:
            return self.overrides[name]
        parameter = self.parameters.get(name)
        if isinstance(parameter, Mapping) and "Default" in parameter:
            return parameter["Default"]
        raise Unresolvable(f"Ref {name} has no local value")

    def get_att(self, name: str, attribute: str) -> Any:
        try:
            return self.attributes[(name, attribute)]
        except KeyError:
            raise Unresolvable(f"GetAtt {name}.{attribute} has no local value") from None

    def condition(self, name: str, _seen: tuple[str, ...] = ()) -> bool:
        """Whether the template's condition ``name`` holds with these parameters."""
        if name not in self.conditions:
            raise Unresolvable(f"condition {name} is not in the template's Conditions")
        if name in _seen:
            raise Unresolvable(f"condition {name} refers to itself")
        return self._truth(self.conditions[name], (*_seen, name))

    def _truth(self, value: Any, seen: tuple[str, ...]) -> bool:
        """A condition expression: Equals / Not / And / Or / Condition (or a literal)."""
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, Mapping) and len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Condition":
                return self.condition(str(argument), seen)
            if key == "Fn::Equals":
                left, right = argument
                # CloudFormation compares strings: a Number parameter's 20 equals "20".
                return cfn_string(self.resolve(left)) == cfn_string(self.resolve(right))
            if key == "Fn::Not":
                (only,) = argument
                return not self._truth(only, seen)
            if key == "Fn::And":
                return all(self._truth(item, seen) for item in argument)
            if key == "Fn::Or":
                return any(self._truth(item, seen) for item in argument)
        raise Unresolvable(f"{value!r} is not a condition expression")

    def resolve(self, value: Any) -> Any:
        """The value with every supported intrinsic evaluated (Unresolvable otherwise)."""
        return self._walk(value, only_conditions=False)

    def resolve_conditions(self, value: Any) -> Any:
        """The value with only ``Fn::If`` and ``AWS::NoValue`` evaluated: what the template
        means with these parameters, other intrinsics left as written (for reading a
        resource's properties, e.g. an IAM policy, without any resource existing).

        >>> r = StackResolver(stack_name="s", region="r", names={}, parameters={},
        ...                   conditions={"On": {"Fn::Equals": ["a", "a"]}})
        >>> r.resolve_conditions([{"Fn::If": ["On", {"Ref": "X"}, 0]},
        ...                       {"Fn::If": ["On", {"Ref": "AWS::NoValue"}, 1]}])
        [{'Ref': 'X'}]
        """
        return self._walk(value, only_conditions=True)

    def _walk(self, value: Any, *, only_conditions: bool) -> Any:
        if isinstance(value, list):
            items = (self._walk(item, only_conditions=only_conditions) for item in value)
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, Mapping):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Fn::If":
                name, when_true, when_false = argument
                chosen = when_true if self.condition(str(name)) else when_false
                return self._walk(chosen, only_conditions=only_conditions)
            if key == "Ref" and argument == "AWS::NoValue":
                return NO_VALUE
            if not only_conditions and (key in ("Ref", "Condition") or key.startswith("Fn::")):
                return self._intrinsic(key, argument, value)
        walked = (
            (key, self._walk(item, only_conditions=only_conditions)) for key, item in value.items()
        )
        return {key: item for key, item in walked if item is not NO_VALUE}

    def _intrinsic(self, key: str, argument: Any, value: Mapping[str, Any]) -> Any:
        if key == "Ref":
            return self.ref(argument)
        if key == "Fn::GetAtt":
            name, attribute = (
                argument if isinstance(argument, list) else str(argument).split(".", 1)
            )
            return self.get_att(name, attribute)
        if key == "Fn::Sub":
            return self._sub(argument)
        if key == "Fn::Join":
            delimiter, items = argument
            return str(delimiter).join(str(item) for item in self.resolve(items))
        if key == "Fn::Split":
            delimiter, text = argument
            return str(self.resolve(text)).split(str(delimiter))
        if key == "Fn::Select":
            index, items = argument
            return self.resolve(items)[int(self.resolve(index))]
        if key in ("Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition"):
            return self._truth(value, ())
        raise Unresolvable(f"{key} is not supported locally")

    def _sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        variables = self.resolve(variables)

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                return str(self.get_att(*name.split(".", 1)))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", substitute, text)

    def environment(self, spec: FunctionSpec) -> dict[str, str]:
        """The function's environment variables as strings; unresolvable ones are left out."""
        return self.resolve_variables(spec.environment, owner=spec.logical_id)

    def resolve_variables(self, variables: Mapping[str, Any], *, owner: str) -> dict[str, str]:
        """Environment variables (name -> template value) as strings; unresolvable ones left out.

        Leaving one out (with a warning) rather than failing keeps ``local up`` usable when
        the template grows a variable that only means something on AWS (an ARN of a resource
        the embedded backend does not create); the handler then sees its default.
        """
        resolved: dict[str, str] = {}
        for name, raw in variables.items():
            try:
                value = self.resolve(raw)
            except Unresolvable as exc:
                logger.warning("%s: leaving %s unset locally: %s", owner, name, exc)
                continue
            if value is NO_VALUE:  # Fn::If chose AWS::NoValue: the variable is not declared
                continue
            resolved[name] = cfn_string(value)
        return resolved


def cfn_string(value: Any) -> str:
    """A resolved scalar as CloudFormation passes it on: ``true``/``false``, ``20`` for 20.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
