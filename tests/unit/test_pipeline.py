"""The deploy workflow (.github/workflows/pipeline.yaml) against the Makefile and the README.

actionlint (in .ci/lint) checks the workflow's syntax and scripts; this checks what it
promises: OIDC roles and no stored keys, the stages in the `sam pipeline init` order with prod
behind an environment, the worker image built with the Makefile's own target and deployed by
digest, and commands that are the ones the Makefile and README document.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "pipeline.yaml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(workflow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    return list(workflow["jobs"][job]["steps"])


def runs(workflow: dict[str, Any], job: str) -> str:
    return "\n".join(step.get("run", "") for step in steps(workflow, job))


def commands(script: str) -> list[str]:
    """Shell commands of a run script, continuation lines joined, whitespace collapsed."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z-]*):", text, flags=re.MULTILINE))


def test_every_aws_step_assumes_a_role_through_oidc(workflow: dict[str, Any]) -> None:
    assert workflow["permissions"]["id-token"] == "write"
    text = WORKFLOW.read_text()
    assert "aws-access-key-id" not in text and "secrets." not in text
    for job in workflow["jobs"]:
        for step in steps(workflow, job):
            if str(step.get("uses", "")).startswith("aws-actions/configure-aws-credentials"):
                assert step["with"]["role-to-assume"].startswith("${{ env."), job


def test_stages_run_in_the_sam_pipeline_order(workflow: dict[str, Any]) -> None:
    jobs = workflow["jobs"]
    assert jobs["build-and-package"]["needs"] == ["test"]
    assert jobs["deploy-testing"]["needs"] == ["build-and-package"]
    assert jobs["integration-test"]["needs"] == ["deploy-testing"]
    assert "integration-test" in jobs["deploy-prod"]["needs"]
    # the approval gate: required reviewers on this environment
    assert jobs["deploy-prod"]["environment"] == "production"
    assert "environment" not in jobs["deploy-testing"]


def test_worker_image_is_pushed_with_the_makefile_and_deployed_by_digest(
    workflow: dict[str, Any],
) -> None:
    build = runs(workflow, "build-and-package")
    assert "push" in makefile_targets()
    for stage in ("TESTING", "PROD"):
        assert f'make push REGION="${{{stage}_REGION}}" REPO="${{{stage}_ECR_REPOSITORY}}"' in build
    # `make push` writes the digest URI; the deploy jobs pass exactly that output
    assert build.count("cat .worker-image-uri") == 2
    assert "@sha256:" in (ROOT / "Makefile").read_text()
    for job, output in (("deploy-testing", "testing_image"), ("deploy-prod", "prod_image")):
        (deploy,) = [s for s in steps(workflow, job) if "sam deploy" in s.get("run", "")]
        assert deploy["env"]["WORKER_IMAGE_URI"] == (
            f"${{{{ needs.build-and-package.outputs.{output} }}}}"
        )
        assert '"WorkerImageUri=${WORKER_IMAGE_URI}"' in deploy["run"]


def test_deploys_give_every_parameter_without_a_default(workflow: dict[str, Any]) -> None:
    template = (ROOT / "template.yaml").read_text()
    required = {"WorkerImageUri", "VpcId", "SubnetIds"}
    for name in required:
        assert re.search(rf"^  {name}:\n    Type: [^\n]+\n(?!    Default)", template, re.M), name
    for job in ("deploy-testing", "deploy-prod"):
        (deploy,) = [c for c in commands(runs(workflow, job)) if c.startswith("sam deploy")]
        given = set(re.findall(r'"([A-Za-z]+)=', deploy))
        assert required | {"Stage"} <= given, job


def test_commands_are_the_ones_the_makefile_and_readme_document(workflow: dict[str, Any]) -> None:
    readme = (ROOT / "README.md").read_text()
    targets = makefile_targets()
    for job in workflow["jobs"]:
        for command in commands(runs(workflow, job)):
            if command.startswith("make "):
                target = command.split()[1]
                assert target in targets, command
                assert f"make {target}" in readme, command
    assert "sam build" in commands(runs(workflow, "build-and-package"))[0]
    assert "`make push`" in readme and "`make deploy" in readme
    # the integration check is a script of its own (tests/integration/test_pipeline_check.py
    # runs it against `wsfleet local up`)
    check = runs(workflow, "integration-test")
    assert '.github/scripts/integration-check "$api" "ci-' in check


# ============================================================================ sam and samconfig
def sam_commands(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    """(job, command) for every `sam` command of the workflow, continuation lines joined."""
    return [
        (job, command)
        for job in workflow["jobs"]
        for command in commands(runs(workflow, job))
        if command.startswith("sam ")
    ]


def test_every_sam_command_uses_the_pipeline_config_env_and_nothing_else(
    workflow: dict[str, Any],
) -> None:
    # GIVEN the workflow's sam commands and samconfig.toml
    found = sam_commands(workflow)
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())["pipeline"]

    # THEN each reads the pipeline environment (without --config-env, SAM reads `default`:
    # its resolve_s3 conflicts with --s3-bucket, its confirm_changeset waits for a terminal,
    # and its tags and s3_prefix belong to another stack)
    assert {c.split()[1] for _, c in found} == {"build", "package", "deploy"}
    for job, command in found:
        assert "--config-env pipeline" in command, (job, command)
    # AND that environment holds only what every stage shares: no prompt, no bucket of its own
    deploy = config["deploy"]["parameters"]
    assert deploy == {
        "confirm_changeset": False,
        "fail_on_empty_changeset": False,
        "capabilities": "CAPABILITY_IAM",
    }
    assert set(config) == {"build", "deploy"}
    assert "global" not in config  # no stack name or region: each stage gives its own
    # AND each deploy names its stage's bucket, region, stack and CloudFormation role
    for job, command in found:
        if command.startswith("sam deploy"):
            stage = "PROD" if "prod" in job else "TESTING"
            for flag in ("--stack-name", "--region", "--s3-bucket", "--role-arn"):
                assert re.search(rf'{flag} "\$\{{{stage}_', command), (job, flag)
            assert "--resolve-s3" not in command and "--guided" not in command


# ============================================================================ actions
# Majors whose action runs on node24 (node20 left GitHub's runners on 2026-09-23); actionlint in
# .ci/lint knows the actions/* and configure-aws-credentials runtimes, setup-sam's is read from
# its action.yml (`using: node24` from v3).
NODE24_MAJORS = {
    "actions/checkout": 5,
    "actions/setup-python": 6,
    "actions/upload-artifact": 6,
    "actions/download-artifact": 7,
    "aws-actions/configure-aws-credentials": 6,
    "aws-actions/setup-sam": 3,
}


def test_every_action_runs_on_node24_and_sam_is_the_tested_version(
    workflow: dict[str, Any],
) -> None:
    lint = (ROOT / ".ci" / "lint").read_text()
    (tested,) = re.findall(r"^readonly SAM_CLI_VERSION=(\S+)$", lint, flags=re.MULTILINE)
    for job in workflow["jobs"]:
        for step in steps(workflow, job):
            if "uses" not in step:
                continue
            action, _, version = step["uses"].partition("@")
            assert action in NODE24_MAJORS, action
            assert re.fullmatch(r"v\d+", version) and int(version[1:]) >= NODE24_MAJORS[action]
            if action == "aws-actions/setup-sam":
                # the commands tests/integration/test_pipeline_sam_commands.py ran
                assert step["with"]["version"] == tested, job


# ============================================================================ OIDC trust
ORG_REPO = "acme/wsfleet"
TOKEN = "token.actions.githubusercontent.com"
# What `sam pipeline bootstrap --oidc-provider github-actions --deployment-branch main` puts in
# the pipeline execution role's trust policy (samcli/lib/pipeline/bootstrap/
# stage_resources.yaml with GitHubOidcProvider.get_subject_claim();
# tests/integration/test_pipeline_sam_commands.py checks it against the installed SAM CLI).
BOOTSTRAP_CONDITION = {
    "ForAllValues:StringLike": {
        f"{TOKEN}:aud": "sts.amazonaws.com",
        f"{TOKEN}:sub": f"repo:{ORG_REPO}:ref:refs/heads/main",
    }
}


def documented_prod_trust() -> dict[str, Any]:
    """docs/pipeline/prod-trust-policy.json, filled in as docs/deploy.md says."""
    text = (ROOT / "docs" / "pipeline" / "prod-trust-policy.json").read_text()
    text = text.replace("<ORG>/<REPO>", ORG_REPO).replace("<ACCOUNT>", "123456789012")
    assert "<" not in text
    (statement,) = json.loads(text)["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"].endswith(f":oidc-provider/{TOKEN}")
    return dict(statement["Condition"])


def trusts(condition: dict[str, Any], claims: dict[str, str]) -> bool:
    """Whether an OIDC token with ``claims`` meets an IAM trust ``condition`` (the operators a
    trust policy for GitHub uses: StringEquals / StringLike, optionally ForAllValues:)."""
    for operator, keys in condition.items():
        like = operator.endswith("StringLike")
        assert operator.removeprefix("ForAllValues:") in ("StringEquals", "StringLike")
        for key, allowed in keys.items():
            value = claims[key.removeprefix(f"{TOKEN}:")]
            patterns = allowed if isinstance(allowed, list) else [allowed]
            if not any(fnmatch.fnmatchcase(value, p) if like else value == p for p in patterns):
                return False
    return True


def oidc_subject(job: dict[str, Any]) -> str:
    """The `sub` claim GitHub puts in a job's token on a push to main (its default format):
    a job in an environment gets the environment's name instead of the ref."""
    environment = job.get("environment")
    if environment:
        name = environment if isinstance(environment, str) else environment["name"]
        return f"repo:{ORG_REPO}:environment:{name}"
    return f"repo:{ORG_REPO}:ref:refs/heads/main"


def test_every_job_can_assume_its_stage_role(workflow: dict[str, Any]) -> None:
    # GIVEN the trust of each stage's pipeline role: testing as bootstrap creates it, prod as
    # docs/deploy.md has it changed after bootstrap (its deploy job runs in the `production`
    # environment, whose required reviewers are the approval gate)
    trust = {"TESTING": BOOTSTRAP_CONDITION, "PROD": documented_prod_trust()}
    assumed = set()
    for name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if not str(step.get("uses", "")).startswith("aws-actions/configure-aws-credentials"):
                continue
            role = step["with"]["role-to-assume"]
            (stage,) = re.findall(r"env\.(TESTING|PROD)_PIPELINE_EXECUTION_ROLE", role)
            claims = {"sub": oidc_subject(job), "aud": "sts.amazonaws.com"}
            # THEN the token of every job that assumes a role is one the role trusts
            assert trusts(trust[stage], claims), (name, stage, claims["sub"])
            assumed.add((name, stage))
    assert ("deploy-prod", "PROD") in assumed and ("build-and-package", "PROD") in assumed


def test_prod_trust_admits_only_main_and_the_production_environment() -> None:
    prod = documented_prod_trust()
    for sub in (
        f"repo:{ORG_REPO}:ref:refs/heads/feature",
        f"repo:{ORG_REPO}:pull_request",
        f"repo:{ORG_REPO}:environment:staging",
        "repo:other/wsfleet:environment:production",
    ):
        assert not trusts(prod, {"sub": sub, "aud": "sts.amazonaws.com"}), sub
    assert not trusts(
        prod, {"sub": f"repo:{ORG_REPO}:environment:production", "aud": "other"}
    )
    # the bootstrap trust is what made the prod deploy fail: its token names the environment
    assert not trusts(
        BOOTSTRAP_CONDITION,
        {"sub": f"repo:{ORG_REPO}:environment:production", "aud": "sts.amazonaws.com"},
    )
