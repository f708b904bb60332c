import os
import random
import subprocess
import sys

import pytest

from kvroute.router.contract import protocol
from kvroute.router.contract.protocol import (
    KVEvent,
    LoadRecord,
    block_hashes,
    hash_seed,
    py_block_hashes_of_bytes,
    py_u32le,
    u32le,
)

PINNED = [17411228942360384156, 8632648476289059976]  # block_hashes(range(40), 16, hash_seed("kvroute-tiny"))


def test_hash_of_fixed_tokens_is_pinned():
    # A change of byte encoding, seed derivation or chaining must never go unnoticed.
    seed = hash_seed("kvroute-tiny")
    assert seed == hash_seed("kvroute-tiny")
    hashes = block_hashes(list(range(40)), 16, seed)
    assert len(hashes) == 2  # the partial tail (8 tokens) is never hashed
    assert seed == 9777260554093661246
    assert hashes == PINNED
    assert py_block_hashes_of_bytes(u32le(range(40)), 16, seed) == PINNED  # the Python loop, whichever runs


def test_the_c_chain_agrees_with_the_python_loop():
    """router/contract/_chainhash.c, built by pip install where a C compiler exists (.ci/run checks that
    it was): it is in use, and on random ids, block sizes (small, 16, past its stack buffer), seeds,
    parents and partial tails it gives the Python loop's hashes."""
    chain = pytest.importorskip("kvroute.router.contract._chainhash", reason="not built: no C compiler?").chain

    assert protocol.CHAIN_IN_C and protocol._chain is chain
    rng = random.Random(5)
    for _ in range(200):
        bs = rng.choice([1, 2, 16, 17, 64, 65, 256])
        data = u32le([rng.randrange(2**32) for _ in range(bs * rng.randrange(0, 12) + rng.randrange(bs))])
        seed = rng.choice([0, 2**64 - 1, rng.randrange(2**64)])
        assert chain(data, bs, seed) == py_block_hashes_of_bytes(data, bs, seed)
        assert chain(memoryview(data), bs, seed) == py_block_hashes_of_bytes(data, bs, seed)
    with pytest.raises(OverflowError):
        chain(b"\0" * 64, 16, 2**64)
    with pytest.raises(ValueError):
        chain(b"\0" * 64, 0, 1)


def test_the_c_packing_agrees_with_array_and_refuses_what_it_refuses():
    pack = pytest.importorskip("kvroute.router.contract._chainhash", reason="not built: no C compiler?").u32le
    assert protocol._pack is pack
    rng = random.Random(6)
    ids = [rng.choice([0, 1, 2**31, 2**32 - 1, rng.randrange(2**32)]) for _ in range(5000)]
    assert pack(ids) == pack(tuple(ids)) == py_u32le(ids) == u32le(ids)
    assert pack([True, 2]) == py_u32le([True, 2])  # bools are ints to array('I') too
    for bad, error in (([-1], OverflowError), ([2**32], OverflowError), ([2**70], OverflowError),
                       ([1, 2.0], TypeError), (["1"], TypeError)):
        for f in (pack, py_u32le):
            with pytest.raises(error):
                f(bad)


def test_without_the_extension_the_python_loop_hashes_the_same():
    code = ("from router.contract import protocol as p; from router.contract.protocol import *; "
            "print(p.CHAIN_IN_C, block_hashes(list(range(40)), 16, hash_seed('kvroute-tiny')))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KVROUTE_NO_EXTENSION": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"False {PINNED}"


def test_chain_continues_from_parent():
    seed = hash_seed("m")
    tokens = list(range(100, 164))
    full = block_hashes(tokens, 16, seed)
    tail = block_hashes(tokens[32:], 16, seed, parent=full[1])
    assert full[2:] == tail


def test_seed_separates_models_and_salts():
    tokens = [1] * 32
    a = block_hashes(tokens, 16, hash_seed("m"))
    b = block_hashes(tokens, 16, hash_seed("m2"))
    c = block_hashes(tokens, 16, hash_seed("m", salt="lora-a"))
    assert a[0] != b[0] and a[0] != c[0] and b[0] != c[0]


def test_prefix_property():
    seed = hash_seed("m")
    a = block_hashes(list(range(64)), 16, seed)
    b = block_hashes(list(range(48)) + [9] * 16, 16, seed)
    assert a[:3] == b[:3] and a[3] != b[3]


def test_event_round_trip_and_validation():
    e = KVEvent(instance="e1", epoch=7, seq=3, type="stored", tier="device", blocks=(1, 2**64 - 1), parent=None)
    assert KVEvent.from_dict(e.to_dict()) == e
    with pytest.raises(ValueError):
        KVEvent(instance="e1", epoch=7, seq=3, type="bogus")
    with pytest.raises(ValueError):
        KVEvent.from_dict({"instance": "e1"})


def test_load_record_round_trip():
    r = LoadRecord(instance="e1", running=2, waiting=3, kv_used_blocks=10, kv_total_blocks=100,
                   queued_prefill_tokens=512, ts=1.0)
    assert LoadRecord.from_dict(r.to_dict()) == r
    assert r.kv_usage == pytest.approx(0.1)
    assert r.kv_free_blocks == -1 and r.kv_evictable == ()  # an engine that does not report them


def test_load_record_eviction_profile_is_checked():
    import json

    r = LoadRecord(instance="e1", running=0, waiting=0, kv_used_blocks=90, kv_total_blocks=100, queued_prefill_tokens=0,
                   ts=1.0, kv_free_blocks=10, kv_evictable=((60, 30.5), (20, 1.0)))
    assert LoadRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    base = r.to_dict()
    for bad in ([[1]], [[-1, 2.0]], [[1, -2.0]], "x", [[0, 1.0]] * 65, [["a", 1.0]]):
        with pytest.raises(ValueError, match="malformed load record"):
            LoadRecord.from_dict({**base, "kv_evictable": bad})
    with pytest.raises(ValueError, match="malformed load record"):
        LoadRecord.from_dict({**base, "kv_free_blocks": "many"})


@pytest.mark.parametrize("value,ok", [(0, True), (12345, True), (-1, True), (-2, False), (1.5, False), (True, False),
                                      ("7", False), (None, False)])
def test_load_record_progress_is_an_integer_or_minus_one(value, ok):
    base = LoadRecord(instance="e1", running=1, waiting=0, kv_used_blocks=0, kv_total_blocks=8,
                      queued_prefill_tokens=0, ts=1.0).to_dict()
    assert base["progress"] == -1  # not reported unless the engine says
    if ok:
        assert LoadRecord.from_dict({**base, "progress": value}).progress == value
    else:
        with pytest.raises(ValueError, match="progress must be an integer >= -1"):
            LoadRecord.from_dict({**base, "progress": value})


def test_encoding_matches_the_written_spec():
    import struct

    import xxhash

    seed = hash_seed("kvroute-tiny")
    tokens = list(range(70000, 70032))  # beyond 16 bits: catches a narrower encoding
    h0 = xxhash.xxh3_64_intdigest(struct.pack("<Q", seed) + struct.pack("<16I", *tokens[:16]))
    h1 = xxhash.xxh3_64_intdigest(struct.pack("<Q", h0) + struct.pack("<16I", *tokens[16:]))
    assert block_hashes(tokens, 16, seed) == [h0, h1]


@pytest.mark.parametrize("record", ["LoadRecord", "KVEvent", "EngineRecord", "TransferHandle"])
def test_records_that_cross_processes_refuse_positional_fields(record):
    """A field inserted later must break a positional caller loudly, not shift its values."""
    from kvroute.engine.transfer.kv_transfer import TransferHandle
    from kvroute.router.contract.registry_record import EngineRecord

    cls = {"LoadRecord": LoadRecord, "KVEvent": KVEvent, "EngineRecord": EngineRecord,
           "TransferHandle": TransferHandle}[record]
    with pytest.raises(TypeError):
        cls("e1", 1, 2, 3, 4, 5)
