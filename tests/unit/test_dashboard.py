"""The CloudWatch dashboard shows what the docs and the runbook ask operators to look at.

Every metric the code emits and docs/deploy.md, docs/leases.md or the README names has a line
on a metric widget, in the namespace and with the dimension its emitter uses; every alarm of
the template is on the alarm widget (a conditional one through the Sub variable that carries
it only when its condition holds); a stack without an alarm topic says so in its outputs.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wsfleet_local.backend import load_template

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/deploy.md", "docs/leases.md", "README.md")
WORKER_DIMENSION = ("ServiceName", "STACK-worker")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def emitted_metrics() -> dict[str, tuple[str, str]]:
    """Metric name -> the dimension its emitter puts on it (as the dashboard must name it)."""
    found: dict[str, tuple[str, str]] = {}
    for app in sorted((ROOT / "functions").glob("*/app.py")):
        service = "STACK-" + app.parent.name.replace("_", "-")
        for name in re.findall(r'add_metric\(\s*name="([A-Za-z]+)"', app.read_text()):
            found[name] = ("service", service)
    for module in sorted((ROOT / "worker" / "wsfleet_worker").glob("*.py")):
        text = module.read_text()
        for name in re.findall(r'\.(?:count|observe|gauge)\(\s*"([A-Za-z]+)"', text):
            found[name] = WORKER_DIMENSION
        if module.name == "observability.py":
            for group in ("COUNTERS", "GAUGES", "MAXIMA"):
                (listed,) = re.findall(rf"^{group} = \((.*?)\)$", text, flags=re.M | re.S)
                for name in re.findall(r'"([A-Za-z]+)"', listed):
                    found[name] = WORKER_DIMENSION
    return found


def named_in_docs(metrics: dict[str, tuple[str, str]]) -> set[str]:
    text = "\n".join((ROOT / doc).read_text() for doc in DOCS)
    return {name for name in metrics if f"`{name}`" in text}


def body(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dashboard body as JSON (the stack name as STACK, other references by name) and the
    Sub variables."""
    text, variables = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    text = text.replace("${SinkAlarmArns}", "").replace("${AWS::StackName}", "STACK")
    text = re.sub(r"(?<=: )\$\{[^}]+\}(\d*)(?=[,}\s])", "1", text)  # numbers (annotations)
    text = re.sub(r"\$\{([^}]+)\}", r"\1", text)
    return json.loads(text), variables


def metric_lines(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(namespace, metric, dimensions) of every line of every metric widget, with CloudWatch's
    "." (same as the line above) and "..." (the line above, other options) resolved."""
    for widget in dashboard["widgets"]:
        if widget["type"] != "metric":
            continue
        previous: list[Any] = []
        for line in widget["properties"]["metrics"]:
            fields = [item for item in line if not isinstance(item, dict)]
            if not fields:
                continue  # a math expression
            if fields == ["..."]:
                fields = list(previous)
            fields = [previous[i] if item == "." else item for i, item in enumerate(fields)]
            previous = fields
            yield fields[0], fields[1], tuple(fields[2:])


def test_every_metric_the_docs_name_has_a_line_with_its_dimension(
    template: dict[str, Any],
) -> None:
    # GIVEN what the code emits and what the docs name
    metrics = emitted_metrics()
    named = named_in_docs(metrics)
    # (the runbook's own questions, whichever way the docs phrase them)
    required = {
        "PassMs", "RenewLatenessMs", "TaskExitsFailedOver", "ResumeGapFrames",
        "BreakerFailures", "ConnectionsFailed",
    }
    assert required <= named, required - named
    dashboard, _ = body(template)
    shown = {
        (metric, dimensions)
        for namespace, metric, dimensions in metric_lines(dashboard)
        if namespace == "wsfleet"
    }

    # THEN each has a line, with the dimension its emitter writes
    for name in sorted(named):
        assert (name, metrics[name]) in shown, (name, metrics[name])


def test_the_task_exit_function_and_its_queue_are_on_the_dashboard(
    template: dict[str, Any],
) -> None:
    dashboard, _ = body(template)
    lines = set(metric_lines(dashboard))
    assert ("AWS/Lambda", "Errors", ("FunctionName", "TaskExitFunction")) in lines
    assert (
        "AWS/SQS", "ApproximateNumberOfMessagesVisible",
        ("QueueName", "TaskExitDeadLetterQueue.QueueName"),
    ) in lines
    # hand-off time: the worker log's session ends and starts, by connection
    (log,) = [w for w in dashboard["widgets"] if w["type"] == "log"]
    query = log["properties"]["query"]
    assert query.startswith("SOURCE 'WorkerLogGroup'")
    assert "'session started'" in query and "'session finished'" in query
    assert "Hand-off time" in log["properties"]["title"]


def test_every_alarm_is_on_the_alarm_widget(template: dict[str, Any]) -> None:
    # GIVEN the template's alarms, some of them conditional
    alarms = {
        name: resource.get("Condition")
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }
    dashboard, variables = body(template)
    (widget,) = [w for w in dashboard["widgets"] if w["type"] == "alarm"]
    listed = set(widget["properties"]["alarms"])
    conditional = json.dumps(variables)

    for name, condition in alarms.items():
        if condition is None:
            # THEN every unconditional alarm is listed
            assert f"{name}.Arn" in listed, name
        else:
            # AND a conditional one comes in through the variable, under its condition
            assert f"${{{name}.Arn}}" in conditional, name
            assert condition in conditional, (name, condition)
    assert len(listed) == sum(c is None for c in alarms.values())


def test_a_stack_without_an_alarm_topic_warns(template: dict[str, Any]) -> None:
    output = template["Outputs"]["AlarmsNotifyNobody"]
    assert template["Conditions"][output["Condition"]] == {
        "Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]
    }
    assert "WARNING" in output["Description"]
    # the prod environment carries the placeholder, commented out (a real ARN is the user's)
    text = (ROOT / "samconfig.toml").read_text()
    prod = text[text.index("[prod.deploy.parameters]"):]
    assert re.search(r'^\s*# "AlarmTopicArn=\\"arn:aws:sns:<region>:<account>:<topic>\\"",$',
                     prod, flags=re.M)
    overrides = tomllib.loads(text)["prod"]["deploy"]["parameters"]["parameter_overrides"]
    assert not any(item.startswith("AlarmTopicArn=") for item in overrides)


def test_the_body_is_json_with_every_sink_alarm_value(template: dict[str, Any]) -> None:
    text, variables = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    choice = variables["SinkAlarmArns"]["Fn::If"]
    values = [choice[1]["Fn::Sub"], choice[2]["Fn::If"][1]["Fn::Sub"], choice[2]["Fn::If"][2]]
    for value in values:
        filled = text.replace("${SinkAlarmArns}", value)
        filled = re.sub(r"(?<=: )\$\{[^}]+\}(\d*)(?=[,}\s])", "1", filled)
        alarms = json.loads(re.sub(r"\$\{([^}]+)\}", r"\1", filled))["widgets"][7]
        assert alarms["type"] == "alarm"
        assert len(alarms["properties"]["alarms"]) == 10 + value.count(".Arn")
