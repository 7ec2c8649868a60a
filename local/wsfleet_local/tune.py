"""Change stack parameters without touching code: ``make tune`` (docs/deploy.md, "Tuning").

A parameter-only change must never rebuild or re-upload anything: ``sam deploy`` without a
fresh ``sam build`` ships whatever ``.aws-sam/build`` holds (stale code), or, with none, the raw
source (a layer without its dependencies). This is CloudFormation's own path for it: one
``UpdateStack`` with ``UsePreviousTemplate`` (the deployed template, so the deployed code and
image), the given parameters set and every other parameter ``UsePreviousValue``, so nobody
re-types a value to keep it. The stack's service role and tags are kept (UpdateStack keeps both
when they are not given).

Usage::

    python -m wsfleet_local.tune --stack-name wsfleet-prod 'ReconcileSchedule=rate(5 minutes)'
    python -m wsfleet_local.tune --stack-name wsfleet-prod LeaseSeconds=30 HeartbeatSeconds=10

Exit status: 0 when the stack was updated (or already had these values), 1 when CloudFormation
refused or rolled the update back, 2 for a usage error (an unknown parameter, no change given).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TuneError", "UsageError", "main", "parse_assignments", "tune", "update_stack_request"]

#: A SAM stack's template has a transform (CAPABILITY_AUTO_EXPAND) and creates IAM roles.
CAPABILITIES = ("CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND")


class TuneError(Exception):
    """A change that could not be made (the message says why)."""


class UsageError(TuneError):
    """A change asked for wrongly: no assignment, a malformed one, an unknown parameter."""


def parse_assignments(assignments: Sequence[str]) -> dict[str, str]:
    """``["Key=Value", ...]`` as a dict; a value may itself contain ``=``, spaces or commas."""
    changes: dict[str, str] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise UsageError(f"expected ParameterName=value, got {assignment!r}")
        if key in changes:
            raise UsageError(f"{key} is given twice")
        changes[key] = value
    if not changes:
        raise UsageError("give at least one ParameterName=value to change")
    return changes


def update_stack_request(
    stack: Mapping[str, Any], changes: Mapping[str, str]
) -> dict[str, Any]:
    """The UpdateStack request that sets ``changes`` on the stack ``describe_stacks`` returned
    and keeps everything else: template, the other parameters' values, role and tags."""
    name = stack["StackName"]
    current = [parameter["ParameterKey"] for parameter in stack.get("Parameters", [])]
    unknown = sorted(set(changes) - set(current))
    if unknown:
        raise UsageError(
            f"{', '.join(unknown)}: not a parameter of {name} "
            f"(its parameters: {', '.join(sorted(current))})"
        )
    parameters: list[dict[str, Any]] = [
        {"ParameterKey": key, "ParameterValue": changes[key]}
        if key in changes
        else {"ParameterKey": key, "UsePreviousValue": True}
        for key in current
    ]
    capabilities = list(dict.fromkeys([*stack.get("Capabilities", []), *CAPABILITIES]))
    return {
        "StackName": name,
        "UsePreviousTemplate": True,
        "Parameters": parameters,
        "Capabilities": capabilities,
    }


def tune(
    cloudformation: Any, stack_name: str, changes: Mapping[str, str], *, wait: bool = True
) -> str:
    """Apply ``changes`` to ``stack_name``; the stack's final status (or ``"UNCHANGED"``)."""
    from botocore.exceptions import ClientError, WaiterError

    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        raise TuneError(f"cannot read stack {stack_name}: {exc}") from exc
    request = update_stack_request(stack, changes)
    try:
        cloudformation.update_stack(**request)
    except ClientError as exc:
        if "No updates are to be performed" in str(exc):
            return "UNCHANGED"
        raise TuneError(f"CloudFormation refused the update: {exc}") from exc
    if not wait:
        return "UPDATE_IN_PROGRESS"
    try:
        cloudformation.get_waiter("stack_update_complete").wait(
            StackName=stack_name, WaiterConfig={"Delay": 5, "MaxAttempts": 720}
        )
    except WaiterError as exc:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        reason = stack.get("StackStatusReason", "")
        raise TuneError(f"the update did not complete: {stack['StackStatus']} {reason}") from exc
    return "UPDATE_COMPLETE"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wsfleet_local.tune",
        description="Set stack parameters with the deployed template; keep all other values.",
    )
    parser.add_argument("--stack-name", required=True, help="the deployed stack")
    parser.add_argument("--region", help="its region (default: the AWS CLI/boto3 default)")
    parser.add_argument(
        "--no-wait", action="store_true", help="return once CloudFormation accepted the update"
    )
    parser.add_argument("assignments", nargs="*", metavar="ParameterName=value")
    args = parser.parse_args(argv)
    try:
        changes = parse_assignments(args.assignments)
    except UsageError as exc:
        parser.error(str(exc))

    import boto3

    cloudformation = boto3.client("cloudformation", region_name=args.region or None)
    try:
        outcome = tune(cloudformation, args.stack_name, changes, wait=not args.no_wait)
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    changed = ", ".join(f"{key}={value}" for key, value in changes.items())
    if outcome == "UNCHANGED":
        print(f"{args.stack_name}: already {changed}; nothing to do")
    else:
        print(f"{args.stack_name}: {outcome} with {changed} (template and other values kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
