"""The decode side's pull (engine/transfer/remote_prefill.py) in process: a real block manager, a
loopback prefill peer that serves /kv/info and /kv/transfer frames, and a runner that records
what is written. What is pulled, what is skipped, what a bad peer costs, and when a waiting
request is admitted or refused."""

import asyncio
import time

import xxhash
from aiohttp import web

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.engine.transfer.kv_transfer import END_INDEX, FRAME, LinkMismatch, TransferHandle
from kvroute.engine.transfer.remote_prefill import PullWiring, RemotePrefill
from kvroute.router.contract.protocol import block_hashes
from tests.support.loopback import LoopbackServer

BS = 16
SEED = 5
PAYLOAD = 32
INFO = {"model": "m", "dtype": "float32", "block_size": BS, "num_layers": 2, "num_kv_heads": 2, "head_dim": 8}
PROMPT = list(range(100, 140))  # 40 tokens: 2 full blocks and a partial third


class Runner:
    transfer_payload_bytes = PAYLOAD
    kv_bytes_per_block = 1000

    def __init__(self):
        self.writes = []

    def write_blocks(self, targets, data):  # one call per pull: the payloads in order (copied once, to the device)
        self.writes.append((list(targets), data if isinstance(data, bytes) else b"".join(data)))


class SimRunner(Runner):
    def __init__(self):
        super().__init__()
        self.modelled = []

    def transfer_time(self, blocks):
        self.modelled.append(blocks)
        return 0.0


class Peer:
    """A prefill engine's transfer endpoints; `frames(from_block)` says what it sends."""

    def __init__(self, frames=None, status=200, info=None):
        self.asked = []
        self.frames = frames or self.right_frames
        self.status, self.info = status, info or {**INFO, "cluster_id": "c1"}

    @staticmethod
    def right_frames(first):
        hashes = block_hashes(PROMPT, BS, SEED)
        return [(i, hashes[i] if i < len(hashes) else 0) for i in range(first, 3)]

    def app(self):
        async def kv_info(_):
            return web.json_response(self.info)

        async def transfer(request):
            body = await request.json()
            self.asked.append(body)
            if self.status != 200:
                return web.Response(status=self.status, text="pinned blocks gone " + "x" * 300)
            resp = web.StreamResponse()
            await resp.prepare(request)
            for index, block_hash in self.frames(body["from_block"]):
                payload = bytes([index]) * PAYLOAD
                await resp.write(FRAME.pack(index, block_hash, xxhash.xxh3_64_intdigest(payload), PAYLOAD) + payload)
            await resp.write(FRAME.pack(END_INDEX, 0, 0, 0))
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/kv/info", kv_info)
        app.router.add_post("/kv/transfer", transfer)
        return app


class Decode:
    """A RemotePrefill with the callbacks recorded."""

    def __init__(self, num_blocks=8, runner=None, admit_timeout_s=30.0):
        self.bm = BlockManager(num_blocks, BS)
        self.runner = runner or Runner()
        self.metrics = EngineMetrics("m")
        self.resumed, self.failed, self.refused = [], [], []
        wiring = PullWiring(block_manager=self.bm, runner=self.runner, metrics=self.metrics,
                            admit_timeout_s=admit_timeout_s, resume=self.resumed.append,
                            fail=lambda seq, why, kind: self.failed.append((seq, why, kind)),
                            fail_overloaded=lambda seq, why: self.refused.append((seq, why)))
        self.pull = RemotePrefill(wiring)

    async def __aenter__(self):
        await self.pull.start(INFO)
        return self

    async def __aexit__(self, *exc):
        await self.pull.stop()

    def metric(self, name, **labels):
        labels = labels or {"model_name": "m"}
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def settle(self):
        while self.pull.tasks:
            await asyncio.gather(*self.pull.tasks, return_exceptions=True)


def sequence(address, prompt=PROMPT, request_id="r1", arrival=None):
    seq = Sequence(request_id, list(prompt), SamplingParams(max_tokens=4), SEED,
                   arrival=time.monotonic() if arrival is None else arrival)
    seq.remote = TransferHandle(cluster_id="c1", address=address, request_id=request_id,
                                block_hashes=tuple(block_hashes(prompt, BS, SEED)), num_tokens=len(prompt),
                                first_token=7, signature="sig")
    return seq


async def test_a_pull_writes_every_block_into_the_sequences_blocks_and_resumes_it():
    peer = Peer()
    async with Decode() as decode:
        server = await LoopbackServer(peer.app()).start()
        seq = sequence(server.url)
        decode.pull.add(seq)
        assert decode.pull.queued_tokens() == 40
        decode.pull.admit()
        assert decode.pull.queued_tokens() == 0 and seq.pulling and len(seq.block_table) == 3
        await decode.settle()
        await server.close()
    assert peer.asked == [{"request_id": "r1", "from_block": 0, "signature": "sig"}]
    assert decode.resumed == [seq] and not seq.pulling and seq.num_computed == 40
    written = bytes([0]) * PAYLOAD + bytes([1]) * PAYLOAD + bytes([2]) * PAYLOAD
    assert decode.runner.writes == [(seq.block_table, written)]
    assert seq.block_hashes == block_hashes(PROMPT, BS, SEED)  # committed: findable by a later prompt
    assert decode.metric("kvroute_engine_kv_pull_blocks_total") == 3
    assert decode.metric("kvroute_engine_kv_pull_bytes_total") == 3 * PAYLOAD
    assert decode.metric("kvroute_engine_kv_pull_skipped_blocks_total") == 0
    assert decode.metric("kvroute_engine_kv_pull_seconds_count") == 1


async def test_blocks_the_prefix_cache_holds_are_not_pulled():
    peer = Peer()
    async with Decode() as decode:
        local = Sequence("l", PROMPT[:33], SamplingParams(max_tokens=1), SEED)
        decode.bm.allocate(local, decode.bm.match_prefix(local))
        local.num_computed = 33
        decode.bm.commit_computed(local)
        decode.bm.free(local)  # the first 2 blocks are cached here
        seq = await pull_from(peer, decode)
    assert [a["from_block"] for a in peer.asked] == [2]
    assert decode.runner.writes == [([seq.block_table[2]], bytes([2]) * PAYLOAD)]
    assert decode.metric("kvroute_engine_kv_pull_skipped_blocks_total") == 2
    assert decode.metric("kvroute_engine_kv_pull_blocks_total") == 1 and seq.num_computed == 40


async def pull_from(peer, decode, prompt=PROMPT):
    server = await LoopbackServer(peer.app()).start()
    try:
        seq = sequence(server.url, prompt)
        decode.pull.add(seq)
        decode.pull.admit()
        await decode.settle()
    finally:
        await server.close()
    return seq


async def failed_pull(peer):
    async with Decode() as decode:
        seq = await pull_from(peer, decode)
    assert decode.resumed == [seq] and seq.num_computed == 0 and not seq.pulling  # computed here instead
    assert decode.runner.writes == []
    assert decode.metric("kvroute_engine_kv_pull_failures_total", reason="TransferError") == 1
    assert decode.metric("kvroute_engine_kv_pull_blocks_total") == 0
    return seq


async def test_a_frame_with_another_blocks_hash_fails_the_pull():
    await failed_pull(Peer(frames=lambda first: [(0, 1), (1, 2), (2, 0)]))


async def test_a_frame_for_the_partial_block_must_carry_no_hash():
    right = Peer.right_frames(0)
    await failed_pull(Peer(frames=lambda first: right[:2] + [(2, 12345)]))


async def test_a_frame_before_the_first_block_or_past_the_last_fails_the_pull():
    right = Peer.right_frames(0)
    await failed_pull(Peer(frames=lambda first: right + [(3, 0)]))


async def test_a_repeated_frame_fails_the_pull():
    right = Peer.right_frames(0)
    await failed_pull(Peer(frames=lambda first: [right[0], right[0], right[1], right[2]]))


async def test_missing_frames_fail_the_pull():
    await failed_pull(Peer(frames=lambda first: Peer.right_frames(first)[:2]))


async def test_an_error_answer_fails_the_pull():
    await failed_pull(Peer(status=410))


async def test_a_pull_that_fails_keeps_the_locally_cached_prefix():
    async with Decode() as decode:
        local = Sequence("l", PROMPT[:17], SamplingParams(max_tokens=1), SEED)
        decode.bm.allocate(local, decode.bm.match_prefix(local))
        local.num_computed = 17
        decode.bm.commit_computed(local)
        decode.bm.free(local)  # block 0 is cached here
        seq = await pull_from(Peer(status=500), decode)
    assert seq.num_computed == BS and decode.resumed == [seq]


async def test_a_prefill_of_another_layout_fails_the_request():
    async with Decode() as decode:
        seq = await pull_from(Peer(info={**INFO, "cluster_id": "c1", "head_dim": 16}), decode)
    assert decode.resumed == [] and not seq.pulling
    [(failed, why, kind)] = decode.failed
    assert failed is seq and kind is LinkMismatch and "head_dim 16 != ours 8" in why


async def test_a_sequence_finished_while_pulling_is_not_resumed():
    peer = Peer()
    async with Decode() as decode:
        server = await LoopbackServer(peer.app()).start()
        seq = sequence(server.url)
        decode.pull.add(seq)
        decode.pull.admit()
        seq.status = type(seq.status).FINISHED  # aborted by its client meanwhile
        await decode.settle()
        await server.close()
    assert decode.resumed == [] and not seq.pulling


def cache_prefix(decode, tokens):
    local = Sequence("l", list(tokens), SamplingParams(max_tokens=1), SEED)
    decode.bm.allocate(local, decode.bm.match_prefix(local))
    local.num_computed = len(tokens)
    decode.bm.commit_computed(local)
    decode.bm.free(local)


async def test_a_simulated_link_counts_whole_blocks_of_kv_bytes():
    async with Decode(runner=SimRunner()) as decode:
        await pull_from(Peer(), decode)
    assert decode.metric("kvroute_engine_kv_pull_bytes_total") == 3 * 1000
    async with Decode(runner=SimRunner()) as decode:
        cache_prefix(decode, PROMPT[:33])  # 2 blocks here: 1 to move over the modelled link
        await pull_from(Peer(), decode)
    assert decode.runner.modelled == [1] and decode.metric("kvroute_engine_kv_pull_bytes_total") == 1000
    assert 0 < decode.metric("kvroute_engine_kv_pull_seconds_sum") < 60


async def test_a_failed_pull_is_logged_with_its_reason(caplog):
    right = Peer.right_frames(0)
    cases = [(Peer(frames=lambda first: right + [(3, 0)]), "TransferError: block 3 does not match the prompt "
                                                            "(hash 0 != 0)"),
             (Peer(frames=lambda first: [(0, 1)] + right[1:]), f"TransferError: block 0 does not match the prompt "
                                                                f"(hash 1 != {right[0][1]})"),
             (Peer(frames=lambda first: right[:1]), "TransferError: received 1 of 3 blocks"),
             (Peer(status=410), f"TransferError: prefill answered HTTP 410: {b'pinned blocks gone ' + b'x' * 181!r}")]
    for peer, reason in cases:
        caplog.clear()
        async with Decode() as decode:
            seq = await pull_from(peer, decode)
        address = seq.remote.address
        assert f"KV pull for r1 from {address} failed ({reason}); computing it here" in caplog.text, caplog.text


async def test_stop_cancels_a_pull_in_flight_and_ends_its_pulling():
    async def never(request):
        await asyncio.sleep(3600)

    app = web.Application()
    app.router.add_get("/kv/info", lambda _: web.json_response({**INFO, "cluster_id": "c1"}))
    app.router.add_post("/kv/transfer", never)
    server = await LoopbackServer(app).start()
    try:
        decode = Decode()
        await decode.pull.start(INFO)
        seq = sequence(server.url)
        decode.pull.add(seq)
        decode.pull.admit()
        await asyncio.sleep(0.2)  # the pull is waiting on the peer
        assert seq.pulling
        await decode.pull.stop()
        assert not seq.pulling and decode.resumed == [] and decode.failed == []
    finally:
        await server.close()


async def test_requests_wait_in_order_for_room_and_time_out():
    async with Decode(num_blocks=4, admit_timeout_s=5.0) as decode:
        first = sequence("http://127.0.0.1:1", request_id="a")  # 3 blocks
        second = sequence("http://127.0.0.1:1", request_id="b", arrival=time.monotonic() - 4.0)
        late = sequence("http://127.0.0.1:1", request_id="c", arrival=time.monotonic() - 60.0)
        gone = sequence("http://127.0.0.1:1", request_id="d")
        gone.status = type(gone.status).FINISHED
        for s in (gone, first, second, late):
            decode.pull.add(s)
        decode.pull.admit()
        assert first.pulling and not second.pulling and list(decode.pull.waiting) == [second, late]
        assert decode.refused == [] and decode.pull.queued_tokens() == 80  # b holds c back: FIFO
        decode.pull.waiting.popleft()
        decode.pull.admit()
        assert [(s.request_id, why) for s, why in decode.refused] == [
            ("c", "no free KV blocks for 5s to receive the prefilled request")]
        await decode.settle()
