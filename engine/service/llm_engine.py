"""The engine server's driver of `EngineCore` (engine/core/engine_core.py): an asyncio loop, plus request handles.

Each turn of the loop is the core's step -- `begin_step` (schedule), the tier copies
and the model step on the runner, `finish_step` (postprocess) -- with the I/O around
it: tier copies and store calls (engine/kv/tier_service.py), remote prefills
(engine/transfer/remote_prefill.py), outputs to request handles, metrics. The
simulator drives the same core on its virtual clock (loadgen/sim/instance.py).

Requests enter through `add_request`, which returns a handle whose queue receives
one `Output` per generated token. Aborts (client gone, stop string hit) are applied
between steps, never while the runner is writing into a sequence's blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from kvroute.engine.config import EngineConfig
from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.engine_core import NO_FIT, CoreConfig, EngineCore
from kvroute.engine.core.event_wait import wait_set
from kvroute.engine.core.kv_events import KVChange, KVEventLog
from kvroute.engine.core.scheduler import Step
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.core.work import ModelRunner, SamplingParams, TokenLogprobs
from kvroute.engine.kv.tier_service import TierWiring, build_service
from kvroute.engine.kv.tier_setup import build_tiers
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.engine.transfer.kv_transfer import PinnedBlocks, TransferHandle
from kvroute.engine.transfer.remote_prefill import PullWiring, RemotePrefill
from kvroute.router.contract.errors import KVRouteError, Overloaded, Unavailable
from kvroute.router.contract.kv_auth import KVAuth, secret_from
from kvroute.router.contract.protocol import LoadRecord

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # how long stop() waits for the cancelled step loop to end


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
        site = config.tier_site(runner.info)
        tiers = build_tiers(config.tiers, site, runner.info, runner.kv_bytes_per_block, runner.prefill_rate_hint)
        batch = config.batch
        self.block_manager = BlockManager(batch.num_blocks, batch.block_size, tiers)
        self.core = EngineCore(CoreConfig(instance=config.server.instance, max_batched_tokens=batch.max_batched_tokens,
                                          max_running=batch.max_running, max_waiting=batch.max_waiting,
                                          max_model_len=runner.info.max_model_len,
                                          max_loras=config.runner.adapter_slots),
                               self.block_manager, stop_token_ids)
        self.scheduler = self.core.scheduler
        self.events = KVEventLog(config.server.instance, capacity=config.batch.event_buffer)
        self.requests: dict[str, RequestHandle] = {}
        self._aborts: dict[str, str] = {}  # request id -> finish reason
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.pinned = PinnedBlocks(config.server.kv_pin_ttl_s)
        self.auth = KVAuth(secret_from(config.server.kv_secret), config.server.kv_peers, config.server.instance)
        self.remote = RemotePrefill(PullWiring(  # any role may become decode-capable at run time
            block_manager=self.block_manager, runner=runner, metrics=metrics,
            admit_timeout_s=config.server.kv_admit_timeout_s, resume=self.resume, fail=self.fail_request,
            fail_overloaded=self.fail_overloaded))
        self.last_progress = time.monotonic()  # a step ended, or the loop went idle
        self.role = config.server.role  # changes at run time (POST /admin/role); running requests keep theirs
        self.draining = False  # set by a drain: no new requests
        # host pool / shared store I/O (engine/kv/tier_service.py); None without tiers
        self.kv = None if tiers is None else build_service(config.tiers, site, runner.info, TierWiring(
            tiers=tiers, device=self.block_manager, runner=runner, store_url=config.tiers.kv_store,
            max_fresh=self.core.max_fresh, wake=self.wake, publish=self._publish_remote), metrics.registry)

    # -- lifecycle ----------------------------------------------------------------

    async def start(self, local_info: dict) -> None:
        """Prepare the device (and, with tiers, measure it: recovery and the routers' credit start from
        what this device does), then serve."""
        self.events.append("cleared", [])
        costs = await asyncio.to_thread(self.runner.warm_up, self.kv is not None)
        if self.kv is not None:
            if costs is not None:
                self.kv.use_measured(costs, host_link=not self.config.tiers.kv_host_link)
            await self.kv.start()
        await self.remote.start(local_info)
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_TIMEOUT_S)
            if not done:  # a loop that lost its cancel must not hold the shutdown forever
                log.error("engine %s: the step loop did not stop within %.0f s of its cancel; shutting down without it",
                          self.config.server.instance, STOP_TIMEOUT_S)
            elif not self._task.cancelled() and (error := self._task.exception()) is not None:
                raise error
        await self.remote.stop()
        if self.kv is not None:
            await self.kv.stop()
        for handle in self.requests.values():
            handle.queue.put_nowait(Output(None, True, "abort", error="engine shutting down"))
        self.runner.close()

    # -- requests -----------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                    hash_seed: int, pin_kv: bool = False, adapter: str | None = None) -> RequestHandle:
        """Queue a request; with `pin_kv` its blocks stay pinned for a pull when it ends on length. `adapter`:
        the LoRA adapter it runs under (`hash_seed` must name it too: router/contract/protocol.py)."""
        handle = self._new_request(request_id, prompt_ids, sampling, hash_seed, adapter)
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
                           hash_seed: int, transfer: TransferHandle, adapter: str | None = None) -> RequestHandle:
        """A request prefilled by another engine: its first token is known, its K/V gets pulled."""
        handle = self._new_request(request_id, prompt_ids, sampling, hash_seed, adapter)
        seq = handle.seq
        seq.token_ids.append(transfer.first_token)
        seq.remote = transfer
        seq.num_cached = transfer.cached_tokens
        seq.first_token_time = seq.last_token_time = seq.arrival
        self.remote.add(seq)
        self._wakeup.set()
        return handle

    def _new_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                     hash_seed: int, adapter: str | None) -> RequestHandle:
        if self.core.queue_full:
            self.metrics.rejected.labels("queue_full").inc()
            raise Overloaded(f"engine queue is full ({self.config.batch.max_waiting} waiting requests)", retry_after=1)
        seq = Sequence(request_id, prompt_ids, sampling, hash_seed, arrival=time.monotonic(), adapter=adapter)
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
        """GET /load: the core's record; `waiting` includes remote prefills waiting for blocks."""
        return self.core.load_record(ts=time.time(), remote_waiting=len(self.remote.waiting),
                                     state="draining" if self.draining else "ready", role=self.role,
                                     kv_tiers=self.kv.kv_tiers() if self.kv is not None else {})

    # -- the loop -----------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._apply_aborts()
            self._housekeeping()
            self.last_progress = time.monotonic()
            if not self.scheduler.has_work():
                self._wakeup.clear()  # before any await: a request arriving from here on sets it again
                if self.kv is not None:
                    await self.kv.run_copies()  # what the last step left planned (reads for the store)
                    await self.kv.settle()
                if self.pinned.pinned or self.remote.waiting:
                    await wait_set(self._wakeup, 0.5)  # pins expire and waiting pulls time out even when nothing runs
                else:
                    await self._wakeup.wait()
                continue
            start = self.core.begin_step()
            step = start.step
            self._mark_scheduled(step)
            if self.kv is not None:
                await self.kv.run_copies()  # tier copies planned while scheduling, before the step
            self._publish_events()
            if start.dropped:
                self._deliver(Step(start.dropped, [0] * len(start.dropped)), [None] * len(start.dropped))
            if not step.seqs:
                self._fail(Step(self.core.unschedulable(), []), NO_FIT)
                if self.block_manager.has_pending_loads:  # waiting for store bytes: sleep until they come
                    self._wakeup.clear()
                    await wait_set(self._wakeup, 0.05)
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
            for seq in self.core.finish_step(step, tokens).pinned:
                self.pinned.pin(seq)
            self._housekeeping()
            self._publish_events()
            self._deliver(step, tokens)
            self.metrics.observe_state(self.core)
            await asyncio.sleep(0)  # the handlers write these tokens out before the next step is scheduled

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
        """Free expired pins, admit remote-prefilled requests."""
        for seq in self.pinned.pop_expired():
            self.block_manager.free(seq)
            self.metrics.kv_pins_expired.inc()
            log.warning("pinned KV of %s expired unpulled; blocks freed", seq.request_id)
        self.metrics.kv_pinned.set(len(self.pinned.pinned))
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
        for ev in self.core.drain_events():
            self.events.append(ev.kind, ev.blocks, ev.parent, ev.tier)
            self.metrics.kv_events.labels(ev.kind).inc()

    def _publish_remote(self, ev: KVChange) -> None:
        self.events.append(ev.kind, ev.blocks, ev.parent, tier=ev.tier, store=ev.store)
        self.metrics.kv_events.labels(ev.kind).inc()

    def _fail(self, step: Step, message: str) -> None:
        for seq in step.seqs:
            self.fail_request(seq, message)
