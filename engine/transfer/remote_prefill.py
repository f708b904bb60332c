"""Decode side of disaggregation: admit requests prefilled elsewhere and pull their K/V.

Pull-based: a request waits here until this engine has the blocks free (then it
takes them, FIFO), so a decode engine never accepts K/V it has no room for. Blocks
its own prefix cache already holds are not pulled. If the pull fails (prefill gone,
a block fails verification), the missing blocks are computed here instead: the
request still completes, only later.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import ModelRunner
from kvroute.engine.transfer.kv_transfer import LinkMismatch, Links, TransferError, TransferHandle, read_frames
from kvroute.router.contract.errors import KVRouteError
from kvroute.router.contract.protocol import block_hashes

log = logging.getLogger(__name__)


class PullMetrics(Protocol):
    """The pull's series of the engine's metrics (engine/service/metrics.py EngineMetrics has them)."""

    kv_pull_bytes: Any
    kv_pull_blocks: Any
    kv_pull_skipped: Any
    kv_pull_seconds: Any
    kv_pull_failures: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class PullWiring:
    """What the decode side of a transfer uses: the device pool, the runner, and callbacks into the engine."""

    block_manager: BlockManager
    runner: ModelRunner
    metrics: PullMetrics
    admit_timeout_s: float
    resume: Callable[[Sequence], None]  # the K/V is in (pulled, or to compute here): run it
    fail: Callable[[Sequence, str, type[KVRouteError]], None]
    fail_overloaded: Callable[[Sequence, str], None]


class RemotePrefill:
    def __init__(self, wiring: PullWiring) -> None:
        self.wiring = wiring
        self.bm, self.runner, self.metrics = wiring.block_manager, wiring.runner, wiring.metrics
        self.links: Links | None = None  # from start(): the local end of the handshake
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.session: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Task] = set()

    async def start(self, local_info: dict) -> None:
        self.links = Links(local_info)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, connect=5))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.session:
            await self.session.close()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> None:
        """Take blocks for waiting requests in arrival order; time out those that waited too long."""
        bm = self.bm
        while self.waiting:
            seq = self.waiting[0]
            if seq.is_finished:  # aborted while waiting
                self.waiting.popleft()
                continue
            hits = bm.match_prefix(seq)
            if not bm.can_allocate(seq, hits):
                break
            self.waiting.popleft()
            bm.allocate(seq, hits)
            seq.pulling = True
            task = asyncio.create_task(self._pull(seq, len(hits)), name=f"kv-pull-{seq.request_id}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        timeout = self.wiring.admit_timeout_s
        limit = time.monotonic() - timeout
        while self.waiting and self.waiting[0].arrival < limit:
            seq = self.waiting.popleft()
            self.wiring.fail_overloaded(seq, f"no free KV blocks for {timeout:g}s to receive the prefilled request")

    async def _pull(self, seq: Sequence, first_block: int) -> None:
        """Pull the blocks this engine lacks, then run the sequence. Whatever happens, the
        request ends up in a defined state: resumed with pulled K/V, resumed to compute the
        missing blocks here, or failed; never left `pulling` with its blocks held."""
        handle = seq.remote
        assert isinstance(handle, TransferHandle)  # the engine set it: a decode of a remote prefill
        metrics, bs = self.metrics, self.bm.block_size
        num_blocks = -(-handle.num_tokens // bs)
        metrics.kv_pull_skipped.inc(first_block)
        t0 = time.perf_counter()
        computed = first_block * bs  # if the pull fails: compute the rest here
        try:
            assert self.links is not None and self.session is not None  # made by start()
            await self.links.ensure(self.session, handle)
            if first_block < num_blocks:
                received = await self._receive(seq, handle, first_block, num_blocks)
                delay = getattr(self.runner, "transfer_time", None)
                if delay is not None:  # the sim runner models the link instead of moving bytes
                    await asyncio.sleep(delay(num_blocks - first_block))
                    received = (num_blocks - first_block) * self.runner.kv_bytes_per_block
                metrics.kv_pull_bytes.inc(received)
                metrics.kv_pull_blocks.inc(num_blocks - first_block)
            computed = handle.num_tokens
            metrics.kv_pull_seconds.observe(time.perf_counter() - t0)
        except LinkMismatch as e:  # refused link: fail this request with the reason
            seq.pulling = False
            self.wiring.fail(seq, e.message, LinkMismatch)
            return
        except asyncio.CancelledError:
            seq.pulling = False
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the pull means: compute it here
            log.warning("KV pull for %s from %s failed (%s: %s); computing it here", seq.request_id,
                        handle.address, type(e).__name__, e)
            metrics.kv_pull_failures.labels(type(e).__name__).inc()
        seq.pulling = False
        if seq.is_finished:
            return
        seq.num_computed = computed
        self.bm.commit_computed(seq)
        self.wiring.resume(seq)

    async def _receive(self, seq: Sequence, handle: TransferHandle, first: int, end: int) -> int:
        """Pull blocks [first, end) into this sequence's blocks; returns payload bytes."""
        bm, runner = self.bm, self.runner
        expected = block_hashes(seq.token_ids[: handle.num_tokens], bm.block_size, seq.hash_seed)
        body = {"request_id": handle.request_id, "from_block": first, "signature": handle.signature}
        received, block_ids, payloads = 0, [], []
        assert self.session is not None  # made by start()
        async with self.session.post(handle.address + "/kv/transfer", json=body) as r:
            if r.status != 200:
                raise TransferError(f"prefill answered HTTP {r.status}: {(await r.content.read(200))!r}")
            async for index, block_hash, payload in read_frames(r.content, runner.transfer_payload_bytes):
                want = expected[index] if index < len(expected) else 0
                if not first <= index < end or block_hash != want or index in block_ids:
                    raise TransferError(f"block {index} does not match the prompt (hash {block_hash} != {want})")
                block_ids.append(index)
                payloads.append(payload)
                received += len(payload)
        if len(block_ids) != end - first:
            raise TransferError(f"received {len(block_ids)} of {end - first} blocks")
        if received:  # one copy to the device (through pinned staging on CUDA), between steps
            targets = [seq.block_table[i] for i in block_ids]
            await asyncio.to_thread(runner.write_blocks, targets, payloads)
        return received

    def queued_tokens(self) -> int:
        return sum(len(s) for s in self.waiting)

