"""A router in front of sim engines on loopback, and the prompts and requests the tests send it."""

from kvroute.router.service.app import CLUSTER
from tests.support.waiting import wait_for

FAST = 0.01  # sim engines' time scale


def prompt(group: int, question: int = 0) -> str:
    shared = f"System prompt for tenant {group}: " + "you are a careful assistant who answers briefly. " * 12
    return shared + f"Question {question}: what is {question} plus {group}?"


async def complete(http, url, text, max_tokens=3, stream=False, **extra):
    body = {"prompt": text, "max_tokens": max_tokens, "stream": stream, **extra}
    async with http.post(url + "/v1/completions", json=body) as r:
        payload = await r.read()
        return r.status, r.headers.get("x-kvroute-instance"), payload


async def cluster(start_engine, start_router, n=3, engine_kw=None, **router_kw):
    engines = [await start_engine(time_scale=FAST, **(engine_kw or {})) for _ in range(n)]
    url, server = await start_router([e[0] for e in engines], **router_kw)
    await wait_for(lambda: all(i.routable and not i.needs_resync for i in server.app[CLUSTER].instances))
    return url, server, engines
