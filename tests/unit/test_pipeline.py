"""The deploy workflow (.github/workflows/pipeline.yaml) against the Makefile and the README.

check-jsonschema (in .ci/lint) checks the workflow against its schema; this checks what it
promises: OIDC roles and no stored keys, the stages in the `sam pipeline init` order with prod
behind an environment, the worker image built with the Makefile's own target and deployed by
digest, and commands that are the ones the Makefile and README document.
"""

from __future__ import annotations

import re
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
        assert "--capabilities CAPABILITY_IAM" in deploy  # as samconfig.toml


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
    # the integration check uses the CLI options README documents
    check = runs(workflow, "integration-test")
    assert "--json" in check and "--json" in readme
    assert "wsfleet status --all --table" in check and "wsfleet status --table" in readme
