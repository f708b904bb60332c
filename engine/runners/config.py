"""The model runner's settings (engine/runners), declared once (router/contract/settings.py)."""

from __future__ import annotations

import dataclasses

from kvroute.engine.kv.links import LINKS
from kvroute.engine.runners.cost_model import COST_MODELS
from kvroute.engine.runners.devices import check_device_syntax
from kvroute.engine.runners.lora_config import parse_lora_modules
from kvroute.router.contract.constraints import POSITIVE, at_least
from kvroute.router.contract.settings import check_settings, setting

DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("torch", "sim")  # engine/runners/registry.py RUNNERS: one factory each

@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """model runner (engine/runners)"""

    backend: str = setting("torch", "torch: real forward; sim: step times from a cost model", choices=BACKENDS)
    model: str | None = setting(None, "local Hugging Face Llama-family checkpoint dir",
                                default_text="the built-in tiny model")
    dtype: str | None = setting(None, "override the checkpoint's dtype (bf16 is slow on most CPUs)", choices=DTYPES,
                                default_text="the checkpoint's")
    device: str = setting("cpu", "torch backend: cpu, cuda, cuda:N or mps")
    cuda_graphs: bool = setting(True, "torch on CUDA: replay decode steps from CUDA graphs captured at start-up, per "
                                      "batch and context bucket; --no-cuda-graphs: every step eager")
    num_threads: int | None = setting(None, "torch intra-op threads", check=at_least(1), default_text="torch's choice")
    seed: int = setting(0, "random weights and unseeded sampling")
    cost_model: str = setting("cpu-tiny", "sim backend: the step cost model", choices=tuple(COST_MODELS))
    time_scale: float = setting(1.0, "sim backend: multiply step times", check=POSITIVE)
    kv_link: str = setting("loopback", "sim backend: modelled prefill -> decode KV link", choices=tuple(LINKS))
    # LoRA adapters (engine/runners/lora_config.py): NAME=DIR in PEFT's format, served as model NAME
    lora_modules: tuple[str, ...] = setting((), "LoRA adapters to serve, each a PEFT directory (adapter_config.json, "
                                                "adapter_model.safetensors); a request's model NAME runs under it "
                                                "(vLLM's flag; --backend sim takes a bare NAME too)",
                                            many=True, metavar="NAME=DIR")
    max_loras: int = setting(1, "with --lora-modules: different adapters in one step (their slots on the device)",
                             check=at_least(1))
    max_lora_rank: int = setting(16, "with --lora-modules: the largest adapter rank accepted (the slots are sized "
                                     "by the largest rank served)", check=at_least(1))

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))  # a list given is kept as a tuple
        check_settings(self)
        check_device_syntax(self.device)
        self.adapters_named(base_model="")

    def adapters_named(self, base_model: str) -> tuple[tuple[str, str], ...]:
        """(name, directory) of each --lora-modules adapter, checked (ValueError): NAME=DIR (a bare NAME on
        the sim backend), each name once and none the base model's (`base_model`, "" unknown)."""
        return parse_lora_modules(self.lora_modules, base_model, dirs=self.backend == "torch")

    @property
    def adapter_dirs(self) -> tuple[tuple[str, str], ...]:
        """(name, directory) of each --lora-modules adapter ("" for a sim engine's bare name)."""
        return parse_lora_modules(self.lora_modules, dirs=False)

    @property
    def adapter_slots(self) -> int:
        """Adapter slots of the engine's scheduler: 0 when it serves no adapter."""
        return self.max_loras if self.lora_modules else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrateConfig:
    """calibration (engine/runners/calibrate.py)"""

    calibrate: bool = setting(False, "with --backend sim: measure the torch runner here and print fitted cost "
                                     "coefficients")
    calibrate_out: str | None = setting(None, "write the calibration JSON here", metavar="FILE")
