"""The connection guard's decisions on their own (router/contract/connections.py): whom a new
connection displaces at the cap, the cap on bodies being received and when the heap is trimmed,
and the once-per-window log of malformed requests."""

import asyncio
import logging

import pytest

from kvroute.router.contract import connections
from kvroute.router.contract.connections import MIB, ConnectionGuard, ConnectionLimits
from kvroute.router.contract.malformed import MalformedLog, reason_of


class Conn:
    def __init__(self, guard: ConnectionGuard, peer: str) -> None:
        self.guard, self.peer, self.displaced = guard, peer, False

    def displace(self) -> None:
        self.displaced = True
        self.guard.release(self.peer, self)


def test_a_new_connection_at_the_cap_displaces_the_one_waiting_longest_never_one_being_served():
    guard = ConnectionGuard(ConnectionLimits(max_connections=3, max_connections_per_peer=2))
    a, b, c = (Conn(guard, p) for p in ("10.0.0.1", "10.0.0.2", "10.0.0.3"))
    for conn in (a, b, c):
        assert guard.admit(conn.peer, conn) is None
    guard.wait(a)  # a made progress: it goes to the back
    guard.work(b)  # b has a whole request in hand
    d = Conn(guard, "10.0.0.4")
    assert guard.admit(d.peer, d) is None and c.displaced and not a.displaced and not b.displaced
    assert guard.open == 3 and guard.closed["displaced"] == 1
    guard.work(a)
    guard.work(d)
    e = Conn(guard, "10.0.0.5")
    assert guard.admit(e.peer, e) == "over_capacity"  # every open one is being served
    guard.release(a.peer, a)
    twice = [Conn(guard, "10.0.0.2") for _ in range(2)]
    assert guard.admit("10.0.0.2", twice[0]) is None
    assert guard.admit("10.0.0.2", twice[1]) == "over_peer_capacity"  # per peer: refused, no one displaced
    assert guard.closed["displaced"] == 1 and guard.open == 3


def test_bodies_being_received_are_capped_and_the_heap_trimmed_once_they_are_down(monkeypatch):
    trims = []
    monkeypatch.setattr(connections, "release_free_memory", lambda: trims.append(1))
    monkeypatch.setattr(connections, "TRIM_DELAY_S", 0.0)
    guard = ConnectionGuard(ConnectionLimits(body_buffer_bytes=32 * MIB))

    async def run():
        assert guard.take_body(20 * MIB) and guard.take_body(12 * MIB)
        assert not guard.take_body(1) and guard.body_buffer_refused == 1 and guard.body_bytes == 32 * MIB
        guard.give_body(12 * MIB)
        await asyncio.sleep(0.01)
        assert not trims  # still 20 MiB held
        guard.give_body(20 * MIB)
        await asyncio.sleep(0.01)
        assert trims == [1] and guard.body_bytes == 0
        guard.take_body(MIB)
        guard.give_body(MIB)  # a small body after: no trim for it
        await asyncio.sleep(0.01)
        assert trims == [1]

    asyncio.run(run())


def test_limits_are_checked():
    for bad in (dict(body_timeout_s=0), dict(connection_buffer_bytes=100), dict(body_buffer_bytes=1000)):
        with pytest.raises(ValueError):
            ConnectionLimits(**bad)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_malformed_requests_are_counted_each_and_logged_once_per_window_and_reason(caplog):
    from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine

    clock = Clock()
    malformed = MalformedLog(window_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            malformed.note(BadHttpMessage("Missing 'Host' header in request."), "10.0.0.1")
        malformed.note(BadStatusLine("Expected CRLF after version"), "10.0.0.2")
        clock.now = 61.0
        malformed.note(BadHttpMessage("Duplicate 'Host' header found."), "10.0.0.3")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "Traceback" not in caplog.text
    assert "bad_http_message" in lines[0] and "Missing 'Host'" in lines[0]
    assert "bad_status_line" in lines[1]
    assert "Duplicate 'Host'" in lines[2] and "[999 more since the last such line]" in lines[2]
    assert malformed.counts == {"bad_http_message": 1001, "bad_status_line": 1}
    assert reason_of(BadStatusLine("x")) == "bad_status_line"
