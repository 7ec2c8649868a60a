"""The worker's network fence in template.yaml (issue #11): HTTPS-only egress by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wsfleet_local.backend import load_template
from wsfleet_local.stack import container_environment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def test_the_worker_security_group_allows_tcp_443_out_and_nothing_else(template):
    group = template["Resources"]["WorkerSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in group
    rules = group["SecurityGroupEgress"]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in rules] == [("tcp", 443, 443)]


def test_the_extra_upstream_egress_rule_exists_only_when_a_cidr_is_given(template):
    extra = template["Resources"]["WorkerExtraUpstreamEgress"]
    assert extra["Condition"] == "HasExtraUpstreamEgress"
    condition = template["Conditions"]["HasExtraUpstreamEgress"]
    assert condition == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ExtraUpstreamEgressCidr"}, ""]}]}
    assert template["Parameters"]["ExtraUpstreamEgressCidr"]["Default"] == ""
    props = extra["Properties"]
    assert props["CidrIp"] == {"Ref": "ExtraUpstreamEgressCidr"}
    assert props["FromPort"] == {"Ref": "ExtraUpstreamEgressFromPort"}
    assert props["ToPort"] == {"Ref": "ExtraUpstreamEgressToPort"}


def test_the_worker_gets_the_upstream_policy_settings(template):
    container = template["Resources"]["WorkerTaskDefinition"]["Properties"][
        "ContainerDefinitions"
    ][0]
    env = container_environment(container["Environment"])
    assert env["ALLOWED_UPSTREAM_HOSTS"] == {"Ref": "AllowedUpstreamHosts"}
    assert env["ALLOW_INSECURE_WS"] == {"Ref": "AllowInsecureWs"}
