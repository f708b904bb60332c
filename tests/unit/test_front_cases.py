"""The router answers hostile bytes as the table says: every case of loadgen/chaos/front_cases.py
(the hostile rounds' upgrades, CONNECT, Host, header-count, bare-LF, Authorization, 100-continue,
stalled-body and framing cases) goes over a raw socket to a router, which must give the case's
statuses and connection behaviour (aiohttp's server under the connection rules of
router/contract/connections.py: the router's one HTTP server since the lean front was removed)."""

import asyncio
import logging
import time

from kvroute.loadgen.chaos.front_cases import CASES, FOLLOW, KEY, observe
from kvroute.loadgen.chaos.httpraw import exchange, read_response
from kvroute.router.contract.connections import CONNECTION_GUARD
from kvroute.router.service.app import CLUSTER

FAST = 0.01
IDLE_S = 1.5


async def _router(start_engine, start_router, **kw) -> tuple[int, object]:
    engine_url, _ = await start_engine(time_scale=FAST)
    url, server = await start_router([engine_url], api_key=(KEY,), header_timeout_s=1.0, body_timeout_s=1.0,
                                     idle_timeout_s=IDLE_S, max_body_bytes=1 << 20, **kw)
    deadline = time.monotonic() + 5
    while not server.app[CLUSTER].instances[0].routable:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    return int(url.rsplit(":", 1)[1]), server


async def test_every_case_is_answered_as_the_table_says(start_engine, start_router):
    port, server = await _router(start_engine, start_router)
    seen = await asyncio.gather(*(observe("127.0.0.1", port, case, IDLE_S) for case in CASES))
    wrong = [f"{case.name}: {outcome}, want {(case.statuses, case.after)}"
             for case, outcome in zip(CASES, seen) if outcome != (case.statuses, case.after)]
    assert not wrong, "\n".join(wrong)
    guard = server.app[CONNECTION_GUARD]
    assert guard.closed["body_timeout"] == 2 and guard.closed["header_timeout"] == 1
    assert guard.malformed.counts["bad_http_message"] >= 4 and guard.body_bytes == 0


async def test_malformed_requests_are_counted_and_logged_once_per_window(start_engine, start_router, caplog):
    """2,000 malformed heads wrote 1.1-2.8 MB of tracebacks; now a line per reason and window."""
    port, server = await _router(start_engine, start_router)
    bad = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"  # no Host
    with caplog.at_level(logging.INFO):
        for _ in range(10):
            outcomes = await asyncio.gather(*(exchange("127.0.0.1", port, bad, 1, wait_s=0) for _ in range(100)))
            assert all(o.statuses == (400,) for o in outcomes), outcomes[0]
    log = caplog.text
    assert len(log) < 2000 and "Traceback" not in log and log.count("malformed request") == 1, log
    assert server.app[CONNECTION_GUARD].malformed.counts == {"bad_http_message": 1000}
    answer = await exchange("127.0.0.1", port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 1)
    assert answer.statuses == (200,)
    _, _, body = await _get(port, "/metrics")
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
    port, _ = await _router(start_engine, start_router)
    ex = await exchange("127.0.0.1", port, FOLLOW, 1, follow=FOLLOW)
    assert ex.statuses == (200,) and ex.follow_status == 200
