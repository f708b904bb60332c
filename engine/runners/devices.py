"""`--device`: its syntax (checked with the config, no torch) and whether this machine has it (torch)."""

from __future__ import annotations

import re

DEVICE_SYNTAX = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")


def check_device_syntax(device: str) -> None:
    if not DEVICE_SYNTAX.match(device):
        raise ValueError(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")


def available_devices() -> list[str]:
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append("mps")
    return out


def check_device_available(device: str) -> None:
    """ValueError naming the devices this machine has, when `device` is not one of them."""
    choices = available_devices()
    if device not in choices:
        why = {"cuda": "no CUDA device is visible to torch", "mps": "torch has no MPS backend here"}.get(
            device.split(":")[0], "no such device")
        raise ValueError(f"--device {device}: {why}; valid here: {', '.join(choices)}")
