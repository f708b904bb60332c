"""One run of the device check: its settings, the runner the in-process steps share, the steps by name,
and the lines it prints."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvroute.benchmarks.checkout import git
from kvroute.benchmarks.gpu_check.plan import plan_for
from kvroute.benchmarks.gpu_check.runner_steps import step_decode, step_memcpy, step_prefill
from kvroute.benchmarks.gpu_check.served_steps import pd_pull, serving, step_bench, step_tiers
from kvroute.loadgen.processes import Processes
from kvroute.router.contract.kv_auth import SECRET_ENV

if TYPE_CHECKING:  # imported where it is made: torch loads only when the runner steps run
    from kvroute.engine.runners.torch_runner import TorchRunner


class Check:
    """One run's settings and the in-process runner the prefill and decode steps share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out, self.device, self.shape = Path(args.out), args.device, args.shape
        self.plan = plan_for(args.device, args.quick)
        self.model_dir = self.out / "model"
        self.threads = args.num_threads if args.num_threads is not None else (None if self.cuda else 1)
        self.engine_args = ("--model", str(self.model_dir.resolve()), "--device", self.device,
                            *(("--num-threads", str(self.threads)) if self.threads else ()))
        self._runner: TorchRunner | None = None
        self._secret = os.urandom(16).hex()  # signs the router's transfer grants

    def processes(self) -> Processes:
        """The kvroute processes of one step: logs under DIR/logs (kept), 30 s to stop each."""
        return Processes(str(self.out / "logs"), env={SECRET_ENV: self._secret}, grace_s=30.0)

    def engine(self, procs: Processes, name: str, *args: str) -> str:
        """A torch engine of the checkpoint on the device; its URL."""
        return procs.server(name, "engine", "--instance-id", name, "--log-level", "INFO", *self.engine_args, *args)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def runner(self) -> TorchRunner:
        if self._runner is None:
            from kvroute.engine.runners.torch_runner import TorchRunner

            per = -(-(self.plan.decode_context + self.plan.decode_steps + 1) // 16)
            blocks = max(64 * per, self.plan.prompt // 16 + 1) + 1
            self._runner = TorchRunner(model_dir=self.model_dir, num_blocks=blocks, device=self.device,
                                       num_threads=self.threads, max_running=64)
            self._runner.warm_up()
        return self._runner

    def close_runner(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
            if self.cuda:
                import torch

                torch.cuda.empty_cache()


RUN = {"memcpy": step_memcpy, "prefill": step_prefill, "decode": step_decode,
       "serving": lambda ctx: asyncio.run(serving(ctx)), "bench": step_bench, "tiers": step_tiers,
       "pd_pull": lambda ctx: asyncio.run(pd_pull(ctx))}


def describe(device: str) -> dict:
    import platform

    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else \
        (platform.processor() or platform.machine())
    return {"device": device, "device_name": name, "torch": torch.__version__,
            "commit": git("rev-parse", "HEAD") or None, "cpu_threads": torch.get_num_threads(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def summary_line(name: str, r: dict) -> str:
    keys = {"memcpy": ("h2d_gb_s", "d2h_gb_s"), "prefill": ("step_ms_0_cached", "step_ms_all_cached_after_cold"),
            "decode": ("batch_1_graphs_ms", "batch_16_graphs_ms", "batch_1_eager_ms", "batch_16_eager_ms",
                       "batch_64_eager_ms"),
            "serving": ("served_ttft_ms", "runner_step_ms", "overhead_ms", "cold_over_warm"),
            "pd_pull": ("gb_per_s",)}.get(name)
    if "error" in r or "skipped" in r:
        return f"{name:8} {r.get('error') or r.get('skipped')}"
    if keys is None:  # one entry per run
        return f"{name:8} " + "; ".join(f"{k}: TTFT p90 {v.get('ttft_p90_s') or v.get('storm_ttft_p90_s'):.3f} s"
                                         for k, v in r.items() if isinstance(v, dict))
    return f"{name:8} " + ", ".join(f"{k} {r[k]:.3g}" for k in keys if isinstance(r.get(k), (int, float)))
