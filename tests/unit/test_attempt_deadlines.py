"""The attempts' deadlines on one timer (router/service/attempt_deadlines.py): each attempt ends
as `asyncio.timeout` would end it, one on an engine not seen moving sooner (silent, or reporting
without progress), a cancel from elsewhere stays a cancel, and many attempts share one timer."""

import asyncio
import time

import pytest

from kvroute.router.service.attempt_deadlines import Deadlines


class Inst:
    def __init__(self) -> None:
        self.load_seen = self.progress_seen = time.monotonic()  # a load report; one that showed it moving


async def test_an_attempt_past_its_deadline_raises_timeout_error():
    deadlines = Deadlines()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.start(0.05) as deadline:
            await asyncio.sleep(5)
    assert 0.04 <= time.monotonic() - t0 < 1.0
    assert deadline.silent_s is None
    assert len(deadlines) == 0
    await asyncio.sleep(0)  # the task carries no cancel left over: it awaits on normally
    assert asyncio.current_task().cancelling() == 0


async def test_an_attempt_that_ends_in_time_is_not_touched():
    deadlines = Deadlines()
    with deadlines.start(0.05):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # the timer fires with nothing in flight
    assert len(deadlines) == 0 and asyncio.current_task().cancelling() == 0


async def test_a_silent_engine_ends_the_attempt_before_its_deadline():
    deadlines, inst = Deadlines(), Inst()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.start(5.0, inst, 0.05) as deadline:
            await asyncio.sleep(5)
    assert time.monotonic() - t0 < 1.0
    assert deadline.silent_s is not None and deadline.silent_s >= 0.05
    assert deadline.silence == "no load report"


async def _reporting(inst, moving: bool) -> None:
    while True:
        inst.load_seen = time.monotonic()
        if moving:
            inst.progress_seen = inst.load_seen
        await asyncio.sleep(0.01)


# (the engine's load reports show it moving, the attempt's deadline, when it ends, why)
REPORTS = [(False, 5.0, (0.0, 1.0), "no progress"),  # reports, but the counter stands still: ends early
           (True, 0.3, (0.29, 5.0), None)]  # looked at several times, never still: ends at its deadline


@pytest.mark.parametrize("moving,wait_s,ends_within,silence", REPORTS)
async def test_an_attempt_lasts_while_load_reports_show_progress(moving, wait_s, ends_within, silence):
    deadlines, inst = Deadlines(), Inst()
    reporter = asyncio.create_task(_reporting(inst, moving))
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            with deadlines.start(wait_s, inst, 0.05) as deadline:
                await asyncio.sleep(5)
    finally:
        reporter.cancel()
    assert ends_within[0] <= time.monotonic() - t0 < ends_within[1]
    assert (deadline.silence or None) == silence and (deadline.silent_s is None) == (silence is None)
    if silence:
        assert deadline.silent_s >= 0.05


async def test_a_cancel_from_elsewhere_stays_a_cancel_even_when_the_deadline_passed_too():
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def attempt():
        with deadlines.start(0.05):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(attempt())
    await entered.wait()
    task.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await task

    async def attempt_past_its_deadline():
        with deadlines.start(0.02):
            try:
                await asyncio.sleep(5)
            finally:
                await asyncio.sleep(0.05)  # still inside when the client's cancel comes too

    task = asyncio.create_task(attempt_past_its_deadline())
    await asyncio.sleep(0.04)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_attempts_share_one_timer_and_each_ends_at_its_own_deadline():
    deadlines = Deadlines()
    ended: dict[int, float] = {}
    t0 = time.monotonic()

    async def attempt(i: int, wait: float):
        try:
            with deadlines.start(wait):
                await asyncio.sleep(5)
        except TimeoutError:
            ended[i] = time.monotonic() - t0

    tasks = [asyncio.create_task(attempt(i, 0.05 + 0.05 * (i % 3))) for i in range(30)]
    await asyncio.sleep(0)
    assert len(deadlines) == 30
    timers = {id(deadlines._timer)}
    await asyncio.sleep(0)
    assert {id(deadlines._timer)} == timers  # later attempts of equal length did not move it
    await asyncio.gather(*tasks)
    assert sorted(ended) == list(range(30))
    for i, at in ended.items():
        assert 0.05 + 0.05 * (i % 3) - 0.01 <= at < 0.05 + 0.05 * (i % 3) + 0.5
    assert len(deadlines) == 0


async def test_an_attempt_due_sooner_than_the_timer_moves_it():
    deadlines = Deadlines()
    t0 = time.monotonic()

    async def attempt(wait: float):
        with deadlines.start(wait):
            await asyncio.sleep(5)

    slow = asyncio.create_task(attempt(2.0))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        await attempt(0.05)
    assert time.monotonic() - t0 < 1.0
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
