"""Start engines and a router as local processes on loopback, and stop them all, always
(the process harness, loadgen/processes.py: own sessions, logs, stopped on close, on error and at exit)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets

import aiohttp

from kvroute.loadgen.processes import Processes
from kvroute.router.contract.kv_auth import SECRET_ENV


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    engines: int = 4
    backend: str = "sim"
    num_blocks: int = 1024
    policy: str = "kv_aware"
    engine_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()  # per engine (default: all "both")
    admin_key: str | None = None  # given to the engines and the router (their admin APIs) and used here


class LocalCluster:
    def __init__(self, spec: ClusterSpec, log_dir: str | None = None) -> None:
        self.spec = spec
        # One shared secret per cluster signs its prefill/decode transfers (router/contract/kv_auth.py).
        self.kv_secret = os.environ.get(SECRET_ENV) or secrets.token_hex(16)
        # A log dir of our own is removed when the cluster ends cleanly and kept (errors name it) otherwise.
        self.processes = Processes(log_dir, env={"OMP_NUM_THREADS": "1", SECRET_ENV: self.kv_secret})
        self.log_dir = self.processes.log_dir
        self.engine_urls: list[str] = []
        self.router_url = ""

    async def start(self, timeout_s: float = 120.0) -> LocalCluster:
        s = self.spec
        for i in range(s.engines):
            role = s.roles[i] if i < len(s.roles) else "both"
            self.engine_urls.append(self.processes.server(
                f"engine-{i}", "engine", "--instance-id", f"e{i}", "--backend", s.backend, "--num-blocks",
                str(s.num_blocks), "--num-threads", "1", "--role", role, "--log-level", "WARNING", *self._admin(),
                *s.engine_args))
        self.router_url = self.processes.server(
            "router", "router", "--policy", s.policy, "--log-level", "WARNING",
            *[a for u in self.engine_urls for a in ("--engine", u)], *self._admin(), *s.router_args)
        await self._wait_ready(timeout_s)
        return self

    def _admin(self) -> tuple[str, ...]:
        return ("--admin-key", self.spec.admin_key) if self.spec.admin_key else ()

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        headers = {"Authorization": f"Bearer {self.spec.admin_key}"} if self.spec.admin_key else None
        async with aiohttp.ClientSession(headers=headers) as session:
            while True:
                dead = [p for p in self.processes.procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"a cluster process exited early (exit {dead[0].returncode}); "
                                       f"see the logs in {self.log_dir}")
                try:
                    async with session.get(self.router_url + "/router/instances") as r:
                        if r.status == 200:
                            rows = (await r.json())["instances"]
                            if len(rows) == self.spec.engines and all(i["routable"] for i in rows):
                                return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"the local cluster was not ready after {timeout_s:.0f}s; "
                                       f"see the logs in {self.log_dir}")
                await asyncio.sleep(0.2)

    def close(self) -> None:
        self.processes.close()

    async def __aenter__(self) -> LocalCluster:
        try:
            return await self.start()
        except BaseException:
            self.close()
            raise

    async def __aexit__(self, exc_type, *exc) -> None:
        self.processes.finish(exc_type is None)
