"""A cancel is never lost while waiting for an event (engine/core/event_wait.py).

asyncio.wait_for in Python 3.11 returns normally when the event is set in the same loop step as the
cancel: the engine's step loop then ran on after its cancel at shutdown, and the server's clean-up
awaited it forever (a CI run hung there). Each test below sets the event and cancels in one step.
"""

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from kvroute.engine.config import EngineConfig
from kvroute.engine.core.event_wait import wait_set
from kvroute.engine.core.kv_events import KVEventLog
from kvroute.engine.runners.registry import RUNNERS
from kvroute.engine.service import llm_engine
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.router.contract.settings_values import build


async def _set_and_cancel_in_one_step(event: asyncio.Event, waiter: asyncio.Task) -> None:
    await asyncio.sleep(0)  # the waiter is waiting
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_wait_set_reports_set_and_timed_out():
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    event.set()
    assert await wait_set(event, 0.01) is True


async def test_a_cancel_in_the_step_that_sets_the_event_propagates():
    event = asyncio.Event()
    await _set_and_cancel_in_one_step(event, asyncio.create_task(wait_set(event, 5.0)))


async def test_an_event_long_poll_cancelled_as_an_event_arrives_is_cancelled():
    log = KVEventLog("e0")
    waiter = asyncio.create_task(log.wait(since=log.seq, timeout=5.0))
    await asyncio.sleep(0)
    log.append("stored", [1, 2])
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_stop_does_not_wait_forever_for_a_loop_that_lost_its_cancel(monkeypatch, caplog):
    config = build(EngineConfig, instance_id="e0", backend="sim", num_threads=1)
    engine = llm_engine.LLMEngine(config, RUNNERS["sim"](config.runner, config.batch, config.tiers), frozenset(),
                                  EngineMetrics("kvroute-tiny", CollectorRegistry()))
    release = asyncio.Event()

    async def deaf_loop():
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # what a swallowed cancel amounts to

    engine._task = asyncio.create_task(deaf_loop())
    monkeypatch.setattr(llm_engine, "STOP_TIMEOUT_S", 0.2)
    with caplog.at_level(logging.ERROR, logger=llm_engine.__name__):
        await asyncio.wait_for(engine.stop(), 5.0)
    assert "did not stop within" in caplog.text and not engine._task.done()
    release.set()
    await engine._task
