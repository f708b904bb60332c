"""Both HTTP fronts answer the same to the same bytes: every case of loadgen/chaos/front_cases.py
(the hostile rounds' upgrades, CONNECT, Host, header-count, bare-LF, Authorization, 100-continue,
stalled-body and framing cases) goes over a raw socket to a lean router and an aiohttp router, and
each must give the case's statuses and connection behaviour, the same on both."""

import asyncio
import logging
import time

import pytest

from kvroute.loadgen.chaos.front_cases import CASES, FOLLOW, KEY, observe
from kvroute.loadgen.chaos.httpraw import exchange, read_response
from kvroute.router.contract.connections import CONNECTION_GUARD
from kvroute.router.service.app import CLUSTER
from kvroute.router.service.lean_server import available

pytestmark = pytest.mark.skipif(not available(), reason="httptools is not installed")

FAST = 0.01
IDLE_S = 1.5
FRONTS = ("lean", "aiohttp")


async def _routers(start_engine, start_router, **kw) -> dict[str, tuple[int, object]]:
    engine_url, _ = await start_engine(time_scale=FAST)
    routers = {}
    for front in FRONTS:
        url, server = await start_router([engine_url], http_server=front, api_key=(KEY,), header_timeout_s=1.0,
                                         body_timeout_s=1.0, idle_timeout_s=IDLE_S, max_body_bytes=1 << 20, **kw)
        deadline = time.monotonic() + 5
        while not server.app[CLUSTER].instances[0].routable:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        routers[front] = int(url.rsplit(":", 1)[1]), server
    return routers


async def test_both_fronts_answer_every_case_alike(start_engine, start_router):
    routers = await _routers(start_engine, start_router)
    runs = [(case, front) for case in CASES for front in FRONTS]
    seen = await asyncio.gather(*(observe("127.0.0.1", routers[front][0], case, IDLE_S) for case, front in runs))
    got = {(case.name, front): outcome for (case, front), outcome in zip(runs, seen)}
    wrong = [f"{case.name} [{front}]: {got[case.name, front]}, want {(case.statuses, case.after)}"
             for case in CASES for front in FRONTS if got[case.name, front] != (case.statuses, case.after)]
    assert not wrong, "\n".join(wrong)
    for _, server in routers.values():
        guard = server.app[CONNECTION_GUARD]
        assert guard.closed["body_timeout"] == 2 and guard.closed["header_timeout"] == 1
        assert guard.malformed.counts["bad_http_message"] >= 4 and guard.body_bytes == 0


async def test_malformed_requests_are_counted_and_logged_once_per_window(start_engine, start_router, caplog):
    """2,000 malformed heads wrote 1.1-2.8 MB of tracebacks; now a line per reason and window."""
    routers = await _routers(start_engine, start_router)
    bad = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"  # no Host
    with caplog.at_level(logging.INFO):
        for port, _ in routers.values():
            for _ in range(10):
                outcomes = await asyncio.gather(*(exchange("127.0.0.1", port, bad, 1, wait_s=0) for _ in range(100)))
                assert all(o.statuses == (400,) for o in outcomes), outcomes[0]
    log = caplog.text
    assert len(log) < 2000 and "Traceback" not in log and log.count("malformed request") == 2, log
    for port, server in routers.values():
        assert server.app[CONNECTION_GUARD].malformed.counts == {"bad_http_message": 1000}
        answer = await exchange("127.0.0.1", port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 1)
        assert answer.statuses == (200,)
    _, _, body = await _get(routers["lean"][0], "/metrics")
    assert b'kvroute_router_malformed_requests_total{reason="bad_http_message"} 1000.0' in body


async def _get(port: int, path: str) -> tuple[int, dict, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    try:
        return await asyncio.wait_for(read_response(reader), 10)
    finally:
        writer.close()


async def test_a_follow_up_on_a_kept_alive_connection_is_answered(start_engine, start_router):
    """The observation `open` means what it says: the follow-up request is served (a sanity check of
    the table's harness, whose other outcomes depend on it)."""
    routers = await _routers(start_engine, start_router)
    for port, _ in routers.values():
        ex = await exchange("127.0.0.1", port, FOLLOW, 1, follow=FOLLOW)
        assert ex.statuses == (200,) and ex.follow_status == 200
