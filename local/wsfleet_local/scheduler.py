"""The reconciler's schedule, locally: one short invocation every few seconds.

On AWS, EventBridge Scheduler invokes the reconciler once a minute (its finest rate) and each
invocation runs a pass every ``RECONCILE_PASS_SECONDS`` until its remaining time runs low.
Locally the interesting timings are seconds, not minutes, so :class:`ReconcileScheduler`
invokes it every ``interval_seconds`` with a context whose remaining time
(``ONE_PASS_TIMEOUT_SECONDS``) leaves room for one pass only: the reconciler's own
"is there time for another pass?" rule then stops after the first. Set the reconciler's
``RECONCILE_PASS_SECONDS`` to the same interval so its early-hint window (leases expiring
before the next pass) matches the real cadence.

Ticks are on a fixed grid (missed ticks are skipped, never bunched), invocations never
overlap, and ``stop()`` returns within one in-flight invocation.

Example::

    scheduler = ReconcileScheduler(reconciler.invoke, interval_seconds=1.0).start()
    ...
    scheduler.stop()
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .events import scheduler_event
from .lambda_process import FunctionError
from .serving import BackgroundLoop

__all__ = ["ONE_PASS_TIMEOUT_SECONDS", "ReconcileScheduler"]

logger = logging.getLogger(__name__)

#: The reconciler starts another pass only if it would end 3 s before the timeout
#: (functions/reconciler TIME_MARGIN_MS); 3 s of remaining time therefore means one pass.
ONE_PASS_TIMEOUT_SECONDS = 3.0

Invoke = Callable[..., Any]


class ReconcileScheduler(BackgroundLoop):
    """Invokes a function with a Scheduler-shaped event on a fixed interval (background thread)."""

    thread_name = "wsfleet-scheduler"
    stop_timeout_seconds = 10.0

    def __init__(
        self,
        invoke: Invoke,
        *,
        interval_seconds: float,
        schedule_name: str = "wsfleet-local-reconcile",
        event_template: Mapping[str, Any] | None = None,
        invocation_timeout_seconds: float = ONE_PASS_TIMEOUT_SECONDS,
        region: str = "us-east-1",
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        super().__init__()
        self.invoke = invoke
        self.interval_seconds = interval_seconds
        self.schedule_name = schedule_name
        self.event_template = event_template
        self.invocation_timeout_seconds = invocation_timeout_seconds
        self.region = region
        self.invocations = 0
        self.failures = 0

    def run_once(self) -> Any:
        """One scheduled invocation now; its result, or None if the function failed (logged)."""
        self.invocations += 1
        event = scheduler_event(
            schedule_name=self.schedule_name,
            event_id=str(uuid.uuid4()),
            now=time.time(),
            region=self.region,
            template=self.event_template,
        )
        try:
            return self.invoke(event, timeout_seconds=self.invocation_timeout_seconds)
        except FunctionError as exc:
            self.failures += 1
            logger.warning("scheduled reconcile failed: %s", exc)
            return None

    def _run(self) -> None:
        first = time.monotonic()
        ticks = 0
        while not self._stop.is_set():
            self.run_once()
            now = time.monotonic()
            ticks = max(ticks + 1, int((now - first) / self.interval_seconds) + 1)
            if self._stop.wait(max(0.0, first + ticks * self.interval_seconds - now)):
                return
