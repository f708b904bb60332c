"""A client that leaves abruptly: a streamed request on a raw socket, reset after [DONE]."""

import asyncio
import socket
import struct
from urllib.parse import urlsplit

import orjson


async def stream_then_hang_up(url: str, body: dict) -> bytes:
    """POST a streamed request on a raw socket, read to [DONE], then reset the connection."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    payload = orjson.dumps(body)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    seen = b""
    while b"[DONE]" not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            break
        seen += chunk
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
    writer.transport.abort()
    return seen
