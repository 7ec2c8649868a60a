"""Every `sam` command of .github/workflows/pipeline.yaml, run as written with SAM CLI.

Each job's `run:` steps that call sam are run by bash exactly as the workflow has them, in a
fresh copy of the repository (as each job checks it out), with the workflow's, the job's and
the step's `env:` and the `${{ ... }}` expressions given plausible values. The credentials
point at nothing: dummy keys and AWS_ENDPOINT_URL on a closed loopback port. So `sam build`
must succeed (it makes no AWS call) and every `sam package` / `sam deploy` must get past its
argument and samconfig.toml validation and fail at its first AWS call ("Could not connect to
the endpoint URL"), never before.

SAM CLI is the one `.ci/lint` pins and installs (`.tools-venv/sam`; WSFLEET_SAM_CLI names
another). Without it the module is skipped; `.ci/lint` runs it with WSFLEET_SAM_CLI set, and
then a missing sam fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "pipeline.yaml"
SAM = Path(os.environ.get("WSFLEET_SAM_CLI") or ROOT / ".tools-venv" / "sam" / "bin" / "sam")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not SAM.exists() and "WSFLEET_SAM_CLI" not in os.environ,
        reason="SAM CLI not installed (.ci/lint installs it into .tools-venv/sam)",
    ),
]

DIGEST = "sha256:" + "ab" * 32
# Plausible values of the workflow's expressions: repository variables as `sam pipeline
# bootstrap` names them, and the build job's image outputs (an ECR image by digest).
EXPRESSIONS = {
    "vars.TESTING_PIPELINE_EXECUTION_ROLE":
        "arn:aws:iam::111111111111:role/aws-sam-cli-managed-testing-PipelineExecutionRole-1A",
    "vars.TESTING_CLOUDFORMATION_EXECUTION_ROLE":
        "arn:aws:iam::111111111111:role/aws-sam-cli-managed-testing-CloudFormationExecutionR-1B",
    "vars.TESTING_ARTIFACTS_BUCKET": "aws-sam-cli-managed-testing-pipeli-artifactsbucket-1c",
    "vars.TESTING_REGION": "eu-west-1",
    "vars.TESTING_ECR_REPOSITORY": "wsfleet-worker",
    "vars.TESTING_VPC_ID": "vpc-0123456789abcdef0",
    "vars.TESTING_SUBNET_IDS": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
    "vars.PROD_PIPELINE_EXECUTION_ROLE":
        "arn:aws:iam::222222222222:role/aws-sam-cli-managed-prod-PipelineExecutionRole-2A",
    "vars.PROD_CLOUDFORMATION_EXECUTION_ROLE":
        "arn:aws:iam::222222222222:role/aws-sam-cli-managed-prod-CloudFormationExecutionR-2B",
    "vars.PROD_ARTIFACTS_BUCKET": "aws-sam-cli-managed-prod-pipeline-artifactsbucket-2c",
    "vars.PROD_REGION": "us-east-2",
    "vars.PROD_ECR_REPOSITORY": "wsfleet-worker",
    "vars.PROD_VPC_ID": "vpc-0aaaaaaaaaaaaaaa0",
    "vars.PROD_SUBNET_IDS": "subnet-0aaaaaaaaaaaaaaa1,subnet-0aaaaaaaaaaaaaaa2",
    "needs.build-and-package.outputs.testing_image":
        f"111111111111.dkr.ecr.eu-west-1.amazonaws.com/wsfleet-worker@{DIGEST}",
    "needs.build-and-package.outputs.prod_image":
        f"222222222222.dkr.ecr.us-east-2.amazonaws.com/wsfleet-worker@{DIGEST}",
}
EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")
UNREACHABLE = "Could not connect to the endpoint URL"


def evaluate(value: Any, env: dict[str, str]) -> str:
    """A workflow `env:` value with its expressions replaced (``env.X`` from ``env``)."""

    def one(match: re.Match[str]) -> str:
        expression = match.group(1)
        if expression.startswith("env."):
            return env[expression.removeprefix("env.")]
        assert expression in EXPRESSIONS, f"give the test a value for ${{{{ {expression} }}}}"
        return EXPRESSIONS[expression]

    return EXPRESSION.sub(one, str(value))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def checkout(into: Path) -> Path:
    """The repository's tracked files as a job's `actions/checkout` lays them out."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted in the work tree but not yet in the index
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def packaged(template: Path, bucket: str) -> str:
    """What `sam package` writes: the template with every code location an S3 URI."""
    return re.sub(
        r"^(\s+(?:CodeUri|ContentUri):) \S+$",
        rf"\1 s3://{bucket}/0123456789abcdef0123456789abcdef",
        template.read_text(),
        flags=re.MULTILINE,
    )


class Job:
    """One workflow job's environment and its `sam` steps."""

    def __init__(self, workflow: dict[str, Any], name: str, endpoint: str) -> None:
        self.name = name
        self.spec = workflow["jobs"][name]
        self.base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "SAM_")) and k != "WSFLEET_SAM_CLI"
        }
        self.base.update(
            PATH=f"{SAM.parent}{os.pathsep}{os.environ['PATH']}",
            AWS_ACCESS_KEY_ID="AKIAIOSFODNN7EXAMPLE",
            AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            AWS_SESSION_TOKEN="dummy",
            AWS_ENDPOINT_URL=endpoint,
            AWS_MAX_ATTEMPTS="1",
            AWS_RETRY_MODE="standard",
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            SAM_CLI_TELEMETRY="0",
            GITHUB_SHA="0123456789abcdef0123456789abcdef01234567",
            GITHUB_RUN_ID="1234567890",
            GITHUB_RUN_ATTEMPT="1",
            CI="true",
        )
        env: dict[str, str] = {}
        for scope in (workflow.get("env", {}), self.spec.get("env", {})):
            for key, value in scope.items():
                env[key] = evaluate(value, env)
        self.env = env

    def sam_steps(self) -> Iterator[tuple[str, dict[str, str]]]:
        """(script, environment) of each step whose script runs sam."""
        for step in self.spec["steps"]:
            script = step.get("run", "")
            if not re.search(r"^\s*sam ", script, flags=re.MULTILINE):
                continue
            env = dict(self.env)
            for key, value in step.get("env", {}).items():
                env[key] = evaluate(value, env)
            yield script, {**self.base, **env}


def run_step(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # GitHub runs a `run:` script with `bash -e {0}` on Linux runners.
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False,
    )


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    assert SAM.exists(), f"WSFLEET_SAM_CLI={SAM} does not exist"
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def endpoint() -> str:
    return f"http://127.0.0.1:{closed_port()}"


def test_build_and_package_job(
    workflow: dict[str, Any], endpoint: str, tmp_path: Path
) -> None:
    # GIVEN a fresh checkout and the build job's steps
    job = Job(workflow, "build-and-package", endpoint)
    repo = checkout(tmp_path)
    ran = []
    for script, env in job.sam_steps():
        result = run_step(script, env, repo)
        output = result.stdout + result.stderr
        ran.append(script.split()[1])
        if script.split()[1] == "build":
            # THEN sam build succeeds (no AWS call) and leaves what sam package reads
            assert result.returncode == 0, output
            assert (repo / ".aws-sam" / "build" / "template.yaml").is_file()
        else:
            # THEN sam package gets as far as uploading, to the closed endpoint
            assert result.returncode != 0, output
            assert f'{UNREACHABLE}: "{endpoint}/' in output, output
    assert ran == ["build", "package", "package"]


@pytest.mark.parametrize(
    ("name", "artifact", "bucket"),
    [
        ("deploy-testing", "packaged-testing.yaml", "TESTING_ARTIFACTS_BUCKET"),
        ("deploy-prod", "packaged-prod.yaml", "PROD_ARTIFACTS_BUCKET"),
    ],
)
def test_deploy_job(
    workflow: dict[str, Any], endpoint: str, tmp_path: Path, name: str, artifact: str,
    bucket: str,
) -> None:
    # GIVEN a fresh checkout plus the packaged template the job downloads
    job = Job(workflow, name, endpoint)
    repo = checkout(tmp_path)
    (repo / artifact).write_text(packaged(ROOT / "template.yaml", job.env[bucket]))
    (step,) = job.sam_steps()

    # WHEN its sam deploy runs as written
    result = run_step(*step, repo)
    output = result.stdout + result.stderr

    # THEN it failed at its first AWS call, not at its arguments or samconfig.toml
    assert result.returncode != 0, output
    assert f'{UNREACHABLE}: "{endpoint}/' in output, output
    assert "Error: Cannot use both" not in output and "Deploy this changeset?" not in output


def test_bootstrap_trusts_the_branch_subject_the_unit_test_assumes() -> None:
    """tests/unit/test_pipeline.py models the role `sam pipeline bootstrap` creates; this is
    the installed SAM CLI's own subject claim and trust condition."""
    python = SAM.with_name("python")
    claim = subprocess.run(
        [str(python), "-c",
         "from samcli.commands.pipeline.bootstrap.pipeline_oidc_provider import "
         "GitHubOidcProvider as P; print(P({'github-org': 'acme', 'github-repo': 'wsfleet', "
         "'deployment-branch': 'main'}, {'oidc-provider-url': 'https://x', "
         "'oidc-client-id': 'sts.amazonaws.com'}).get_subject_claim())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert claim == "repo:acme/wsfleet:ref:refs/heads/main"
    resources = subprocess.run(
        [str(python), "-c",
         "import samcli.lib.pipeline.bootstrap as b, pathlib; "
         "print((pathlib.Path(b.__file__).parent / 'stage_resources.yaml').read_text())"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert '"ForAllValues:StringLike": {' in resources
    assert '"${Url}:sub":  "${SubjectClaim}"' in resources
