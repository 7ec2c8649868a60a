"""A counting proxy for the stream sinks' write requests (Kinesis PutRecords, Firehose
PutRecordBatch): what the backend was actually sent and took, record by record.

``python -m bench.sink_requests --upstream http://127.0.0.1:PORT`` prints ``{"url": ...}`` and
forwards every request to the upstream (the embedded moto server) unchanged. For each write
request it reads the request body and the answer: every record the service took (no
``ErrorCode``) is counted with its size (data plus partition key, what Kinesis bills) and the
frames it carries (KPL-deaggregated user records for Kinesis, lines for Firehose); refused
records are counted apart (the service bills what it took). ``GET /__counts`` answers the
totals as JSON. The worker reaches it through ``AWS_ENDPOINT_URL_KINESIS`` /
``AWS_ENDPOINT_URL_FIREHOSE`` (bench/throughput.py ``--sink kinesis|firehose``).

Billing units are derived from the record sizes (:mod:`bench.sink_cost`), so they are kept as
histograms of exact sizes (``sizes``: size -> records), not as one total.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["RequestCounts", "count_request", "main"]

_WRITES = {"Kinesis_20131202.PutRecords": "kinesis", "Firehose_20150804.PutRecordBatch": "firehose"}


class RequestCounts:
    """Totals of the write requests seen (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.failed_requests: Counter[str] = Counter()
        self.records_refused: Counter[str] = Counter()
        self.frames: Counter[str] = Counter()
        self.sizes: dict[str, Counter[int]] = {}

    def add(self, service: str, status: int, taken: list[tuple[int, int]], refused: int) -> None:
        with self._lock:
            self.requests[service] += 1
            if status >= 300:
                self.failed_requests[service] += 1
            self.records_refused[service] += refused
            sizes = self.sizes.setdefault(service, Counter())
            for size, frames in taken:
                sizes[size] += 1
                self.frames[service] += frames

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                service: {
                    "requests": self.requests[service],
                    "failed_requests": self.failed_requests[service],
                    "records": sum(self.sizes.get(service, Counter()).values()),
                    "records_refused": self.records_refused[service],
                    "frames": self.frames[service],
                    "sizes": {str(k): v for k, v in sorted(self.sizes.get(service, {}).items())},
                }
                for service in sorted(self.requests)
            }


def count_request(
    service: str, body: bytes, status: int, answer: bytes
) -> tuple[list[tuple[int, int]], int]:
    """The records a write request carried that the service took, as (billed size, frames),
    and how many it refused.

    >>> import base64, json
    >>> data = base64.b64encode(b'{"a":1}\\n{"a":2}\\n').decode()
    >>> count_request("firehose", json.dumps({"Records": [{"Data": data}]}).encode(), 200,
    ...               b'{"FailedPutCount": 0, "RequestResponses": [{"RecordId": "1"}]}')
    ([(16, 2)], 0)
    """
    from wsfleet.sinks.kinesis import deaggregate

    if status >= 300:
        return [], 0
    records = json.loads(body).get("Records", [])
    reply = json.loads(answer or b"{}")
    results = reply.get("Records" if service == "kinesis" else "RequestResponses", [])
    taken: list[tuple[int, int]] = []
    refused = 0
    for record, result in zip(records, results, strict=False):
        if result.get("ErrorCode"):
            refused += 1
            continue
        data = base64.b64decode(record["Data"])
        if service == "kinesis":
            key = record.get("PartitionKey", "")
            frames = len(deaggregate(data, key))
            taken.append((len(data) + len(key.encode("utf-8")), frames))
        else:
            taken.append((len(data), data.count(b"\n")))
    return taken, refused


def serve(upstream: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    target = urlsplit(upstream)
    counts = RequestCounts()
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.command == "GET" and self.path == "/__counts":
                self._answer(200, [("Content-Type", "application/json")],
                             json.dumps(counts.to_dict()).encode())  # fmt: skip
                return
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection(
                    target.hostname or "127.0.0.1", target.port or 80, timeout=60
                )
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                local.connection = None
                self._answer(502, [], b'{"__type": "ProxyUpstreamError"}')
                return
            service = _WRITES.get(self.headers.get("X-Amz-Target", ""))
            if service is not None:
                taken, refused = count_request(service, body, response.status, answer)
                counts.add(service, response.status, taken, refused)
            self._answer(response.status, response.getheaders(), answer)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    server = serve(args.upstream)
    host, port = server.server_address[:2]
    print(json.dumps({"url": f"http://{host!s}:{port}"}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
