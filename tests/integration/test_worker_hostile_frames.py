"""A real worker process against a hostile upstream (issue #11, findings 3 and 4).

The upstream is a small ``websockets.serve`` on 127.0.0.1 that sends a fixed script (by path)
on every connection (whatever ``from_seq`` says: the worker must skip what it already has) and
then holds the socket open. The script mixes valid frames with a 5,000-digit seq, a seq of
10^20-1, a seq jumping 2,000,000 ahead, a non-ASCII frame just under the item limit and one
over it. Assertions are on the messages table and the connection record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator

import fleet_helpers
import pytest
from fleet_helpers import UpstreamThread, wait_until
from websockets.asyncio.server import ServerConnection

from wsfleet.record import DesiredState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

fleet, spawn = fleet_helpers.fleet, fleet_helpers.spawn

CJK = "\u8a9e"  # 3 bytes of UTF-8; a JSON \u escape made it 6
UNDER = {"text": CJK * 129_000}  # 387 kB of UTF-8: under the 400 kB item limit when compact
OVER = CJK * 140_000  # 420 kB: no item can hold it

HOSTILE = [
    {"seq": 1, "data": "one"},
    {"seq": "9" * 5000, "data": "huge-digits"},  # int() would raise: the session crashed
    {"seq": 2, "data": "two"},
    {"seq": 10**20 - 1, "data": "past-2^53"},  # accepted, it jammed the stream for good
    {"seq": 3, "data": "three"},
    {"seq": 2_000_004, "data": "jump"},  # within 2^53 but far past the jump window
    {"seq": 4, "data": UNDER},
    {"seq": 5, "data": OVER},
    {"seq": 6, "data": "six"},
]
#: Only the size part: on the old code each frame parsed, and frame 4 was lost silently.
NON_ASCII = [{"seq": 1, "data": "one"}, {"seq": 2, "data": UNDER}, {"seq": 3, "data": "three"}]
SCRIPTS = {"/hostile": HOSTILE, "/non-ascii": NON_ASCII}


async def send_script(ws: ServerConnection) -> None:
    """Sends the path's script on each connection, then waits for the client to leave."""
    for frame in SCRIPTS[ws.request.path.partition("?")[0]]:
        await ws.send(json.dumps(frame, ensure_ascii=False))
    await ws.wait_closed()


@pytest.fixture
def upstream() -> Iterator[UpstreamThread]:
    with UpstreamThread(send_script) as running:
        yield running


def test_hostile_seqs_and_non_ascii_frames_are_stored_and_never_stall_the_stream(
    fleet, spawn, upstream
):
    # GIVEN a worker that accepts frames up to 1 MiB (so one can exceed a DynamoDB item)
    worker = spawn(WORKER_MAX_FRAME_BYTES=str(1024 * 1024))
    # WHEN it streams the hostile script
    fleet.start("hostile", upstream.url("hostile"))
    # THEN the checkpoint reaches the last genuine frame: nothing crashed or jammed it
    wait_until(
        lambda: fleet.record("hostile").last_seq == 6,
        timeout=60,
        message=lambda: f"checkpoint at {fleet.record('hostile').last_seq}\n{worker.tail(30)}",
    )
    items = fleet.stored("hostile")
    by_seq = {item["seq"]: item for item in items if "seq" in item}
    assert sorted(by_seq) == [1, 2, 3, 4, 5, 6]
    # the non-ASCII frame under the limit is stored whole, unescaped
    assert json.loads(by_seq[4]["message_data"]) == UNDER
    # the one over the limit is a marker: its size and digest, no data
    marker = by_seq[5]
    assert "message_data" not in marker and marker["oversize_bytes"] > 420_000
    assert marker["data_sha256"] == hashlib.sha256(OVER.encode()).hexdigest()
    # the three bad seqs are stored under local keys (once per connection), never dropped
    local = [item["message_data"] for item in items if "seq" not in item]
    assert {"huge-digits", "past-2^53", "jump"} <= set(local)
    # one session did it all: no crash, no reconnect
    assert upstream.connections == 1
    assert fleet.record("hostile").lease_epoch == 1


def test_a_non_ascii_frame_under_the_item_limit_is_stored_whole(fleet, spawn, upstream):
    # GIVEN the default frame limit and a 387 kB frame of CJK text in a JSON object
    spawn()
    # WHEN it is streamed between two small frames
    fleet.start("cjk", upstream.url("non-ascii"))
    wait_until(lambda: fleet.record("cjk").last_seq == 3, timeout=60)
    # THEN the checkpoint passed it only because it is stored, unescaped and whole
    by_seq = {item["seq"]: item for item in fleet.stored("cjk") if "seq" in item}
    assert sorted(by_seq) == [1, 2, 3]
    assert json.loads(by_seq[2]["message_data"]) == UNDER


async def trickle_fragments(ws: ServerConnection) -> None:
    """A fragmented message whose fragments come a byte at a time, forever (pings answered:
    websockets' server answers them while this generator sleeps)."""

    async def fragments():
        yield '{"seq": 1, "data": "'
        while True:
            await asyncio.sleep(0.05)
            yield "x"

    await ws.send(fragments())


def test_a_trickled_fragmented_message_is_timed_out_counted_and_shown(fleet, spawn):
    # GIVEN a worker whose incomplete messages must complete within half a second, and an
    # upstream that trickles one fragmented message on every connection
    with UpstreamThread(trickle_fragments) as upstream:
        worker = spawn(WORKER_MESSAGE_TIMEOUT_SECONDS="0.5", WORKER_BREAKER_MAX_FAILURES="2")
        # WHEN a connection streams it
        fleet.start("trickle", upstream.url("trickle"))
        # THEN each session is failed by the worker (1008 "message timeout"), which the
        # breaker counts: the connection ends FAILED instead of being held forever
        record = fleet.wait_for_state(
            "trickle", DesiredState.FAILED, timeout=60, message=lambda: worker.tail(30)
        )
        assert record.last_error == "closed_by_worker (code 1008: message timeout)"
        assert upstream.connections == 2
        wait_until(
            lambda: worker.metric_total("MessageTimeouts") >= 2,
            timeout=30,
            message="MessageTimeouts not emitted",
        )
