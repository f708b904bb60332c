"""The engine loop: step -> schedule -> run -> postprocess, plus request handles.

Requests enter through `add_request`, which returns a handle whose queue receives
one `Output` per generated token. Aborts (client gone, stop string hit) are applied
between steps, never while the runner is writing into a sequence's blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.kv_events import KVEventLog
from engine.service.metrics import EngineMetrics
from engine.core.scheduler import Scheduler, SchedulerConfig, Step
from engine.transfer.kv_transfer import PinnedBlocks, TransferHandle
from engine.transfer.remote_prefill import RemotePrefill
from router.contract.kv_auth import KVAuth, secret_from
from engine.core.sequence import Sequence, SeqStatus
from engine.kv.tier_setup import build_service, build_tiers
from engine.core.work import ModelRunner, SamplingParams, TokenLogprobs
from router.contract.errors import KVRouteError, Overloaded, Unavailable
from router.contract.protocol import LoadRecord

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    token_id: int | None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    error_type: type[KVRouteError] = Unavailable  # how the HTTP edge reports `error`
    logprobs: TokenLogprobs | None = None  # when the request asked for logprobs


class RequestHandle:
    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.queue: asyncio.Queue[Output] = asyncio.Queue()

    @property
    def num_cached(self) -> int:
        return self.seq.num_cached

    @property
    def finished(self) -> bool:
        return self.seq.is_finished


class LLMEngine:
    def __init__(self, config: EngineConfig, runner: ModelRunner, stop_token_ids: frozenset[int],
                 metrics: EngineMetrics) -> None:
        self.config = config
        self.runner = runner
        self.metrics = metrics
        tiers = build_tiers(config, runner.info, runner.kv_bytes_per_block, runner.prefill_rate_hint)
        self.block_manager = BlockManager(config.num_blocks, config.block_size, tiers)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_batched_tokens, config.max_running, runner.info.max_model_len),
            self.block_manager,
            stop_token_ids,
        )
        self.events = KVEventLog(config.instance, capacity=config.event_buffer)
        self.requests: dict[str, RequestHandle] = {}
        self._aborts: dict[str, str] = {}  # request id -> finish reason
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.pinned = PinnedBlocks(config.kv_pin_ttl_s)
        self.auth = KVAuth(secret_from(config.kv_secret), config.kv_peers, config.instance)
        self.remote: RemotePrefill | None = None  # set by start_remote (decode-capable roles)
        self.last_progress = time.monotonic()  # a step ended, or the loop went idle
        self.role = config.role  # changes at run time (POST /admin/role); running requests keep theirs
        self.draining = False  # set by a drain: no new requests
        self.kv = build_service(self)  # host pool / shared store I/O (engine/kv/tier_service.py); None without tiers

    # -- lifecycle ----------------------------------------------------------------

    async def start(self, local_info: dict) -> None:
        self.events.append("cleared", [])
        if self.kv is not None:
            await self.kv.start()
        self.remote = RemotePrefill(self, local_info)  # any role may become decode-capable at run time
        await self.remote.start()
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.remote:
            await self.remote.stop()
        if self.kv is not None:
            await self.kv.stop()
        for handle in self.requests.values():
            handle.queue.put_nowait(Output(None, True, "abort", error="engine shutting down"))
        self.runner.close()

    # -- requests -----------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                    hash_seed: int, pin_kv: bool = False) -> RequestHandle:
        """Queue a request; with `pin_kv` its blocks stay pinned for a pull when it ends on length."""
        handle = self._new_request(request_id, prompt_ids, sampling, hash_seed)
        handle.seq.pin_kv = pin_kv
        if self.kv is not None:  # asks the shared store for what the local tiers lack, then queues
            self.kv.admit(handle.seq, self._enqueue)
        else:
            self._enqueue(handle.seq)
        return handle

    def _enqueue(self, seq: Sequence) -> None:
        self.scheduler.add(seq)
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    def add_remote_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                           hash_seed: int, transfer: TransferHandle) -> RequestHandle:
        """A request prefilled by another engine: its first token is known, its K/V gets pulled."""
        handle = self._new_request(request_id, prompt_ids, sampling, hash_seed)
        seq = handle.seq
        seq.token_ids.append(transfer.first_token)
        seq.remote = transfer
        seq.num_cached = transfer.cached_tokens
        seq.first_token_time = seq.last_token_time = seq.arrival
        self.remote.add(seq)
        self._wakeup.set()
        return handle

    def _new_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                     hash_seed: int) -> RequestHandle:
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            self.metrics.rejected.labels("queue_full").inc()
            raise Overloaded(f"engine queue is full ({self.config.max_waiting} waiting requests)", retry_after=1)
        seq = Sequence(request_id, prompt_ids, sampling, hash_seed, arrival=time.monotonic())
        handle = RequestHandle(seq)
        self.requests[request_id] = handle
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        return handle

    def resume(self, seq: Sequence) -> None:
        """A remote-prefilled sequence has its K/V (pulled, or to compute here): run it."""
        if seq.is_finished:
            return
        seq.status = SeqStatus.RUNNING
        self.scheduler.running.append(seq)
        self._publish_events()
        self._wakeup.set()

    def fail_request(self, seq: Sequence, message: str, error_type: type[KVRouteError] = Unavailable) -> None:
        self.scheduler.abort(seq)
        handle = self.requests.get(seq.request_id)
        if handle is not None:
            handle.queue.put_nowait(Output(None, True, "abort", error=message, error_type=error_type))
            self._retire(seq)

    def fail_overloaded(self, seq: Sequence, message: str) -> None:
        self.metrics.rejected.labels("no_kv_blocks").inc()
        self.fail_request(seq, message, Overloaded)

    def release_pinned(self, request_id: str) -> None:
        """A pinned prefill was pulled: drop the pin (its blocks stay in the prefix cache)."""
        seq = self.pinned.pop(request_id)
        if seq is not None:
            self.block_manager.free(seq)
            self._publish_events()
            self.metrics.kv_pinned.set(len(self.pinned.pinned))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request between steps; `reason` "stop" for a stop string (counted as vLLM does)."""
        handle = self.requests.get(request_id)
        if handle is not None and not handle.finished:
            self._aborts.setdefault(request_id, reason)
            self._wakeup.set()

    def stalled_for(self) -> float:
        """Seconds the step loop has been stuck with work to do (0 when it is moving)."""
        if not self.scheduler.has_work():
            return 0.0
        return max(0.0, time.monotonic() - self.last_progress)

    def load(self) -> LoadRecord:
        kv_free, kv_evictable = self.block_manager.kv_load()
        return LoadRecord(
            instance=self.config.instance,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_used_blocks=self.block_manager.num_used,
            kv_total_blocks=self.block_manager.num_blocks,
            queued_prefill_tokens=self.scheduler.queued_prefill_tokens,
            ts=time.time(),
            state="draining" if self.draining else "ready",
            role=self.role,
            kv_free_blocks=kv_free,
            kv_evictable=kv_evictable,
            kv_tiers=self.kv.kv_tiers() if self.kv is not None else {},
        )

    # -- the loop -----------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._apply_aborts()
            self._housekeeping()
            self.last_progress = time.monotonic()
            if not self.scheduler.has_work():
                if self.kv is not None:
                    await self.kv.run_copies()  # what the last step left planned (reads for the store)
                self._wakeup.clear()
                if self.pinned.pinned or (self.remote and self.remote.waiting):
                    try:  # pins expire and waiting pulls time out even when nothing runs
                        await asyncio.wait_for(self._wakeup.wait(), 0.5)
                    except asyncio.TimeoutError:
                        pass
                else:
                    await self._wakeup.wait()
                continue
            step = self.scheduler.schedule()
            self._mark_scheduled(step)
            if self.kv is not None:
                await self.kv.run_copies()  # tier copies planned while scheduling, before the step
            self._publish_events()
            if self.scheduler.dropped:
                self._deliver(Step(self.scheduler.dropped, [0] * len(self.scheduler.dropped)), [None] * len(self.scheduler.dropped))
                self.scheduler.dropped = []
            if not step.seqs:
                self._fail_unschedulable()
                if self.block_manager.has_pending_loads:  # waiting for store bytes: sleep until they come
                    self._wakeup.clear()
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), 0.05)
                    except asyncio.TimeoutError:
                        pass
                await asyncio.sleep(0)
                continue
            t0 = time.perf_counter()
            try:
                tokens = await self.runner.execute(step.works())
            except Exception as e:  # a runner bug must not kill the server
                log.exception("model step failed")
                self._fail(step, f"model step failed: {e}")
                continue
            finally:
                if self.kv is not None:
                    await self.kv.settle()  # the copies that ran during the step
            self.metrics.observe_step(time.perf_counter() - t0, sum(step.num_tokens))
            if self.kv is not None:
                self.kv.observe_step(sum(n for n in step.num_tokens if n > 1), time.perf_counter() - t0)
            self.scheduler.postprocess(step, tokens)
            self._housekeeping()
            self._publish_events()
            self._deliver(step, tokens)
            self.metrics.observe_state(self)

    def _deliver(self, step: Step, tokens: list[int | None]) -> None:
        now = time.monotonic()
        logprobs = getattr(tokens, "logprobs", None) or [None] * len(tokens)
        for seq, token, lp in zip(step.seqs, tokens, logprobs):
            handle = self.requests.get(seq.request_id)
            if handle is None:
                continue
            if token is not None:
                if seq.first_token_time is None:
                    seq.first_token_time = now
                    self.metrics.ttft.observe(now - seq.arrival)
                else:
                    self.metrics.observe_token_gap(now - seq.last_token_time)
                seq.last_token_time = now
                self.metrics.generation_tokens.inc()
                handle.queue.put_nowait(Output(token, seq.is_finished, seq.finish_reason, logprobs=lp))
            elif seq.is_finished:
                handle.queue.put_nowait(Output(None, True, seq.finish_reason))
            if seq.is_finished:
                self._retire(seq)

    def _housekeeping(self) -> None:
        """Pin finished prefills, free expired pins, admit remote-prefilled requests."""
        for seq in self.scheduler.pinned_out:
            self.pinned.pin(seq)
        self.scheduler.pinned_out.clear()
        for seq in self.pinned.pop_expired():
            self.block_manager.free(seq)
            self.metrics.kv_pins_expired.inc()
            log.warning("pinned KV of %s expired unpulled; blocks freed", seq.request_id)
        self.metrics.kv_pinned.set(len(self.pinned.pinned))
        if self.remote:
            self.remote.admit()

    def _apply_aborts(self) -> None:
        deferred = {}
        for request_id, reason in self._aborts.items():
            handle = self.requests.get(request_id)
            if handle is not None and handle.seq.pulling:
                deferred[request_id] = reason  # its blocks are being written: abort once the pull ends
            elif handle is not None and not handle.finished:
                self.scheduler.abort(handle.seq, reason)
                handle.queue.put_nowait(Output(None, True, "abort"))
                self.metrics.aborted.inc()
                self._retire(handle.seq)
        self._aborts = deferred

    def _retire(self, seq: Sequence) -> None:
        self.requests.pop(seq.request_id, None)
        self.metrics.observe_finished(seq, time.monotonic())

    @staticmethod
    def _mark_scheduled(step: Step) -> None:
        now = time.monotonic()
        for seq in step.seqs:
            if seq.scheduled_time is None:
                seq.scheduled_time = now

    def _publish_events(self) -> None:
        for ev in self.block_manager.drain_events():
            self.events.append(ev.kind, ev.blocks, ev.parent, ev.tier)
            self.metrics.kv_events.labels(ev.kind).inc()

    def _fail(self, step: Step, message: str) -> None:
        for seq in step.seqs:
            self.fail_request(seq, message)

    def _fail_unschedulable(self) -> None:
        """Nothing runs and the head of the queue cannot get blocks: it can never fit."""
        if self.scheduler.running or not self.scheduler.waiting:
            return
        seq = self.scheduler.waiting[0]
        self._fail(Step([seq], [0]), "prompt does not fit in the KV block pool")
