"""The worker-side SSRF policy (issue #11): resolved addresses and redirect hops, without I/O."""

from __future__ import annotations

import ipaddress

import pytest

from wsfleet.exceptions import InvalidUpstreamUrl
from wsfleet.upstream_url import MAX_REDIRECTS, refused_resolution_reason, validate_redirect


def ips(*texts: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(text) for text in texts]


# ---------------------------------------------------------------- resolved addresses
@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        ("10.0.0.1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("169.254.170.2", "a cloud metadata address"),
        ("::ffff:127.0.0.1", "an IPv6 form of 127.0.0.1"),
        ("127.0.0.1", "a loopback address"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("0.0.0.0", "an unspecified address"),
    ],
)
def test_a_public_name_resolving_to_a_forbidden_address_is_refused(answer, needle):
    reason = refused_resolution_reason("feed.example", ips(answer), allowed_hosts=())
    assert reason is not None
    assert needle in reason
    assert reason.startswith(f"feed.example resolves to {ipaddress.ip_address(answer)}")


def test_a_listed_name_does_not_vouch_for_a_private_address():
    # Listing the provider's name must not let its (hijacked) DNS point into the VPC.
    reason = refused_resolution_reason(
        "feed.example", ips("169.254.169.254"), allowed_hosts=("feed.example",)
    )
    assert reason is not None and "metadata" in reason


def test_a_listed_address_allows_a_name_resolving_to_it():
    assert (
        refused_resolution_reason(
            "sim.local", ips("127.0.0.1"), allowed_hosts=("sim.local", "127.0.0.1")
        )
        is None
    )


def test_an_ipv4_mapped_answer_matches_its_listed_ipv4_address():
    assert (
        refused_resolution_reason(
            "sim.local", ips("::ffff:127.0.0.1"), allowed_hosts=("127.0.0.1",)
        )
        is None
    )


def test_a_listed_localhost_may_resolve_to_any_loopback_address_but_nothing_else():
    allowed = ("127.0.0.1", "localhost")
    assert (
        refused_resolution_reason("localhost", ips("127.0.0.1", "::1"), allowed_hosts=allowed)
        is None
    )
    reason = refused_resolution_reason("localhost", ips("10.0.0.1"), allowed_hosts=allowed)
    assert reason is not None and "a private address" in reason
    # Unlisted, localhost gets no such pass (the router refuses the name anyway).
    assert refused_resolution_reason("localhost", ips("::1"), allowed_hosts=()) is not None


def test_every_address_must_pass_not_just_the_first():
    reason = refused_resolution_reason(
        "feed.example", ips("93.184.216.34", "10.0.0.1"), allowed_hosts=()
    )
    assert reason is not None and "10.0.0.1" in reason


def test_public_answers_pass():
    answer = ips("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")
    assert refused_resolution_reason("feed.example", answer, allowed_hosts=()) is None


def test_an_empty_answer_is_refused():
    assert refused_resolution_reason("feed.example", [], allowed_hosts=()) == (
        "feed.example resolved to no address"
    )


# ---------------------------------------------------------------- redirect hops
def hop(
    target: str,
    *,
    current: str = "wss://a.example/x",
    n: int = 1,
    allowed: tuple[str, ...] = (),
    insecure: bool = False,
) -> str:
    return validate_redirect(current, target, hop=n, allowed_hosts=allowed, allow_insecure=insecure)


def refusal(target: str, **kwargs) -> str:
    with pytest.raises(InvalidUpstreamUrl) as caught:
        hop(target, **kwargs)
    return str(caught.value)


def test_a_redirect_to_an_allowed_host_is_followed():
    assert hop("wss://b.example/y", allowed=("example",)) == "wss://b.example/y"


@pytest.mark.parametrize(
    "target",
    [
        "wss://127.0.0.2/s",
        "wss://169.254.169.254/latest/meta-data",
        "wss://[::ffff:127.0.0.1]/s",
        "wss://localhost/s",
        "wss://2130706433/s",
        "wss://user:pw@b.example/s",
    ],
)
def test_a_redirect_to_a_host_the_router_refuses_is_refused(target):
    assert refusal(target).startswith("redirect refused: ")


def test_a_redirect_off_the_allow_list_is_refused():
    message = refusal(
        "ws://127.0.0.2:9/s", current="ws://127.0.0.1:8/s", allowed=("127.0.0.1",), insecure=True
    )
    assert "127.0.0.2 is not in ALLOWED_UPSTREAM_HOSTS" in message


def test_a_tls_downgrade_is_refused_unless_insecure_is_allowed():
    assert "wss:// to ws://" in refusal("ws://b.example/y")
    assert hop("ws://b.example/y", insecure=True) == "ws://b.example/y"


def test_the_hop_count_is_bounded():
    assert hop("wss://b.example/y", n=MAX_REDIRECTS) == "wss://b.example/y"
    assert f"more than {MAX_REDIRECTS} redirects" in refusal(
        "wss://b.example/y", n=MAX_REDIRECTS + 1
    )


def test_the_refusal_never_repeats_the_query_string():
    assert "s3cret" not in refusal("wss://10.0.0.1/s?token=s3cret")


def test_a_tls_upstream_redirecting_to_http_is_refused_for_its_scheme():
    # Not reported as a wss-to-ws downgrade: http is no WebSocket scheme at all (issue #23).
    with pytest.raises(InvalidUpstreamUrl, match="scheme must be wss, got 'http'"):
        validate_redirect(
            "wss://feed.example/s", "http://feed.example/s", hop=1, allowed_hosts=(),
            allow_insecure=False,
        )
