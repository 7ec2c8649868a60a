"""Work on daemon threads of this process: an HTTP server, and a loop that runs until stopped.

:mod:`wsfleet_local.procs` owns child processes; this module owns the two shapes that the
in-process services of the local runtime take, so each is written once:

* :class:`ServerThread`: an already-bound stdlib (or werkzeug) HTTP server, served on a daemon
  thread (the local REST API, the ECS metadata endpoint, the moto server, the fault proxy);
* :class:`BackgroundLoop`: a loop with a stop Event (the reconcile scheduler, the stream
  poller, the task exit watcher).

Both are :class:`~wsfleet_local.procs.Service`\\ s: ``start()`` returns the service, ``stop()``
is safe to call twice, and ``with`` stops them however the block ends.

Example::

    server = ServerThread(ThreadingHTTPServer(("127.0.0.1", 0), Handler), name="metadata")
    with server:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/")
"""

from __future__ import annotations

import socketserver
import threading
from typing import Self

from .procs import Service

__all__ = ["BackgroundLoop", "ServerThread"]

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
