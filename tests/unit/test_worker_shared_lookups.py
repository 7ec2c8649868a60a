"""connector.shared_lookups: connects to one host that overlap share one DNS lookup (a take-over
burst must not queue one getaddrinfo per connection on asyncio's few executor threads), and
nothing is cached past the lookup."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from wsfleet_worker.connector import shared_lookups

ANSWER = [ipaddress.ip_address("192.0.2.10")]


class SlowDns:
    """A resolver that answers (or fails) only when the test opens its gate; counts lookups."""

    def __init__(self, error: Exception | None = None) -> None:
        self.asked: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.error = error

    async def __call__(self, host: str, port: int):
        self.asked.append((host, port))
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return ANSWER


def test_overlapping_lookups_of_one_host_go_out_once_and_later_ones_again():
    async def scenario() -> None:
        dns = SlowDns()
        lookup = shared_lookups(dns)
        # GIVEN twenty connects to one feed asking at once, and one to another port
        burst = [asyncio.create_task(lookup("Feed.example", 443)) for _ in range(20)]
        other = asyncio.create_task(lookup("feed.example", 8443))
        await asyncio.sleep(0)  # every task is now waiting for its answer
        # WHEN the answers come back
        dns.gate.set()
        answers = await asyncio.gather(*burst, other)
        # THEN one lookup per (host, port) went out, and every connect got its answer
        assert sorted(dns.asked) == [("Feed.example", 443), ("feed.example", 8443)]
        assert all(answer == ANSWER for answer in answers)
        # WHEN a connect asks after the answer came back THEN it looks up again (no cache)
        assert await lookup("feed.example", 443) == ANSWER
        assert len(dns.asked) == 3

    asyncio.run(scenario())


def test_a_failed_lookup_fails_every_waiter_and_is_not_remembered():
    async def scenario() -> None:
        dns = SlowDns(OSError("no such host"))
        lookup = shared_lookups(dns)
        waiting = [asyncio.create_task(lookup("feed.example", 443)) for _ in range(3)]
        await asyncio.sleep(0)
        dns.gate.set()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert [type(o) for o in outcomes] == [OSError] * 3 and len(dns.asked) == 1
        dns.error = None
        assert await lookup("feed.example", 443) == ANSWER  # asked again, and answered
        assert len(dns.asked) == 2

    asyncio.run(scenario())


def test_one_cancelled_connect_does_not_cancel_the_lookup_the_others_wait_for():
    async def scenario() -> None:
        dns = SlowDns()
        lookup = shared_lookups(dns)
        first, second = (asyncio.create_task(lookup("feed.example", 443)) for _ in range(2))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        dns.gate.set()
        assert await second == ANSWER and len(dns.asked) == 1

    asyncio.run(scenario())
