"""template.yaml as the local runtime reads it: routes, stream source, FilterCriteria, env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wsfleet_local.backend import find_template, load_template
from wsfleet_local.eventfilter import RecordFilter
from wsfleet_local.stack import NO_VALUE, Route, StackResolver, Unresolvable, read_stack

EVENTS = Path(find_template()).parent / "events"


@pytest.fixture(scope="module")
def stack():
    return read_stack(load_template(find_template()))


def sample_records(name: str) -> list[dict]:
    return json.loads((EVENTS / f"{name}.json").read_text())["Records"]


def test_router_routes_come_from_the_template(stack):
    routes = set(stack.function("router").routes)
    assert Route("PUT", "/connections/{id}") in routes
    assert Route("GET", "/connections") in routes
    assert Route("POST", "/events") in routes


def test_stream_source_settings_come_from_the_template(stack):
    (source,) = stack.function("stream_notifier").streams
    assert source.table_logical_id == "ConnectionsTable"
    assert source.report_batch_item_failures
    template = load_template(find_template())
    (event,) = template["Resources"]["StreamNotifierFunction"]["Properties"]["Events"].values()
    # the template's bound, not the loader's default (-1: retry until the record expires)
    assert source.maximum_retry_attempts == event["Properties"]["MaximumRetryAttempts"] > 0
    assert source.filter_criteria["Filters"]


# The template's real pattern, against the checked-in samples of events/ (what AWS would send
# before filtering) and against hand-built transitions.
@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("stream_stop_modify", [True]),
        ("stream_ignored_modify", [False, False]),
        ("stream_insert", [False]),
        ("stream_batch_partial_failure", [True, True, False]),
    ],
)
def test_template_filter_on_event_samples(stack, sample, expected):
    keep = RecordFilter.from_criteria(stack.function("stream_notifier").streams[0].filter_criteria)
    assert [keep(record) for record in sample_records(sample)] == expected


def test_template_filter_drops_worker_items_and_removes(stack):
    keep = RecordFilter.from_criteria(stack.function("stream_notifier").streams[0].filter_criteria)
    worker_heartbeat = {
        "eventName": "MODIFY",
        "dynamodb": {
            "NewImage": {"pk": {"S": "WORKER#w1"}, "heartbeat_at_ms": {"N": "2"}},
            "OldImage": {"pk": {"S": "WORKER#w1"}, "heartbeat_at_ms": {"N": "1"}},
        },
    }
    removal = {"eventName": "REMOVE", "dynamodb": {"OldImage": {"desired_state": {"S": "STOPPED"}}}}
    assert not keep(worker_heartbeat)
    assert not keep(removal)


def test_resolver_evaluates_function_environment(stack):
    resolver = StackResolver(
        stack_name="demo",
        region="us-east-1",
        names={
            "ConnectionsTable": "demo-ConnectionsTable",
            "MessagesTable": "demo-MessagesTable",
            "HintQueue": "http://localhost/q",
        },
        parameters=stack.parameters,
        overrides={"LeaseSeconds": "4", "HeartbeatSeconds": "1", "AllowInsecureWs": "true"},
    )
    env = resolver.environment(stack.function("reconciler"))
    assert env["CONNECTIONS_TABLE"] == "demo-ConnectionsTable"
    assert env["HINT_QUEUE_URL"] == "http://localhost/q"
    assert env["LEASE_SECONDS"] == "4"
    assert env["CONTROL_QUEUE_PREFIX"] == "demo-ctl-"
    router_env = resolver.environment(stack.function("router"))
    assert router_env["ALLOW_INSECURE_WS"] == "true"
    worker_env = resolver.resolve_variables(stack.worker_environment, owner="worker")
    assert worker_env["CONTROL_QUEUE_PREFIX"] == env["CONTROL_QUEUE_PREFIX"]


def test_resolver_leaves_out_what_it_cannot_resolve():
    resolver = StackResolver(stack_name="s", region="r", names={}, parameters={})
    from wsfleet_local.stack import FunctionSpec

    spec = FunctionSpec(
        name="f",
        logical_id="F",
        handler="app.h",
        timeout_seconds=3,
        memory_mb=128,
        environment={"A": {"Ref": "Missing"}, "B": {"Fn::Sub": "${AWS::StackName}-x"}, "C": 5},
    )
    assert resolver.environment(spec) == {"B": "s-x", "C": "5"}


def test_resolver_evaluates_getatt_sub_and_join():
    resolver = StackResolver(
        stack_name="s",
        region="eu-west-1",
        names={"HintQueue": "http://q"},
        parameters={"Stage": {"Type": "String", "Default": "dev"}},
        attributes={("HintQueue", "Arn"): "arn:aws:sqs:eu-west-1:123456789012:s-HintQueue"},
    )

    assert resolver.resolve({"Fn::GetAtt": "HintQueue.Arn"}).endswith(":s-HintQueue")
    assert resolver.resolve({"Fn::Sub": "${HintQueue.Arn}|${AWS::AccountId}|${!Literal}"}) == (
        "arn:aws:sqs:eu-west-1:123456789012:s-HintQueue|123456789012|${Literal}"
    )
    assert resolver.resolve({"Fn::Sub": ["${X}-${Stage}", {"X": {"Ref": "AWS::Region"}}]}) == (
        "eu-west-1-dev"
    )
    assert resolver.resolve({"Fn::Join": [",", [{"Ref": "HintQueue"}, "b"]]}) == "http://q,b"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"Ref": "Missing"}, "Ref Missing"),
        ({"Fn::GetAtt": ["HintQueue", "Arn"]}, "GetAtt HintQueue.Arn"),
        ({"Fn::Sub": "${Missing.Arn}"}, "GetAtt Missing.Arn"),
        ({"Fn::If": ["Cond", 1, 2]}, "condition Cond is not in the template"),
        ({"Fn::FindInMap": ["M", "a", "b"]}, "Fn::FindInMap is not supported"),
    ],
)
def test_resolver_names_what_it_cannot_resolve(value, message):
    resolver = StackResolver(stack_name="s", region="r", names={"HintQueue": "q"}, parameters={})

    with pytest.raises(Unresolvable, match=message):
        resolver.resolve(value)


@pytest.mark.parametrize(
    ("route", "method", "path", "expected"),
    [
        (Route("GET", "/connections/{id}"), "GET", "/connections/a", {"id": "a"}),
        (Route("GET", "/connections/{id}"), "PUT", "/connections/a", None),
        (Route("GET", "/connections/{id}"), "GET", "/connections", None),
        (Route("GET", "/connections"), "GET", "/connections/", {}),
        (Route("ANY", "/p/{proxy+}"), "POST", "/p/a/b", {"proxy": "a/b"}),
    ],
)
def test_route_matching(route, method, path, expected):
    assert route.match(method, path) == expected


# ------------------------------------------------------------------ conditions
CONDITIONS = {
    "HasName": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Name"}, ""]}]},
    "IsProd": {"Fn::Equals": [{"Ref": "Stage"}, "prod"]},
    "ProdWithName": {"Fn::And": [{"Condition": "HasName"}, {"Condition": "IsProd"}]},
    "ProdOrName": {"Fn::Or": [{"Condition": "HasName"}, {"Condition": "IsProd"}]},
    "Big": {"Fn::Equals": [{"Ref": "Size"}, "20"]},
    "Loop": {"Fn::Not": [{"Condition": "Loop"}]},
}
PARAMETERS = {
    "Name": {"Type": "String", "Default": ""},
    "Stage": {"Type": "String", "Default": "dev"},
    "Size": {"Type": "Number", "Default": 20},
}


def resolver_with(**overrides):
    return StackResolver(
        stack_name="s", region="r", names={}, parameters=PARAMETERS, overrides=overrides,
        conditions=CONDITIONS,
    )


@pytest.mark.parametrize(
    ("overrides", "truth"),
    [
        ({}, {"HasName": False, "IsProd": False, "ProdWithName": False, "ProdOrName": False}),
        ({"Name": "x"}, {"HasName": True, "IsProd": False, "ProdWithName": False,
                         "ProdOrName": True}),
        ({"Name": "x", "Stage": "prod"}, {"HasName": True, "IsProd": True,
                                          "ProdWithName": True, "ProdOrName": True}),
    ],
)
def test_conditions_evaluate_equals_not_and_or_and_condition(overrides, truth):
    resolver = resolver_with(**overrides)
    assert {name: resolver.condition(name) for name in truth} == truth
    # a Number parameter compares as CloudFormation compares it: as a string
    assert resolver.condition("Big") is True


def test_if_picks_a_branch_and_no_value_leaves_the_entry_out():
    value = {
        "Name": {"Fn::If": ["HasName", {"Ref": "Name"}, {"Ref": "AWS::NoValue"}]},
        "List": ["a", {"Fn::If": ["HasName", "b", {"Ref": "AWS::NoValue"}]}, "c"],
        "Stage": {"Fn::If": ["IsProd", "live", {"Fn::Sub": "${Stage}-test"}]},
    }
    assert resolver_with().resolve(value) == {"List": ["a", "c"], "Stage": "dev-test"}
    assert resolver_with(Name="n", Stage="prod").resolve(value) == {
        "Name": "n", "List": ["a", "b", "c"], "Stage": "live",
    }
    assert resolver_with().resolve({"Ref": "AWS::NoValue"}) is NO_VALUE


def test_split_select_and_conditions_as_values():
    resolver = resolver_with(Name="a,b,c")
    assert resolver.resolve({"Fn::Split": [",", {"Ref": "Name"}]}) == ["a", "b", "c"]
    assert resolver.resolve({"Fn::Select": [1, {"Fn::Split": [",", {"Ref": "Name"}]}]}) == "b"
    assert resolver.resolve({"Fn::Not": [{"Condition": "IsProd"}]}) is True


def test_resolve_conditions_leaves_every_other_intrinsic_as_written():
    policy = {
        "Statement": [
            {"Resource": {"Fn::GetAtt": ["Table", "Arn"]}},
            {"Fn::If": ["HasName", {"Resource": {"Fn::Sub": "${Name}*"}}, {"Ref": "AWS::NoValue"}]},
        ]
    }
    assert resolver_with().resolve_conditions(policy) == {
        "Statement": [{"Resource": {"Fn::GetAtt": ["Table", "Arn"]}}]
    }
    assert resolver_with(Name="p").resolve_conditions(policy)["Statement"][1] == {
        "Resource": {"Fn::Sub": "${Name}*"}
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"Fn::If": ["Loop", 1, 2]}, "condition Loop refers to itself"),
        ({"Fn::If": ["Nope", 1, 2]}, "condition Nope is not in"),
    ],
)
def test_bad_conditions_are_named(value, message):
    with pytest.raises(Unresolvable, match=message):
        resolver_with().resolve(value)


def test_the_local_endpoint_variable_follows_the_template_condition(stack):
    # GIVEN the template's Globals: AWS_ENDPOINT_URL only when LocalEndpointUrl is given
    def router_env(**overrides):
        resolver = StackResolver(
            stack_name="demo", region="us-east-1",
            names={"ConnectionsTable": "t", "MessagesTable": "m", "HintQueue": "q"},
            parameters=stack.parameters, overrides=overrides, conditions=stack.conditions,
        )
        return resolver.environment(stack.function("router"))

    # THEN a deployed stack (the default) declares no such variable, and sam local gets it
    assert "AWS_ENDPOINT_URL" not in router_env()
    assert router_env(LocalEndpointUrl="http://127.0.0.1:4566")["AWS_ENDPOINT_URL"] == (
        "http://127.0.0.1:4566"
    )


def test_the_router_gets_the_secret_prefixes_the_stack_is_given(stack):
    prefixes = (
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/,"
        "arn:aws:ssm:us-east-1:123456789012:parameter/wsfleet/"
    )

    def router_env(**overrides):
        return StackResolver(
            stack_name="demo", region="us-east-1",
            names={"ConnectionsTable": "t", "MessagesTable": "m", "HintQueue": "q"},
            parameters=stack.parameters, overrides=overrides, conditions=stack.conditions,
        ).environment(stack.function("router"))

    assert router_env()["UPSTREAM_SECRET_PREFIXES"] == ""  # off by default
    assert router_env(UpstreamSecretPrefix=prefixes)["UPSTREAM_SECRET_PREFIXES"] == prefixes
