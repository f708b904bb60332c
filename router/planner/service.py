"""`kvroute planner` at work: every interval it reads a router's recent requests and fleet
(GET /router/stats), asks the planner (decide.py) and switches roles through the router's
admin API (POST /router/engines/{id}/role). Its own small server answers:

    GET /planner   the configuration and the last decisions, with their reasons
    GET /metrics   kvroute_planner_desired_replicas{role}, kvroute_planner_engines{role},
                   kvroute_planner_role_changes_total, kvroute_planner_errors_total
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

import kvroute.router.contract.metric_buckets  # noqa: F401  (turns off *_created series)
from kvroute.router.contract.http import json_response
from kvroute.router.contract.protocol import ROLES
from kvroute.router.fleet.upstream_errors import describe_failure
from kvroute.router.planner.decide import ORDER, EngineView, Observation, Plan, Planner, PlannerConfig
from kvroute.router.planner.recent import observation

log = logging.getLogger(__name__)


class PlannerService:
    def __init__(self, config: PlannerConfig, router_url: str, admin_key: str | None, dry_run: bool = False) -> None:
        self.config, self.router_url, self.dry_run = config, router_url.rstrip("/"), dry_run
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.planner = Planner(config)
        self.plans: collections.deque[Plan] = collections.deque(maxlen=200)
        self.session: aiohttp.ClientSession | None = None
        self.registry = r = CollectorRegistry()
        self.desired = Gauge("kvroute_planner_desired_replicas", "Replicas the load asks for, by role.", ["role"],
                             registry=r)
        self.engines = Gauge("kvroute_planner_engines", "Engines the planner aims at, by role.", ["role"], registry=r)
        self.changes = Counter("kvroute_planner_role_changes", "Role switches made.", registry=r)
        self.errors = Counter("kvroute_planner_errors", "Intervals that failed (router unreachable...).", registry=r)

    async def observe(self) -> Observation:
        c = self.config
        params = {"window": c.window_s, "slo_ttft": c.slo_ttft_s, "slo_tpot": c.slo_tpot_s}
        timeout = aiohttp.ClientTimeout(total=5)
        assert self.session is not None  # opened by the app's context (_ctx) before the loop runs
        async with self.session.get(self.router_url + "/router/stats", params=params, headers=self.headers,
                                    timeout=timeout) as r:
            if r.status != 200:
                raise ValueError(f"GET /router/stats answered HTTP {r.status}: {(await r.text())[:200]}")
            stats = await r.json()
        share = int(stats.get("workers") or 1)  # --workers N: one worker saw about 1/N of the requests
        engines = [EngineView(e["id"], e["role"], (e.get("load") or {}).get("running", 0),
                              (e.get("load") or {}).get("waiting", 0), bool(e.get("draining")))
                   for e in stats["engines"] if e.get("role") in ROLES and (e.get("routable") or e.get("draining"))]
        return observation(stats["models"]["*"], engines, time.time(), share)

    async def step(self) -> Plan:
        plan = self.planner.decide(await self.observe())
        if plan.changes and not self.dry_run:
            for engine_id, role in plan.changes.items():
                await self._switch(engine_id, role)
        self.plans.append(plan)
        for role in ORDER:
            self.engines.labels(role).set(plan.target.get(role, 0))
        for role, n in plan.desired.items():
            self.desired.labels(role).set(n)
        (log.warning if plan.changes else log.info)("planner: %s", plan.reason)
        return plan

    async def _switch(self, engine_id: str, role: str) -> None:
        url = f"{self.router_url}/router/engines/{engine_id}/role"
        assert self.session is not None  # opened by the app's context (_ctx) before the loop runs
        async with self.session.post(url, json={"role": role}, headers=self.headers,
                                     timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise ValueError(f"switching {engine_id} to {role} failed: HTTP {r.status}: {(await r.text())[:200]}")
        self.changes.inc()

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as e:
                self.errors.inc()
                log.warning("planner interval failed: %s", describe_failure(e))
            await asyncio.sleep(self.config.interval_s)


PLANNER = web.AppKey("planner", PlannerService)


async def _ctx(app: web.Application):
    service = app[PLANNER]
    service.session = aiohttp.ClientSession()
    task = asyncio.create_task(service.run(), name="planner")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await service.session.close()


async def handle_planner(request: web.Request) -> web.Response:
    service = request.app[PLANNER]
    return json_response({"router": service.router_url, "dry_run": service.dry_run,
                          "config": dataclasses.asdict(service.config), "bias": service.planner.bias,
                          "decisions": [p.to_dict() for p in reversed(service.plans)]})


async def handle_metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[PLANNER].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(service: PlannerService) -> web.Application:
    from kvroute.router.contract.http import error_middleware

    app = web.Application(middlewares=[error_middleware])
    app[PLANNER] = service
    app.cleanup_ctx.append(_ctx)
    app.router.add_get("/planner", handle_planner)
    app.router.add_get("/metrics", handle_metrics)
    return app
