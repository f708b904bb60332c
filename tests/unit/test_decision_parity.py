"""The same requests get the same decisions through the three front doors (router/service/request_path.py):
the HTTP proxy, the endpoint picker (Envoy's ext_proc, over real gRPC) and the route-only API. Three
routers alike (same seed, stubs alike) each get one sequence of 12 shared-prefix groups of two
whole completions through one door, every request finished before the next; the choices must match,
request by request, and spread over more than one instance (so the decisions say something)."""

import orjson

from kvroute.router.service.app import CLUSTER
from tests.support.ext_proc_client import ExtProcStream, request_body, request_headers, response_headers
from tests.support.picker_fleet import charged
from tests.support.waiting import wait_for


def bodies() -> list[bytes]:
    out = []
    for group in range(12):
        shared = " ".join(f"g{group}w{i}" for i in range(120))
        for turn in range(2):
            out.append(orjson.dumps({"model": "kvroute-tiny", "prompt": f"{shared} question {turn}", "max_tokens": 2}))
    return out


async def through_proxy(http, url, server, channel, body: bytes) -> str:
    async with http.post(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        return r.headers["x-kvroute-instance"]


async def through_picker(http, url, server, channel, body: bytes) -> str:
    stream = ExtProcStream(channel)
    await stream.call.write(request_headers())
    answers = await stream.send(request_body(body, end=True), answers=2)
    mutation = answers[0].request_headers.response.header_mutation.set_headers
    chosen = next(h.header.raw_value.decode() for h in mutation if h.header.key == "x-kvroute-instance")
    await stream.send(response_headers(200, "application/json"), answers=1)
    await stream.end()
    await wait_for(lambda: not charged(server))
    return chosen


async def through_route_api(http, url, server, channel, body: bytes) -> str:
    async with http.post(url + "/v1/route", data=body) as r:
        answer = await r.json()
    async with http.post(f"{url}/v1/route/{answer['route_id']}/finish", json={"status": 200}) as r:
        assert r.status == 200
    return answer["instance"]


async def test_proxy_picker_and_route_api_decide_alike(picker, http):
    choices = {}
    for door in (through_proxy, through_picker, through_route_api):
        url, server, channel = await picker(engines=3, spread=0)
        choices[door.__name__] = [await door(http, url, server, channel, body) for body in bodies()]
        assert not charged(server)
        assert {i.id for i in server.app[CLUSTER].instances} >= set(choices[door.__name__])
    proxy = choices["through_proxy"]
    assert len(set(proxy)) >= 2, proxy
    assert choices["through_picker"] == proxy
    assert choices["through_route_api"] == proxy
