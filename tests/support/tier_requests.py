"""Requests and probes the KV tier tests share: a session prompt, fillers that evict it, completions, metrics."""

import asyncio
import random

from kvroute.engine.core.work import SamplingParams

BS = 16
GREEDY = SamplingParams(temperature=0.0)
SESSION = random.Random(5).sample(range(5, 8000), 160)  # 10 blocks


def filler(seed: int, n: int = 300) -> list[int]:
    return random.Random(seed).sample(range(5, 8000), n)


async def complete(http, url, prompt, max_tokens=6):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        out = await r.json()
    return out["choices"][0]["text"], out["usage"]["prompt_tokens_details"]


async def metric(http, url, name, *labels) -> float:
    """Sum of the samples of `name` whose labels contain every string in `labels`."""
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(label in line for label in labels))


async def evict(http, url, seeds=(1, 2)):
    for seed in seeds:
        await complete(http, url, filler(seed), max_tokens=1)


async def wait_for(condition, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def at_least(coro, n):
    return await coro >= n


async def remote_written(http, url) -> int:
    """Blocks the engine has announced as written to the store (its `stored` events of tier remote)."""
    async with http.get(url + "/kv/events", params={"since": 0}) as r:
        events = (await r.json())["events"]
    return sum(len(e["blocks"]) for e in events if e["tier"] == "remote" and e["type"] == "stored")
