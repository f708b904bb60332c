"""The request header blocks of one HTTP/2 connection (router/service/ext_proc/grpc_connection.py),
HPACK-decoded (RFC 7541) with `hpack`, and kept by their bytes while the decoding table stays as it was.

Envoy's gRPC client sends every ext_proc call the same block once its table is warm: indexed fields
and `:path` as a literal without indexing. Only a literal with incremental indexing (first bits 01)
and a table size update (001) change the dynamic table; a block with neither decodes the same
whatever it follows, as long as no other block changed the table meanwhile. So such a block's fields
are kept and found again by its bytes, and every block that changes the table forgets them all."""

from __future__ import annotations

import hpack

KEPT = 64  # distinct blocks kept at once (Envoy's calls show one or two)


class BadHeaderBlock(Exception):
    """A block `hpack` cannot decode: a connection error (COMPRESSION_ERROR)."""


class HeaderBlocks:
    def __init__(self, max_table: int = 4096) -> None:
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = max_table
        self.kept: dict[bytes, dict[bytes, bytes]] = {}

    def decode(self, block: bytes) -> dict[bytes, bytes]:
        """The block's fields by name (a repeated name: its last value), raw bytes."""
        fields = self.kept.get(block)
        if fields is not None:
            return fields
        try:
            fields = dict(self.decoder.decode(block, raw=True))
        except hpack.HPACKError as e:
            raise BadHeaderBlock(str(e)) from None
        if changes_table(block):
            self.kept.clear()  # the table changed: what was kept may read differently now
        elif len(self.kept) < KEPT:
            self.kept[block] = fields
        return fields


def changes_table(block: bytes) -> bool:
    """Whether the block (one `hpack` decoded without error) adds to or resizes the decoding table."""
    at, end = 0, len(block)
    try:
        while at < end:
            first = block[at]
            if first & 0x80:  # indexed field: its index only
                at = _after_integer(block, at, 7)[1]
                continue
            if first & 0xC0 == 0x40 or first & 0xE0 == 0x20:  # incremental indexing; table size update
                return True
            index, at = _after_integer(block, at, 4)  # without indexing or never indexed
            if index == 0:  # a literal name
                at = _after_string(block, at)
            at = _after_string(block, at)
    except IndexError:
        return True  # not a block hpack took whole: kept nowhere
    return False


def _after_integer(block: bytes, at: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer of `prefix` bits at `at`: its value and where the next field begins."""
    mask = (1 << prefix) - 1
    value = block[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    while True:
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _after_string(block: bytes, at: int) -> int:
    length, at = _after_integer(block, at, 7)  # the Huffman bit is the prefix's eighth
    if at + length > len(block):
        raise IndexError("string past the block's end")
    return at + length
