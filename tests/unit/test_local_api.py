"""API Gateway behaviour of the local API: proxy responses and route selection (no sockets)."""

from __future__ import annotations

import base64

from wsfleet_local.api import LocalApi, gateway_response
from wsfleet_local.stack import Route


def test_proxy_response_is_relayed():
    status, headers, body = gateway_response(
        {"statusCode": 201, "headers": {"Content-Type": "application/json"}, "body": '{"a": 1}'}
    )
    assert (status, body) == (201, b'{"a": 1}')
    assert ("Content-Type", "application/json") in headers


def test_multi_value_headers_win_over_single_ones():
    _, headers, _ = gateway_response(
        {
            "statusCode": 200,
            "headers": {"X-A": "single", "X-B": "b"},
            "multiValueHeaders": {"X-A": ["1", "2"]},
            "body": "",
        }
    )
    assert [v for k, v in headers if k == "X-A"] == ["1", "2"]
    assert ("X-B", "b") in headers


def test_base64_bodies_are_decoded():
    raw = b"\x00\x01"
    _, _, body = gateway_response(
        {"statusCode": 200, "body": base64.b64encode(raw).decode(), "isBase64Encoded": True}
    )
    assert body == raw


def test_malformed_proxy_response_is_a_502():
    for bad in (None, "text", {"body": "x"}, {"statusCode": "200"}):
        status, _, body = gateway_response(bad)
        assert status == 502 and b"Internal server error" in body


def test_literal_routes_win_over_templated_ones():
    api = LocalApi(lambda event: None, routes=[Route("GET", "/x/{id}"), Route("GET", "/x/list")])
    assert api.match("GET", "/x/list") == (Route("GET", "/x/list"), {})
    assert api.match("GET", "/x/7") == (Route("GET", "/x/{id}"), {"id": "7"})
    assert api.match("DELETE", "/x/7") is None
