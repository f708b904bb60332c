"""The lean gRPC server's header blocks (router/service/ext_proc/header_blocks.py): a block that leaves
the HPACK table as it was is decoded once and found again by its bytes; one that changes the table
forgets them, so the same bytes read as the table says now."""

from __future__ import annotations

import hpack
import pytest

from kvroute.router.service.ext_proc.header_blocks import BadHeaderBlock, HeaderBlocks, changes_table

PATH = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def _indexed_and_literal(encoder: hpack.Encoder, authority: bytes) -> tuple[bytes, bytes]:
    """Envoy's first block of a connection (fields added to the table), then its every-call block."""
    fields = [(b":method", b"POST"), (b":authority", authority), (b"content-type", b"application/grpc")]
    first = encoder.encode([*fields[:1], hpack.NeverIndexedHeaderTuple(b":path", PATH), *fields[1:]])
    again = encoder.encode([*fields[:1], hpack.NeverIndexedHeaderTuple(b":path", PATH), *fields[1:]])
    return first, again


def test_a_block_that_leaves_the_table_is_decoded_once_and_kept():
    encoder, blocks = hpack.Encoder(), HeaderBlocks()
    first, again = _indexed_and_literal(encoder, b"kvroute_epp")
    assert changes_table(first) and not changes_table(again)
    assert blocks.decode(first)[b":authority"] == b"kvroute_epp"
    assert again not in blocks.kept
    fields = blocks.decode(again)
    assert fields == {b":method": b"POST", b":path": PATH, b":authority": b"kvroute_epp",
                      b"content-type": b"application/grpc"}
    assert blocks.kept[again] is fields  # the literal :path (without indexing) does not defeat the cache
    assert blocks.decode(again) is fields


def test_a_block_that_changes_the_table_forgets_what_was_kept():
    encoder, blocks = hpack.Encoder(), HeaderBlocks()
    first, again = _indexed_and_literal(encoder, b"one")
    blocks.decode(first)
    blocks.decode(again)
    # the table's newest entry (index 62) changes: the same indexed bytes now name another value
    blocks.decode(hpack.Encoder().encode([(b":authority", b"two")]))
    newest = bytes([0x80 | 62])
    assert blocks.decode(newest) == {b":authority": b"two"}
    blocks.decode(hpack.Encoder().encode([(b":authority", b"three")]))
    assert blocks.decode(newest) == {b":authority": b"three"}  # not the kept reading


@pytest.mark.parametrize("block", [
    b"\x20",  # a table size update (to 0)
    b"\x40\x01a\x01b",  # a literal with incremental indexing, new name
    b"\x3f\xe1\x1f",  # a size update with a multi-byte integer
], ids=["size update", "incremental indexing", "long size update"])
def test_table_changes_are_seen(block):
    assert changes_table(block)


def test_fields_without_indexing_change_nothing():
    assert not changes_table(b"\x83\x86" + b"\x00\x01a\x01b" + b"\x10\x01c\x01d" + b"\x04\x01e")
    assert changes_table(b"\x00\x01a\x05b")  # a string past the end: never kept


def test_a_bad_block_is_an_error():
    with pytest.raises(BadHeaderBlock):
        HeaderBlocks().decode(b"\xff\xff\xff\xff\xff\xff\xff")
