"""HTTP/2 frames (RFC 9113) as the endpoint picker's gRPC server reads and writes them: the frame
header packed with struct, the few frames a gRPC server sends built as bytes, and the response head
and trailers HPACK-encoded once (literal fields without indexing: no dynamic table state to keep)."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">BHBBL")  # length (24 bits: high byte, low 16), type, flags, stream id
U32 = struct.Struct(">L")
SETTING = struct.Struct(">HL")

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20

# error codes
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 0x6, 0x7, 0x9

# settings
ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x2, 0x3, 0x4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x5, 0x6
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1


class ConnectionError_(Exception):  # noqa: N801 - not the builtin: an HTTP/2 connection error and its code
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


DATA_MESSAGE = struct.Struct(">BHBBLBL")  # a DATA frame's header, then a gRPC message's prefix


def message_prefix(message: bytes) -> bytes:
    """A gRPC message's prefix: not compressed, its length."""
    return b"\0" + U32.pack(len(message))


def data_message(stream: int, message: bytes) -> bytes:
    """One DATA frame carrying one whole gRPC message (the caller checked it fits the peer's windows)."""
    n = 5 + len(message)
    return DATA_MESSAGE.pack(n >> 16, n & 0xFFFF, DATA, 0, stream, 0, len(message)) + message


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in values.items()))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6 bytes")
    return dict(SETTING.iter_unpack(payload))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, U32.pack(code))


def goaway(last_stream: int, code: int, message: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, U32.pack(last_stream) + U32.pack(code) + message.encode()[:200])


def unpadded(flags: int, payload: bytes, priority: bool = False) -> bytes:
    """A DATA or HEADERS frame's payload without its padding (and a HEADERS frame's priority fields)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
        start, end = 1, len(payload) - payload[0]
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if start > end:
        raise ConnectionError_(PROTOCOL_ERROR, "HEADERS frame too short for its priority fields")
    return payload[start:end]


# HPACK (RFC 7541), encoded once: ":status: 200" is static entry 8; the rest literal, never indexed
def _literal(name: bytes, value: bytes) -> bytes:
    assert len(name) < 127 and len(value) < 127, "short fields only: one-byte lengths"
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


RESPONSE_HEAD = b"\x88" + _literal(b"content-type", b"application/grpc")


def trailers_block(status: int, message: str = "") -> bytes:
    """grpc-status (and grpc-message, percent-encoded as gRPC asks) as an HPACK block."""
    block = _literal(b"grpc-status", str(status).encode())
    if message:
        quoted = "".join(c if 0x20 <= ord(c) < 0x7F and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
                         for c in message)[:120]
        block += _literal(b"grpc-message", quoted.encode())
    return block


OK_TRAILERS = trailers_block(0)
