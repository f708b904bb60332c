"""What the fleet says about a model's block keys: its adapters, its engines' key rule, its path.

A request's `model` names a base model or one of its LoRA adapters (the engines list those:
vLLM's /v1/models `parent`, a kvroute engine's /kv/info `adapters`); it is routed among the base
model's engines, keyed by the adapter. A model served by engines of different key rules (vLLM
beside kvroute or SGLang engines) is hashed by vLLM's for requests with keys; the others find
nothing cached for them then (plain requests hash alike under every rule).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvroute.router.fleet.instance import Instance


def adapter_base(instances: Iterable[Instance], name: str) -> str | None:
    """The base model of which `name` is an adapter, or None."""
    return next((i.info.model for i in instances if i.info is not None and name in i.info.adapters), None)


def key_rule(instances: Iterable[Instance], model: str) -> str:
    rules = {i.info.key_rule for i in instances if i.info is not None and i.info.model == model}
    return "vllm" if "vllm" in rules or not rules else rules.pop()


def model_path(instances: Iterable[Instance], model: str) -> str:
    """The model as its engines loaded it (what vLLM's image hashes name)."""
    return next((i.info.model_path for i in instances if i.info is not None and i.info.model == model
                 and i.info.model_path), model)
