"""The endpoint picker's two gRPC servers (--ext-proc-server lean, the default, and grpcio) answer the
same, spoken to with grpcio's client: many concurrent streams on one connection, a body echoed back
over the 64 KiB default window, a stream the client cancels (its charges released), health Check
and Watch, an unknown method (UNIMPLEMENTED), and a malformed frame or an oversized header block (a
connection error, no traceback, the server still serving other connections)."""

import asyncio
import json
import logging
import struct

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.ext_proc_client import ExtProcStream, echoed_body, request_body, request_headers, response_headers
from tests.support.picker_fleet import BODY, charged
from tests.support.waiting import wait_for

SERVERS = ["lean", "grpcio"]
SERVING = health_pb2.HealthCheckResponse.SERVING
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">BHBBL", len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream) + payload


async def exchange(channel, body: bytes = BODY) -> list:
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    answers = await stream.send(request_body(body, end=True), answers=1)
    while echoed_body(answers)[1][-1:] != [True]:
        answers.append(await stream.call.read())
    answers += await stream.send(response_headers(200), answers=1)
    assert await stream.end() == []
    return answers


@pytest.mark.parametrize("server", SERVERS)
async def test_many_concurrent_streams_on_one_connection(picker, server):
    url, app, channel = await picker(ext_proc_server=server)
    results = await asyncio.gather(*[exchange(channel) for _ in range(40)])
    for answers in results:
        assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body", "response_headers"]
        assert echoed_body(answers) == (BODY, [True])
    assert await wait_for(lambda: not charged(app)), charged(app)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_body_over_the_default_window_is_echoed_whole(picker, server):
    url, app, channel = await picker(ext_proc_server=server, max_body_bytes=1 << 20)
    big = json.dumps({**json.loads(BODY), "user": "u" * 300_000}).encode()
    answers = await exchange(channel, big)
    assert echoed_body(answers) == (big, [False] * 4 + [True])  # in 62,000-byte chunks
    assert await wait_for(lambda: not charged(app)), charged(app)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_stream_the_client_cancels_releases_its_charges(picker, server):
    url, app, channel = await picker(ext_proc_server=server)
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    await stream.send(request_body(BODY, end=True), answers=2)
    assert charged(app)  # picked: charged as sent
    stream.call.cancel()  # RST_STREAM
    assert await wait_for(lambda: not charged(app)), charged(app)


@pytest.mark.parametrize("server", SERVERS)
async def test_health_check_and_watch(picker, server):
    url, app, channel = await picker(ext_proc_server=server)
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
        assert (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status == SERVING
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    for name, status in (("readiness", SERVING),
                         ("nope", health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)):
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=name))
        assert (await watch.read()).status == status
        watch.cancel()


@pytest.mark.parametrize("server", SERVERS)
async def test_an_unknown_method_is_unimplemented(picker, server):
    url, app, channel = await picker(ext_proc_server=server)
    call = channel.unary_unary("/envoy.service.ext_proc.v3.ExternalProcessor/Nope")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(b"")
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def protocol_error(port: int, data: bytes) -> str:
    """What the server does to a connection sending `data` after the preface: 'goaway', 'rst', 'closed'
    (frames read until one of them), or 'nothing' after 5 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + frame(4, 0, 0, b"") + data)
    try:
        async with asyncio.timeout(5):
            while True:
                head = await reader.readexactly(9)
                length = head[0] << 16 | head[1] << 8 | head[2]
                await reader.readexactly(length)
                if head[3] in (7, 3):
                    return {7: "goaway", 3: "rst"}[head[3]]
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    except TimeoutError:
        return "nothing"
    finally:
        writer.close()


MALFORMED = {
    "a frame over the size allowed": struct.pack(">BHBBL", 0x20, 0, 0, 0, 1) + b"x" * 1000,  # says 2 MiB
    "a header block over the size allowed": frame(1, 0x4 | 0x1, 1, b"\x00" + bytes([0x7f, 0x81, 0x80, 0x01])
                                                  + b"x" * 20000 + b"\x01v"),
    "a window update of zero": frame(8, 0, 0, b"\0\0\0\0"),
}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_connection_is_refused_and_others_are_served(picker, server, case, caplog):
    from kvroute.router.service.app_keys import EXT_PROC_PORT

    url, app, channel = await picker(ext_proc_server=server)
    with caplog.at_level(logging.INFO):
        assert await protocol_error(app.app[EXT_PROC_PORT], MALFORMED[case]) in ("goaway", "rst", "closed")
    assert not any(r.exc_info for r in caplog.records)  # a one-line log, never a traceback
    stub = health_pb2_grpc.HealthStub(channel)
    assert (await stub.Check(health_pb2.HealthCheckRequest(service=""))).status == SERVING
    assert echoed_body(await exchange(channel))[0] == BODY


@pytest.mark.parametrize("server", SERVERS)
async def test_stop_lets_a_call_in_flight_finish_then_serves_no_more(server):
    from kvroute.benchmarks.ext_proc_floor import FixedExchange
    from kvroute.router.service.ext_proc.servers import make_server

    picker = make_server(server, lambda: FixedExchange("127.0.0.1:9"), lambda: True, "127.0.0.1", 0)
    await picker.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
        stream = ExtProcStream(channel)
        assert (await stream.send(response_headers(200), answers=1))[0].HasField("response_headers")  # it is open
        stopping = asyncio.create_task(picker.stop())
        answers = await stream.send(request_body(BODY, end=True), answers=2)  # still served while stopping
        assert echoed_body(answers) == (BODY, [True])
        assert await stream.end() == []
        await asyncio.wait_for(stopping, 4.0)  # when the call ended, not after the 5 s grace
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def _answers_ping_after(port: int, data: bytes) -> bool:
    """A connection sends `data` after the preface, then a PING: True when the PING is answered before
    the connection is refused (GOAWAY, or closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + frame(4, 0, 0, b"") + data + frame(6, 0, 0, b"12345678"))
    try:
        async with asyncio.timeout(5):
            while True:
                head = await reader.readexactly(9)
                payload = await reader.readexactly(head[0] << 16 | head[1] << 8 | head[2])
                if head[3] == 7:
                    return False
                if head[3] == 6 and head[4] & 1 and payload == b"12345678":
                    return True
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return False
    finally:
        writer.close()


@pytest.mark.parametrize("server", SERVERS)
async def test_late_headers_on_a_call_the_server_ended_leave_the_connection_up(picker, server):
    """Envoy multiplexes every request's ext_proc call on one connection: a frame in flight on a call
    the server already ended (here: an unknown method, answered and reset) must not end the others."""
    from kvroute.router.service.app_keys import EXT_PROC_PORT

    url, app, channel = await picker(ext_proc_server=server)
    opening = b"\x83\x86\x04\x05/Nope"  # :method POST, :scheme http, :path /Nope (literal, not indexed)
    late = frame(1, 0x4 | 0x1, 1, b"\x83")  # HEADERS with END_STREAM on the ended call
    assert await _answers_ping_after(app.app[EXT_PROC_PORT], frame(1, 0x4, 1, opening) + late)


@pytest.mark.parametrize("server", SERVERS)
async def test_data_over_the_granted_window_is_a_flow_control_error(picker, server):
    """A client that sends past the windows the server granted (here on a health Watch, whose handler
    reads one message and no more) is cut off, not buffered without bound."""
    from kvroute.router.service.app_keys import EXT_PROC_PORT

    url, app, channel = await picker(ext_proc_server=server)
    path = b"/grpc.health.v1.Health/Watch"
    opening = frame(1, 0x4, 1, b"\x83\x86\x04" + bytes([len(path)]) + path)
    message = b"\0" + struct.pack(">L", 16 << 10) + b"\0" * (16 << 10)  # 16 KiB messages nobody reads
    flood = b"".join(frame(0, 0, 1, b"\0\0\0\0\0" if i == 0 else message) for i in range(1 + 4 * 64))  # 4 MiB
    assert await protocol_error(app.app[EXT_PROC_PORT], opening + flood) in ("goaway", "rst", "closed")


def _localhost_is_dual_stack() -> bool:
    import socket

    families = {family for family, *_ in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    return {socket.AF_INET, socket.AF_INET6} <= families


@pytest.mark.skipif(not _localhost_is_dual_stack(), reason="localhost is one address here")
@pytest.mark.parametrize("server", SERVERS)
async def test_port_0_on_a_host_of_two_addresses_binds_one_port(server):
    """`localhost` is 127.0.0.1 and ::1: port 0 gets one port on both, the one reported."""
    from kvroute.benchmarks.ext_proc_floor import FixedExchange
    from kvroute.router.service.ext_proc.servers import make_server

    picker = make_server(server, lambda: FixedExchange("127.0.0.1:9"), lambda: True, "localhost", 0)
    await picker.start()
    try:
        for host in ("127.0.0.1", "[::1]"):
            async with grpc.aio.insecure_channel(f"{host}:{picker.port}") as channel:
                answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                         timeout=5)
                assert answer.status == SERVING
    finally:
        await picker.stop()


async def test_reset_calls_holding_unread_messages_give_back_no_more_window_than_was_sent(picker):
    """The lean server credits DATA to the connection's window as it arrives; a call reset while its
    messages are unread gives back only what it held back, so the connection window keeps bounding
    what a client can have buffered (it was credited twice: the window grew with every such call)."""
    from kvroute.router.service.app_keys import EXT_PROC_PORT

    url, app, channel = await picker(ext_proc_server="lean")
    path = b"/grpc.health.v1.Health/Watch"  # its handler reads one message and no more
    message = b"\0" + struct.pack(">L", 16000) + b"\0" * 16000
    sent, data = 0, PREFACE + frame(4, 0, 0, b"")
    for k in range(6):
        sid = 1 + 2 * k
        data += frame(1, 0x4, sid, b"\x83\x86\x04" + bytes([len(path)]) + path) + frame(0, 0, sid, b"\0" * 5)
        data += b"".join(frame(0, 0, sid, message) for _ in range(50))  # 800 KB unread, under HELD_LIMIT
        data += frame(3, 0, sid, b"\0\0\0\x08")  # RST_STREAM CANCEL
        sent += 5 + 50 * len(message)
    reader, writer = await asyncio.open_connection("127.0.0.1", app.app[EXT_PROC_PORT])
    writer.write(data)
    credited = 0
    try:
        async with asyncio.timeout(2):
            while True:
                head = await reader.readexactly(9)
                payload = await reader.readexactly(head[0] << 16 | head[1] << 8 | head[2])
                if head[3] == 8 and struct.unpack(">L", head[5:9])[0] == 0:  # WINDOW_UPDATE, the connection's
                    credited += struct.unpack(">L", payload)[0]
    except TimeoutError:
        pass
    finally:
        writer.close()
    initial = (16 << 20) - 65535  # the grant that raises the default window to 16 MiB
    assert 0 < credited - initial <= sent
