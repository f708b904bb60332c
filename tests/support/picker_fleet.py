"""A router with its endpoint picker on (--ext-proc-port 0) over stub engines that report different
loads (so each decision has one clear winner, the one /router/explain shows), a gRPC channel to the
picker, and what tests read of it: what is still charged, the requests finished."""

import grpc
import orjson
from aiohttp import web

from kvroute.router.service.app import CLUSTER, ROUTER
from kvroute.router.service.app_keys import EXT_PROC_PORT, GATE
from tests.support.loopback import LoopbackServer
from tests.support.stub_engine import answer_ok, close_all, stub_engine
from tests.support.waiting import wait_for

PROMPT = " ".join(f"w{i}" for i in range(300))
BODY = orjson.dumps({"model": "kvroute-tiny", "prompt": PROMPT, "max_tokens": 4, "stream": True})


def endpoint(inst) -> str:
    return inst.url.removeprefix("http://")


def charged(server) -> dict:
    out = {f"{i.id} in flight": i.inflight for i in server.app[CLUSTER].instances}
    out.update({f"{i.id} prefill": i.queued_prefill_tokens for i in server.app[CLUSTER].instances})
    out["tenants"] = sum(server.app[GATE].limits.inflight.values())
    return {k: v for k, v in out.items() if v}


def busy(running: int):
    """A stub's /load with `running` requests: the stubs differ, so each decision has one clear winner."""

    async def on_load(default, request):
        resp = await default(request)
        return web.json_response({**orjson.loads(resp.body), "running": running})

    return on_load


def finished(server) -> dict:
    """The router's summary of the requests finished in the last minute (GET /router/stats)."""
    return server.app[ROUTER].recent.stats(60.0)["models"]["*"]


class PickerFleets:
    """Starts routers with the picker on over stub engines (`start`); `close` ends what it started."""

    def __init__(self, start_router) -> None:
        self.start_router = start_router
        self.started = []

    async def start(self, engines: int = 2, spread: int = 8, **router_kw):
        """(router URL, router server, gRPC channel to its picker) over `engines` stubs, stub i running
        i x `spread` requests (s0 the idlest; 0: alike)."""
        stubs = [await LoopbackServer(stub_engine(f"s{i}", answer_ok, on_load=busy(spread * i))).start()
                 for i in range(engines)]
        url, server = await self.start_router([s.url for s in stubs], ext_proc_port=0, **router_kw)
        await wait_for(lambda: all(i.routable and i.load is not None for i in server.app[CLUSTER].instances))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.app[EXT_PROC_PORT]}")
        self.started.append((stubs, channel))
        return url, server, channel

    async def close(self) -> None:
        for stubs, channel in self.started:
            await channel.close()
            await close_all(stubs)


async def explained(http, url, body: bytes) -> str:
    async with http.post(url + "/router/explain", data=body) as r:
        return (await r.json())["choice"]
