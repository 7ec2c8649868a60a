"""The local REST API: HTTP requests in, API Gateway proxy events to the router, responses out.

On AWS, API Gateway (REST API, Lambda proxy integration, IAM auth) turns each request into an
event and relays the function's ``{statusCode, headers, body}`` back. :class:`LocalApi` does
the same on 127.0.0.1 with a threaded stdlib HTTP server: routes come from the template
(:class:`wsfleet_local.stack.Route`), events from :func:`wsfleet_local.events.api_gateway_event`,
and the handler is reached through ``invoke`` (normally a
:class:`wsfleet_local.lambda_process.FunctionProcess` running ``functions/router``), so the router
cannot tell it from AWS.

Differences from AWS, on purpose: no IAM signature check (loopback only), and requests are
accepted both under the stage prefix (``/dev/connections``, like the deployed URL) and without
it. An unknown route is a 403 "Missing Authentication Token" on AWS; here it is a 404 naming
the known routes, which helps more locally. What API Gateway answers for a failing function is
mirrored: a handler error or a malformed response gives 502 ``{"message": "Internal server
error"}``, a timeout 504.

Example::

    api = LocalApi(router.invoke, routes=stack.function("router").routes).start()
    urllib.request.urlopen(api.url + "/connections")   # -> the router's list response
    api.stop()
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from .events import api_gateway_event
from .lambda_process import FunctionError, FunctionTimeout
from .procs import Service
from .serving import ServerThread
from .stack import Route

__all__ = ["DEFAULT_STAGE", "LocalApi", "gateway_response"]

logger = logging.getLogger(__name__)

DEFAULT_STAGE = "dev"
#: API Gateway's payload limit for a REST API request.
MAX_BODY_BYTES = 10 * 1024 * 1024

Invoke = Callable[[dict[str, Any]], Any]


def gateway_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body API Gateway would send for a proxy integration's result.

    A result that is not a valid proxy response is a 502, exactly as API Gateway reports a
    "Malformed Lambda proxy response".
    """
    if not isinstance(result, dict) or not isinstance(result.get("statusCode"), int):
        return _message(HTTPStatus.BAD_GATEWAY, "Internal server error")
    headers: list[tuple[str, str]] = []
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers.extend((name, str(value)) for value in values)
    single = result.get("headers") or {}
    seen = {name.lower() for name, _ in headers}
    headers.extend((name, str(value)) for name, value in single.items() if name.lower() not in seen)
    body = result.get("body")
    if body is None:
        payload = b""
    elif result.get("isBase64Encoded"):
        try:
            payload = base64.b64decode(str(body))
        except ValueError:
            return _message(HTTPStatus.BAD_GATEWAY, "Internal server error")
    else:
        payload = str(body).encode("utf-8")
    return int(result["statusCode"]), headers, payload


def _message(status: HTTPStatus, text: str) -> tuple[int, list[tuple[str, str]], bytes]:
    return (
        int(status),
        [("Content-Type", "application/json")],
        json.dumps({"message": text}).encode(),
    )


class _Handler(BaseHTTPRequestHandler):
    server: _ApiServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def _proxy(self) -> None:
        api = self.server.api
        request_id = str(uuid.uuid4())
        started = time.monotonic()
        parts = urlsplit(self.path)
        path = unquote(parts.path) or "/"
        stage_prefix = f"/{api.stage}"
        if path == stage_prefix or path.startswith(stage_prefix + "/"):
            path = path[len(stage_prefix) :] or "/"
        status, headers, body = self._answer(api, path, parts.query, request_id)
        self.close_connection = True
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "connection"):
                self.send_header(name, value)
        self.send_header("x-amzn-RequestId", request_id)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        logger.info(
            "%s %s -> %d (%.1f ms)",
            self.command,
            self.path,
            status,
            (time.monotonic() - started) * 1000,
        )

    def _answer(
        self, api: LocalApi, path: str, query: str, request_id: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        matched = api.match(self.command, path)
        if matched is None:
            routes = ", ".join(f"{r.method} {r.path}" for r in api.routes)
            return _message(
                HTTPStatus.NOT_FOUND, f"no route {self.command} {path}; routes: {routes}"
            )
        route, parameters = matched
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return _message(HTTPStatus.BAD_REQUEST, "Content-Length must be a number")
        if length > MAX_BODY_BYTES:
            return _message(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "Request Too Long")
        body = self.rfile.read(length) if length > 0 else b""
        event = api_gateway_event(
            method=self.command,
            path=path,
            resource=route.path,
            path_parameters=parameters,
            headers=list(self.headers.items()),
            query=query,
            body=body,
            stage=api.stage,
            request_id=request_id,
            source_ip=self.client_address[0],
            now=time.time(),
        )
        try:
            result = api.invoke(event)
        except FunctionTimeout:
            return _message(HTTPStatus.GATEWAY_TIMEOUT, "Endpoint request timed out")
        except FunctionError as exc:
            logger.error("router failed on %s %s: %s", self.command, path, exc)
            return _message(HTTPStatus.BAD_GATEWAY, "Internal server error")
        return gateway_response(result)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)


class _ApiServer(ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], api: LocalApi) -> None:
        super().__init__(address, _Handler)
        self.api = api


class LocalApi(Service):
    """A loopback HTTP server exposing the router's template routes, one thread per request.

    ``url`` includes the stage (``http://127.0.0.1:PORT/dev``) like the deployed API's URL,
    so clients build paths the same way against both.
    """

    def __init__(
        self,
        invoke: Invoke,
        *,
        routes: Sequence[Route],
        host: str = "127.0.0.1",
        port: int = 0,
        stage: str = DEFAULT_STAGE,
    ) -> None:
        self.invoke = invoke
        self.routes = tuple(routes)
        self.host = host
        self.stage = stage
        self._requested_port = port
        self._serving: ServerThread | None = None

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route and path parameters for a request, literal routes winning over templates."""
        for route in sorted(self.routes, key=lambda r: r.path.count("{")):
            parameters = route.match(method, path)
            if parameters is not None:
                return route, parameters
        return None

    def start(self) -> LocalApi:
        if self._serving is None:
            server = _ApiServer((self.host, self._requested_port), self)
            self._serving = ServerThread(server, name="wsfleet-api").start()
        return self

    @property
    def port(self) -> int:
        if self._serving is None:
            raise RuntimeError("the local API is not started")
        return self._serving.port

    @property
    def url(self) -> str:
        """Base URL including the stage, e.g. ``http://127.0.0.1:8080/dev``."""
        return f"http://{self.host}:{self.port}/{self.stage}"

    def stop(self) -> None:
        """Stop accepting and close the socket (requests in flight finish on their threads)."""
        serving, self._serving = self._serving, None
        if serving is not None:
            serving.stop()
