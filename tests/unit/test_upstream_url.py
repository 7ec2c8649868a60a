"""ws_url rules (SSRF guard) and URL redaction: pure functions, no network, no DNS."""

from __future__ import annotations

import doctest
import ipaddress
from urllib.parse import urlsplit

import pytest
from websockets.uri import parse_uri

from wsfleet import upstream_url
from wsfleet.exceptions import WsfleetError
from wsfleet.upstream_url import (
    MAX_URL_LENGTH,
    InvalidUpstreamUrl,
    normalize_allowed_hosts,
    redact_url,
    refused_address_reason,
    validate_ws_url,
)


def check(url: object, *allowed: str, insecure: bool = False) -> str:
    return validate_ws_url(url, allowed_hosts=tuple(allowed), allow_insecure=insecure)


def refusal(url: object, *allowed: str, insecure: bool = False) -> str:
    with pytest.raises(InvalidUpstreamUrl) as caught:
        check(url, *allowed, insecure=insecure)
    return str(caught.value)


def test_module_examples_hold():
    assert doctest.testmod(upstream_url).failed == 0


def test_invalid_url_is_a_wsfleet_error_and_a_value_error():
    assert issubclass(InvalidUpstreamUrl, WsfleetError)
    assert issubclass(InvalidUpstreamUrl, ValueError)
    assert InvalidUpstreamUrl.field == "ws_url"


class TestAccepted:
    @pytest.mark.parametrize(
        "url",
        [
            "wss://stream.example.com/v1/trades?symbol=BTC-USD&token=abc",
            "wss://stream.example.com",
            "WSS://Stream.Example.COM:8443/feed",
            "wss://under_score.example.com/",
            "wss://xn--bcher-kva.example/",  # IDN in punycode
            "wss://93.184.216.34/feed",
            "wss://[2606:4700::1111]:443/feed",
            "wss://a.b.c.d.example.com/" + "p" * 100,
        ],
    )
    def test_public_wss_urls_pass_unchanged(self, url):
        assert check(url) == url

    def test_ws_only_when_insecure_is_allowed(self):
        assert check("ws://stream.example.com/feed", insecure=True) == "ws://stream.example.com/feed"
        assert "ALLOW_INSECURE_WS=true" in refusal("ws://stream.example.com/feed")

    def test_url_of_exactly_the_maximum_length_passes(self):
        base = "wss://stream.example.com/"
        url = base + "a" * (MAX_URL_LENGTH - len(base))
        assert check(url) == url


class TestShape:
    @pytest.mark.parametrize("value", [None, 42, b"wss://stream.example.com/"])
    def test_non_string_is_refused(self, value):
        assert refusal(value) == "ws_url must be a string"

    def test_empty_is_refused(self):
        assert refusal("") == "ws_url must not be empty"

    def test_too_long_is_refused(self):
        url = "wss://stream.example.com/" + "a" * MAX_URL_LENGTH
        assert "longer than 2048" in refusal(url)

    @pytest.mark.parametrize(
        "url",
        [
            "wss://stream.example.com/a b",
            "wss://stream.example.com/\tx",
            "wss://stream.example.com/\nx",
            "wss://stream.example.com/\x00",
            "wss://strëam.example.com/",
            "wss://\uff11\uff12\uff17.0.0.1/",  # fullwidth "127": NFKC turns it into 127
        ],
    )
    def test_whitespace_control_and_non_ascii_are_refused(self, url):
        assert "printable ASCII" in refusal(url)

    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("https://stream.example.com/", "scheme must be wss, got 'https'"),
            ("stream.example.com/feed", "scheme must be wss, got 'none'"),
            ("file:///etc/passwd", "scheme must be wss, got 'file'"),
        ],
    )
    def test_other_schemes_are_refused(self, url, expected):
        assert expected in refusal(url)

    def test_insecure_mode_names_both_schemes(self):
        assert "scheme must be wss or ws, got 'http'" in refusal("http://h.example/", insecure=True)

    @pytest.mark.parametrize(
        "url",
        [
            "wss://user:secret@stream.example.com/",
            "wss://token@stream.example.com/",
            "wss://stream.example.com\\@127.0.0.1/",  # backslash tricks still carry an '@'
        ],
    )
    def test_user_info_is_refused(self, url):
        assert "must not contain user info" in refusal(url)

    @pytest.mark.parametrize("url", ["wss://stream.example.com/#frag", "wss://stream.example.com/#"])
    def test_fragment_is_refused(self, url):
        assert "fragment" in refusal(url)

    @pytest.mark.parametrize("url", ["wss:///feed", "wss://:443/feed", "wss:feed"])
    def test_missing_host_is_refused(self, url):
        assert refusal(url) == "ws_url must name a host"

    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("wss://stream.example.com:99999/", "not a valid URL: Port out of range"),
            ("wss://stream.example.com:abc/", "not a valid URL: Port could not be cast"),
            ("wss://stream.example.com:0/", "port must be between 1 and 65535"),
            ("wss://[zz::1/", "not a valid URL"),
        ],
    )
    def test_bad_ports_and_unparseable_urls_are_refused(self, url, expected):
        assert expected in refusal(url)

    @pytest.mark.parametrize(
        "url",
        [
            "wss://a..example.com/",
            "wss://-bad.example.com/",
            "wss://bad-.example.com/",
            "wss://bad%2eexample.com/",
            "wss://exa$mple.com/",
            "wss://" + "a" * 64 + ".example.com/",
            "wss://" + ".".join(["abcdefghi"] * 26) + ".example/",  # > 253 characters
        ],
    )
    def test_invalid_dns_names_are_refused(self, url):
        assert "is not a valid DNS name" in refusal(url)


class TestNumericHosts:
    @pytest.mark.parametrize(
        "host", ["127.1", "2130706433", "0x7f.0.0.1", "0x7f000001", "017700000001", "1.2.3",
                 "127.0.0.01", "example.123", "256.1.1.1", "0x"]
    )
    def test_non_canonical_ipv4_forms_are_refused(self, host):
        assert "not a canonical dotted quad" in refusal(f"wss://{host}/")

    @pytest.mark.parametrize("host", ["[v1.fe]", "[fe80::1%25eth0]"])
    def test_bracketed_hosts_must_be_plain_ipv6(self, host):
        assert "is not a plain IPv6 address" in refusal(f"wss://{host}/")

    def test_bracketed_ipv4_is_refused(self):
        # urlsplit itself refuses it on current Pythons; older ones leave it to our check.
        message = refusal("wss://[127.0.0.1]/")
        assert "cannot be in brackets" in message or "not a plain IPv6 address" in message


class TestOneSpellingPerHost:
    """Issue #23: the router accepted ``ws://127.0.0.1./`` (its parser read an address), the
    worker's resolver read a name it could not find and retried forever. A host has one
    spelling, so the router and the worker judge and reach the same thing."""

    @pytest.mark.parametrize(
        ("url", "listed"),
        [
            ("ws://127.0.0.1./s", "127.0.0.1"),  # a listed literal, dotted
            ("ws://127.0.0.1.:8765/s", "127.0.0.1"),
            ("ws://10.0.0.1./s", "10.0.0.1"),
            ("wss://localhost./", "localhost"),
            ("wss://feed.example./v1", "feed.example"),  # a listed name, dotted
            ("wss://stream.example.com./feed", ""),  # a public name, dotted
            ("wss://feed.example../v1", ""),
        ],
    )
    def test_a_trailing_dot_is_refused_even_where_the_host_is_listed(self, url, listed):
        message = refusal(url, listed, insecure=True)
        assert "must not end with a dot" in message
        assert "write '" in message  # says what to write instead

    @pytest.mark.parametrize(
        "url", ["wss://[::1]./", "wss://[::1]x/", "wss://[2606:4700::1111]x:443/"]
    )
    def test_text_after_a_bracketed_address_is_refused(self, url):
        assert "host and port are malformed" in refusal(url, "::1", "2606:4700::1111")

    @pytest.mark.parametrize(
        "url",
        [
            "wss://stream.example.com/v1",
            "WSS://Stream.Example.COM:8443/feed",
            "wss://93.184.216.34:9/x",
            "wss://[2606:4700::1111]:443/feed",
            "wss://stream.example.com:/feed",
            "wss://under_score.example.com/x;p=1?q=2",
        ],
    )
    def test_the_worker_library_reads_the_host_the_router_judged(self, url):
        # GIVEN a URL the router accepts WHEN websockets (the worker's client) parses it THEN it
        # names the same host and port, and an IP literal stays a literal (no resolver involved)
        check(url)
        parsed, seen = urlsplit(url), parse_uri(url)
        assert seen.host == parsed.hostname
        assert seen.port == (parsed.port or 443)
        host = parsed.hostname or ""
        if host.replace(".", "").isdigit() or ":" in host:
            assert ipaddress.ip_address(seen.host)


class TestPrivateAddresses:
    @pytest.mark.parametrize(
        ("host", "reason"),
        [
            ("169.254.169.254", "a cloud metadata address"),
            ("169.254.170.2", "a cloud metadata address"),
            ("[fd00:ec2::254]", "a cloud metadata address"),
            ("0.0.0.0", "an unspecified address"),
            ("[::]", "an unspecified address"),
            ("127.0.0.1", "a loopback address"),
            ("[::1]", "a loopback address"),
            ("169.254.1.1", "a link-local address"),
            ("[fe80::1]", "a link-local address"),
            ("224.0.0.1", "a multicast address"),
            ("[ff02::1]", "a multicast address"),
            ("100.64.0.1", "a shared (carrier-grade NAT) address"),
            ("10.1.2.3", "a private address"),
            ("172.16.0.1", "a private address"),
            ("192.168.1.1", "a private address"),
            ("[fc00::1]", "a private address"),
            ("198.18.0.1", "a private address"),
            ("240.0.0.1", "a reserved address"),
            ("[::ffff:10.0.0.1]", "an IPv6 form of 10.0.0.1 (a private address)"),
            ("[::ffff:169.254.169.254]", "an IPv6 form of 169.254.169.254 (a cloud metadata"),
            ("[64:ff9b::7f00:1]", "an IPv6 form of 127.0.0.1 (a loopback address)"),
            ("[2002:a00:1::]", "an IPv6 form of 10.0.0.1 (a private address)"),
            ("[2001:0:4136:e378:8000:63bf:f5ff:fffe]", "an IPv6 form of 10.0.0.1"),
        ],
    )
    def test_non_public_ip_literals_are_refused_with_the_reason(self, host, reason):
        message = refusal(f"wss://{host}/feed")
        assert reason in message
        assert "ALLOWED_UPSTREAM_HOSTS" in message

    @pytest.mark.parametrize(
        "host",
        ["localhost", "LOCALHOST", "api.localhost", "ip6-localhost", "localhost.localdomain"],
    )
    def test_loopback_names_are_refused(self, host):
        assert "a loopback name" in refusal(f"wss://{host}/")

    @pytest.mark.parametrize(
        "host", ["instance-data", "instance-data.ec2.internal", "metadata.google.internal"]
    )
    def test_metadata_names_are_refused(self, host):
        assert "a cloud metadata name" in refusal(f"wss://{host}/")

    def test_embedded_public_ipv4_is_accepted(self):
        assert check("wss://[::ffff:93.184.216.34]/") == "wss://[::ffff:93.184.216.34]/"
        assert check("wss://[2002:5db8:d822::]/") == "wss://[2002:5db8:d822::]/"

    def test_non_global_address_without_a_named_category(self):
        # Which special ranges count as private/reserved shifts between Python releases; the
        # final "not global" check refuses whatever the named categories miss.
        fake = _FakeAddress()
        assert refused_address_reason(fake) == "not a globally routable address"

    def test_public_addresses_have_no_reason(self):
        assert refused_address_reason(ipaddress.ip_address("8.8.8.8")) is None
        assert refused_address_reason(ipaddress.ip_address("2606:4700::1111")) is None


class _FakeAddress(ipaddress.IPv4Address):
    """93.184.216.34 that claims not to be global: exercises the catch-all branch."""

    def __init__(self) -> None:
        super().__init__("93.184.216.34")

    @property
    def is_global(self) -> bool:
        return False


class TestAllowList:
    def test_loopback_is_allowed_when_listed_exactly(self):
        url = "ws://127.0.0.1:8765/streams/s1?from_seq=3"
        assert check(url, "127.0.0.1", insecure=True) == url

    def test_ipv6_entry_may_be_bracketed_and_matches_any_spelling(self):
        assert check("wss://[0:0::1]/", "[::1]") == "wss://[0:0::1]/"

    def test_listed_name_allows_itself_and_its_subdomains(self):
        assert check("wss://example.com/", "example.com")
        assert check("wss://feed.eu.example.com/", ".Example.COM ")
        assert check("wss://localhost:9000/", "localhost")

    @pytest.mark.parametrize(
        "url",
        ["wss://badexample.com/", "wss://example.com.evil.net/", "wss://other.org/"],
    )
    def test_hosts_outside_the_list_are_refused(self, url):
        assert "is not in ALLOWED_UPSTREAM_HOSTS" in refusal(url, "example.com")

    def test_ip_literals_only_match_exactly_never_by_suffix(self):
        assert "is not in ALLOWED_UPSTREAM_HOSTS" in refusal("wss://10.0.0.1/", "0.0.1")
        assert "is not in ALLOWED_UPSTREAM_HOSTS" in refusal("wss://10.0.0.1/", "example.com")

    def test_private_address_not_listed_is_refused_even_with_a_list(self):
        message = refusal("wss://169.254.169.254/", "example.com", "127.0.0.1")
        assert "169.254.169.254 is not in ALLOWED_UPSTREAM_HOSTS" in message

    def test_blank_entries_mean_no_list(self):
        assert normalize_allowed_hosts(["", " ", "."]) == ()
        assert "a loopback address" in refusal("wss://127.0.0.1/", "", " ")


class TestRedact:
    def test_query_values_are_masked_names_kept(self):
        assert (
            redact_url("wss://h.example/feed?token=s3cret&symbol=X")
            == "wss://h.example/feed?token=***&symbol=***"
        )

    def test_user_info_and_fragment_are_dropped(self):
        assert redact_url("wss://u:p@h.example:8443/x#frag") == "wss://h.example:8443/x"

    def test_url_without_query_is_unchanged(self):
        assert redact_url("wss://h.example/x") == "wss://h.example/x"

    def test_blank_value_is_masked_too(self):
        assert redact_url("wss://h.example/x?flag=") == "wss://h.example/x?flag=***"

    def test_part_without_a_name_is_masked_whole(self):
        # GIVEN a bare query part (it may be a token): WHEN redacted THEN nothing of it shows
        assert redact_url("wss://h.example/x?s3cret&a=1") == "wss://h.example/x?***&a=***"
        assert redact_url("wss://h.example/x?=s3cret") == "wss://h.example/x?***"

    @pytest.mark.parametrize(
        ("url", "safe"),
        [
            ("wss://user:pw@feed.example:8443/s?token=secret#x", "wss://feed.example:8443/s?token=***"),
            ("ws://127.0.0.1:9000/stream?from_seq=4", "ws://127.0.0.1:9000/stream?from_seq=***"),
            ("ws://[::1]:9000/s?k=v", "ws://[::1]:9000/s?k=***"),
        ],
    )
    def test_no_credentials_or_query_values_survive(self, url, safe):
        assert redact_url(url) == safe

    @pytest.mark.parametrize(
        "url",
        [
            "ws://h:notaport/s?token=x",
            # an unencoded '#' or '?' in a password cuts the netloc short: "user:s3cret"
            "wss://user:s3cret#@h.example/s",
            "wss://user:s3cret?@h.example/s",
        ],
    )
    def test_a_netloc_that_is_not_host_and_port_is_not_echoed(self, url):
        assert redact_url(url) == "<invalid url>"

    def test_unparseable_url_is_replaced(self):
        assert redact_url("wss://[zz::1/x?token=s3cret") == "<invalid url>"
