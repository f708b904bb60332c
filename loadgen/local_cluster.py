"""Start engines and a router as local processes on loopback, and stop them all, always.

Every process is started in its own session and killed (SIGTERM, then SIGKILL)
when the cluster is closed, on error, or at interpreter exit (Ctrl-C included).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import aiohttp

from kvroute.router.contract.kv_auth import SECRET_ENV

_live: set[subprocess.Popen] = set()


def _kill_all() -> None:
    for proc in list(_live):
        stop_process(proc)


atexit.register(_kill_all)


def spawn(argv: list[str], log_path: str, env: dict | None = None) -> subprocess.Popen:
    """Start `argv` in its own session, output appended to `log_path`; killed at exit at the latest."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    _live.add(proc)
    return proc


def stop_process(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group (woken first if it was SIGSTOPped), SIGKILL after `grace_s`."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)
            proc.wait(grace_s)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _live.discard(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        # A log dir of our own is removed when the cluster ends cleanly and kept (errors name it) otherwise.
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="kvroute-cluster-")
        self.procs: list[subprocess.Popen] = []
        self.engine_urls: list[str] = []
        self.router_url = ""
        # One shared secret per cluster signs its prefill/decode transfers (router/contract/kv_auth.py).
        self.kv_secret = os.environ.get(SECRET_ENV) or secrets.token_hex(16)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **{SECRET_ENV: self.kv_secret})
        proc = spawn([sys.executable, "-m", *args], os.path.join(self.log_dir, f"{name}.log"), env)
        self.procs.append(proc)
        return proc

    async def start(self, timeout_s: float = 120.0) -> LocalCluster:
        s = self.spec
        for i in range(s.engines):
            port = free_port()
            role = s.roles[i] if i < len(s.roles) else "both"
            self._spawn(f"engine-{i}", ["engine", "--port", str(port), "--instance-id", f"e{i}", "--backend",
                                        s.backend, "--num-blocks", str(s.num_blocks), "--num-threads", "1",
                                        "--role", role, "--log-level", "WARNING", *self._admin(), *s.engine_args])
            self.engine_urls.append(f"http://127.0.0.1:{port}")
        port = free_port()
        self._spawn("router", ["router", "--port", str(port), "--policy", s.policy, "--log-level", "WARNING",
                               *[a for u in self.engine_urls for a in ("--engine", u)], *self._admin(),
                               *s.router_args])
        self.router_url = f"http://127.0.0.1:{port}"
        await self._wait_ready(timeout_s)
        return self

    def _admin(self) -> tuple[str, ...]:
        return ("--admin-key", self.spec.admin_key) if self.spec.admin_key else ()

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        headers = {"Authorization": f"Bearer {self.spec.admin_key}"} if self.spec.admin_key else None
        async with aiohttp.ClientSession(headers=headers) as session:
            while True:
                dead = [p for p in self.procs if p.poll() is not None]
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
        for proc in reversed(self.procs):
            stop_process(proc)
        self.procs.clear()

    async def __aenter__(self) -> LocalCluster:
        try:
            return await self.start()
        except BaseException:
            self.close()
            raise

    async def __aexit__(self, exc_type, *exc) -> None:
        self.close()
        if exc_type is None and self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
