"""`make tune`: a parameter-only change of a deployed stack (wsfleet_local.tune).

Against CloudFormation on the embedded moto server: a stack with wsfleet's parameters is
created, then tuned with `make tune` as the docs show it. The exact UpdateStack request is
checked too (botocore's Stubber), and the Makefile's --region handling with `make -n`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from wsfleet_local.tune import TuneError, UsageError, parse_assignments, tune, update_stack_request

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class _Loader(yaml.SafeLoader):
    """template.yaml with its short-form intrinsics read as nothing (only Parameters used)."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
TEMPLATE_PARAMETERS: dict[str, Any] = yaml.load(
    (ROOT / "template.yaml").read_text(), Loader=_Loader
)["Parameters"]


def stack_template() -> str:
    """template.yaml's own Parameters (so tune meets the real names) around one resource moto
    can create; the SAM transform itself is not moto's to expand."""
    parameters = {name: dict(spec) for name, spec in TEMPLATE_PARAMETERS.items()}
    for spec in parameters.values():  # moto does not know the AWS-specific types
        if spec["Type"].startswith(("AWS::", "List<AWS::")):
            spec["Type"] = "String"
    return yaml.safe_dump(
        {
            "AWSTemplateFormatVersion": "2010-09-09",
            "Parameters": parameters,
            "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        }
    )


REQUIRED = {
    "WorkerImageUri": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/wsfleet-worker@sha256:"
    + "ab" * 32,
    "VpcId": "vpc-0123456789abcdef0",
    "SubnetIds": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
    "Stage": "prod",
    "LeaseSeconds": "30",
}


@pytest.fixture
def stack(backend: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    name = f"wsfleet-tune-{os.getpid()}-{id(cloudformation) % 10_000}"
    cloudformation.create_stack(
        StackName=name,
        TemplateBody=stack_template(),
        # every value given: moto keeps only given ones for UsePreviousValue (CloudFormation
        # keeps defaulted ones too)
        Parameters=[
            {"ParameterKey": k, "ParameterValue": REQUIRED.get(k, str(spec.get("Default", "")))}
            for k, spec in TEMPLATE_PARAMETERS.items()
        ],
        Capabilities=["CAPABILITY_IAM"],
    )
    yield cloudformation, name
    cloudformation.delete_stack(StackName=name)


def parameters(cloudformation: Any, name: str) -> dict[str, str]:
    (described,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    return {p["ParameterKey"]: p["ParameterValue"] for p in described["Parameters"]}


def make(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # -o: the venv this test runs in counts as installed; BIN: use it
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", f"BIN={BIN}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **env},
    )


def test_make_tune_changes_only_the_given_parameter_and_keeps_the_template(
    stack: tuple[Any, str],
) -> None:
    # GIVEN a deployed stack
    cloudformation, name = stack
    before = parameters(cloudformation, name)
    template_before = cloudformation.get_template(StackName=name)["TemplateBody"]

    # WHEN the operator changes the schedule as docs/deploy.md shows, naming nothing else
    result = make(
        "tune", f"STACK={name}", "REGION=us-east-1",
        "SET='ReconcileSchedule=rate(5 minutes)'",
    )

    # THEN only that parameter changed: the required ones and an earlier tuning are kept
    assert result.returncode == 0, result.stdout + result.stderr
    after = parameters(cloudformation, name)
    assert after["ReconcileSchedule"] == "rate(5 minutes)"
    assert {k: v for k, v in after.items() if k != "ReconcileSchedule"} == {
        k: v for k, v in before.items() if k != "ReconcileSchedule"
    }
    assert after["LeaseSeconds"] == "30" and after["WorkerImageUri"] == REQUIRED["WorkerImageUri"]
    # AND the deployed template (so the deployed code) is the one the stack keeps
    assert cloudformation.get_template(StackName=name)["TemplateBody"] == template_before
    (described,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    assert described["StackStatus"] == "UPDATE_COMPLETE"
    assert "UPDATE_COMPLETE with ReconcileSchedule=rate(5 minutes)" in result.stdout


def test_the_same_values_again_are_nothing_to_do() -> None:
    # (moto compares typed and string values and updates anyway; CloudFormation answers so)
    client = boto3.client("cloudformation", region_name="eu-west-1")
    with Stubber(client) as stubber:
        stubber.add_response("describe_stacks", {"Stacks": [DESCRIBED]})
        stubber.add_client_error(
            "update_stack", "ValidationError", "No updates are to be performed."
        )
        assert tune(client, "wsfleet-prod", {"LeaseSeconds": "30"}) == "UNCHANGED"
        stubber.add_response("describe_stacks", {"Stacks": [DESCRIBED]})
        stubber.add_client_error(
            "update_stack", "ValidationError", "Template error: rule LeaseCovers... failed"
        )
        with pytest.raises(TuneError, match="refused the update"):
            tune(client, "wsfleet-prod", {"LeaseSeconds": "3"})


def test_an_unknown_parameter_is_refused_before_any_update(stack: tuple[Any, str]) -> None:
    cloudformation, name = stack

    result = make("tune", f"STACK={name}", "REGION=us-east-1", "SET=ReconcileEvery=5")

    assert result.returncode == 2
    assert "ReconcileEvery: not a parameter of" in result.stderr
    assert "ReconcileSchedule" in result.stderr  # it lists the valid names
    (described,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
    assert described["StackStatus"] == "CREATE_COMPLETE"


DESCRIBED = {
    "StackName": "wsfleet-prod",
    "StackStatus": "UPDATE_COMPLETE",
    "CreationTime": "2026-01-01T00:00:00Z",
    "Capabilities": ["CAPABILITY_IAM"],
    "Parameters": [
        {"ParameterKey": "ReconcileSchedule", "ParameterValue": "rate(1 minute)"},
        {"ParameterKey": "LeaseSeconds", "ParameterValue": "30"},
        {"ParameterKey": "WorkerImageUri", "ParameterValue": "x"},
    ],
}


def test_the_exact_update_stack_call() -> None:
    # GIVEN a stack as describe_stacks returns it
    client = boto3.client("cloudformation", region_name="eu-west-1")
    with Stubber(client) as stubber:
        stubber.add_response(
            "describe_stacks", {"Stacks": [DESCRIBED]}, {"StackName": "wsfleet-prod"}
        )
        # THEN exactly one UpdateStack: previous template, one value, the rest previous values
        stubber.add_response(
            "update_stack",
            {"StackId": "arn:aws:cloudformation:eu-west-1:123456789012:stack/wsfleet-prod/1"},
            {
                "StackName": "wsfleet-prod",
                "UsePreviousTemplate": True,
                "Parameters": [
                    {"ParameterKey": "ReconcileSchedule", "ParameterValue": "rate(5 minutes)"},
                    {"ParameterKey": "LeaseSeconds", "UsePreviousValue": True},
                    {"ParameterKey": "WorkerImageUri", "UsePreviousValue": True},
                ],
                "Capabilities": ["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
            },
        )
        # WHEN tuned without waiting
        outcome = tune(client, "wsfleet-prod", {"ReconcileSchedule": "rate(5 minutes)"}, wait=False)
        stubber.assert_no_pending_responses()
    assert outcome == "UPDATE_IN_PROGRESS"


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        ([], "at least one"),
        (["ReconcileSchedule"], "expected ParameterName=value"),
        (["=5"], "expected ParameterName=value"),
        (["LeaseSeconds=30", "LeaseSeconds=40"], "given twice"),
    ],
)
def test_bad_assignments(assignments: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_assignments(assignments)


def test_values_keep_their_spaces_equals_signs_and_commas() -> None:
    assert parse_assignments(
        ["ReconcileSchedule=cron(0/5 * * * ? *)", "AllowedUpstreamHosts=a.com,b.com", "X=a=b"]
    ) == {
        "ReconcileSchedule": "cron(0/5 * * * ? *)",
        "AllowedUpstreamHosts": "a.com,b.com",
        "X": "a=b",
    }
    assert issubclass(UsageError, TuneError)
    request = update_stack_request({"StackName": "s", "Parameters": []}, {})
    assert request["Parameters"] == [] and request["UsePreviousTemplate"] is True


@pytest.mark.parametrize("target", ["deploy", "push", "tune"])
def test_make_leaves_region_out_when_it_is_empty(target: str) -> None:
    common = ["REGISTRY=123456789012.dkr.ecr.eu-west-1.amazonaws.com", "TAG=t", "STACK=s"]
    empty = make("-n", target, "REGION=", *common, AWS_REGION="", AWS_DEFAULT_REGION="")
    given = make("-n", target, "REGION=eu-west-1", *common)

    assert empty.returncode == 0 and given.returncode == 0, empty.stderr + given.stderr
    assert "--region" not in empty.stdout
    assert "--region eu-west-1" in given.stdout
