"""In-process services: an HTTP server and a loop on daemon threads, and the JSON call to them.

:mod:`wsfleet_local.procs` owns child processes; this module owns the shapes that the
in-process services of the local runtime take, so each is written once:

* :class:`ServerThread`: an already-bound stdlib (or werkzeug) HTTP server, served on a daemon
  thread (the local REST API, the ECS metadata endpoint, the moto server, the fault proxy);
* :class:`BackgroundLoop`: a loop with a stop Event (the reconcile scheduler, the stream
  poller, the task exit watcher);
* :func:`call_json`: one JSON request to a control API (:class:`~wsfleet_local.client.ApiClient`,
  the simulator's and the fault proxy's clients), each client keeping its own error type.

The first two are :class:`~wsfleet_local.procs.Service`\\ s: ``start()`` returns the service,
``stop()`` is safe to call twice, and ``with`` stops them however the block ends.

Example::

    server = ServerThread(ThreadingHTTPServer(("127.0.0.1", 0), Handler), name="metadata")
    with server:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/")
"""

from __future__ import annotations

import json
import socketserver
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Self

from .procs import Service

__all__ = ["BackgroundLoop", "ServerThread", "call_json"]

#: How often ``serve_forever`` looks for a shutdown request: the bound on ``stop()``'s wait.
SHUTDOWN_POLL_SECONDS = 0.1


class ServerThread(Service):
    """Serve ``server`` (bound already, so its port is known and connections queue in the
    kernel before :meth:`start`) on a daemon thread named ``<name>-<port>``.

    ``stop`` stops accepting, waits for the serving loop and closes the socket; requests in
    flight finish on their own daemon threads (``ThreadingHTTPServer``'s default), so a slow
    one never holds up a shutdown.
    """

    def __init__(self, server: socketserver.TCPServer, *, name: str) -> None:
        self.server = server
        self._stopped = False
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name=f"{name}-{self.port}",
            daemon=True,
        )

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        # shutdown() waits for serve_forever to notice: it would wait forever if never started.
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(timeout_seconds)
        self.server.server_close()


class BackgroundLoop(Service):
    """A loop on a daemon thread: a subclass writes :meth:`_run`, which returns once
    ``self._stop`` (an Event) is set; ``self._stop.wait(seconds)`` is its sleep (True when
    stopping). ``stop`` sets the event and joins the thread.
    """

    #: The thread's name (shown by py-spy, faulthandler, logging's threadName).
    thread_name = "wsfleet-loop"
    #: How long ``stop()`` waits for the loop by default: about one step of it.
    stop_timeout_seconds = 5.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float | None = None) -> None:
        """No new step after this; waits for the one in flight. Safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.stop_timeout_seconds if timeout_seconds is None else timeout_seconds)

    def _run(self) -> None:
        raise NotImplementedError


#: ``failed(status, reason, body)``: the client's own exception for a failed call; ``status``
#: is None when nothing answered (refused, reset, timed out).
Failed = Callable[[int | None, str, bytes], Exception]
#: ``sign(method, url, data, headers)``: the headers to send instead (SigV4, say).
Sign = Callable[[str, str, bytes | None, Mapping[str, str]], dict[str, str]]


def _json_or_none(raw: bytes) -> Any:
    return json.loads(raw) if raw else None


def call_json(
    method: str,
    url: str,
    payload: Any = None,
    *,
    timeout: float,
    failed: Failed,
    sign: Sign | None = None,
    decode: Callable[[bytes], Any] = _json_or_none,
) -> Any:
    """``method url`` with ``payload`` (if not None) as a JSON body; the answer decoded by
    ``decode`` (default: its JSON, None for an empty body).

    An error status or no answer at all raises ``failed(...)``, chained to urllib's error.
    """
    data = json.dumps(payload).encode() if payload is not None else None
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if sign is not None:
        headers = sign(method, url, data, headers)
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise failed(exc.code, str(exc.reason), exc.read()) from exc
    except OSError as exc:  # URLError is one; a timeout while reading is another
        raise failed(None, str(getattr(exc, "reason", exc)), b"") from exc
    return decode(body)
