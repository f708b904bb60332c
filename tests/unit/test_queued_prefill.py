"""A non-streamed request's prefill charge ends when the engine's load says its prefill is
done, not when the whole body (decode included) arrives (router/fleet/queued_prefill.py)."""

import asyncio
import dataclasses
import time

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.fleet.queued_prefill import QueuedPrefill


@dataclasses.dataclass(eq=False)
class Sent:
    uncached: int
    first_seen: bool = False


def load(ts: float, queued: int) -> LoadRecord:
    return LoadRecord(instance="e0", running=1, waiting=0, kv_used_blocks=1, kv_total_blocks=10,
                      queued_prefill_tokens=queued, ts=ts)


def test_the_newest_requests_make_up_the_engines_queue_and_the_older_ones_are_done():
    q = QueuedPrefill(margin_s=0.05)
    a, b, c, late = Sent(100), Sent(200), Sent(300), Sent(50)
    for t, d in ((1.0, a), (1.1, b), (1.2, c), (1.98, late)):
        q.add(d, now=t)
    assert q.release(load(2.0, queued=400)) == [a]  # c (300) + b (200) cover the 400 still queued
    assert q.release(load(2.0, queued=400)) == []  # released once
    assert q.release(load(2.5, queued=0)) == [late, c, b]  # the engine's queue is empty: all done
    assert len(q) == 0


def test_requests_answered_already_or_too_recent_are_left_alone():
    q = QueuedPrefill(margin_s=0.05)
    done, fresh = Sent(100, first_seen=True), Sent(100)
    q.add(done, now=1.0)
    q.add(fresh, now=1.99)
    assert q.release(load(2.0, queued=0)) == []  # `fresh` may still be on the wire
    assert len(q) == 1



def test_answered_requests_behind_one_still_in_flight_leave_at_the_next_report():
    q = QueuedPrefill(margin_s=0.05)
    waiting = Sent(100)
    answered = [Sent(10) for _ in range(50)]
    q.add(waiting, now=1.0)
    for i, d in enumerate(answered):
        q.add(d, now=1.1 + i * 0.01)
        d.first_seen = True  # answered whole: its prefill was released with the body
    assert q.release(load(3.0, queued=100)) == []  # `waiting` still makes up the engine's queue
    assert len(q) == 1  # the answered ones behind it are gone, not walked again at every report
    assert q.release(load(3.1, queued=0)) == [waiting] and len(q) == 0

async def test_a_decoding_non_streamed_request_stops_counting_as_queued_prefill(start_engine, start_router, http):
    engine, _ = await start_engine(time_scale=3.0)
    router, server = await start_router([engine])
    body = {"prompt": "tell me a long story " * 80, "max_tokens": 400, "ignore_eos": True}
    task = asyncio.create_task(http.post(router + "/v1/completions", json=body))
    seen = []
    for _ in range(300):
        async with http.get(router + "/router/instances") as r:
            (inst,) = (await r.json())["instances"]
        seen.append((inst["inflight"], inst["queued_prefill_tokens"]))
        if seen[-1][0] and seen[-1][1] == 0 and any(q for _, q in seen):
            break
        await asyncio.sleep(0.02)
    resp = await task
    assert resp.status == 200
    assert any(q > 0 for _, q in seen)  # charged while the prefill was queued ...
    assert seen[-1][0] == 1 and seen[-1][1] == 0, seen  # ... released while it still decodes
    resp.release()


def test_a_failed_non_streamed_request_is_uncharged_once():
    """It ended before its prefill was seen (error, retry, cancel): the end releases its charge,
    and a later load report must not release it a second time."""
    import types

    from kvroute.router.fleet.instance import Instance
    from kvroute.router.service.charges import Dispatch
    from kvroute.router.service.metrics import RouterMetrics

    inst = Instance("http://127.0.0.1:9")
    inst.kind = "kvroute"
    policy = types.SimpleNamespace(on_finished=lambda *a: None)
    router = types.SimpleNamespace(metrics=RouterMetrics(), policy=policy, policy_name="kv_aware")
    choice = types.SimpleNamespace(instance=inst, uncached_tokens=500)
    prepared = types.SimpleNamespace(model="m", route=None)
    dispatch = Dispatch(router, prepared, choice, whole_body=True)
    assert inst.queued_prefill_tokens == 500 and len(inst.nonstreamed) == 1
    dispatch.end("error")
    assert inst.queued_prefill_tokens == 0 and inst.inflight == 0
    assert inst.nonstreamed.release(load(time.time() + 1.0, queued=0)) == []
    assert inst.queued_prefill_tokens == 0
