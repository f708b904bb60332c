"""Routing policies: one file per policy behind `router.decision.base.Policy`, and the one registry of them.

    round_robin    exact rotation in id order               round_robin.py
    random         uniform                                  random_choice.py
    least_load     fewest inflight                          least_load.py
    power_of_two   less loaded of two sampled               power_of_two.py
    prefix_hash    consistent hashing with bounded loads    prefix_hash.py
    kv_aware       lowest cost: own TTFT + prefill and      kv_aware.py (default)
                   evictions it causes, from the index
    approx_kv      kv_aware on a self-learned index         approx_kv.py

Each policy class has `config_class` (a frozen dataclass of its parameters, or None)
and takes those parameters as keywords, plus optional `rng` (random.Random) and
`clock` (() -> seconds, default time.monotonic) injections.
"""

from __future__ import annotations

import dataclasses

from kvroute.router.decision.base import Decision, InstanceState, Policy, PolicyBase, RouteRequest
from kvroute.router.decision.policies.approx_kv import ApproxKvPolicy
from kvroute.router.decision.policies.kv_aware import KvAwarePolicy
from kvroute.router.decision.policies.least_load import LeastLoadPolicy
from kvroute.router.decision.policies.power_of_two import PowerOfTwoPolicy
from kvroute.router.decision.policies.prefix_hash import PrefixHashPolicy
from kvroute.router.decision.policies.random_choice import RandomPolicy
from kvroute.router.decision.policies.round_robin import RoundRobinPolicy

DEFAULT_POLICY = "kv_aware"

POLICIES: dict[str, type[Policy]] = {
    "round_robin": RoundRobinPolicy,
    "random": RandomPolicy,
    "least_load": LeastLoadPolicy,
    "power_of_two": PowerOfTwoPolicy,
    "prefix_hash": PrefixHashPolicy,
    "kv_aware": KvAwarePolicy,
    "approx_kv": ApproxKvPolicy,
}

_INJECTED = ("rng", "clock")


def policy_params(name: str) -> tuple[str, ...]:
    """The parameter names policy `name` accepts (its config fields)."""
    config_class = getattr(_policy_class(name), "config_class", None)  # PolicyBase's, a class attribute
    return tuple(f.name for f in dataclasses.fields(config_class)) if config_class else ()


def make_policy(name: str, **params) -> Policy:
    """A new policy `name` configured by `params` (plus optional `rng` / `clock` injections)."""
    cls = _policy_class(name)
    valid = policy_params(name)
    unknown = sorted(set(params) - set(valid) - set(_INJECTED))
    if unknown:
        accepted = ", ".join(valid) if valid else "none"
        raise ValueError(f"policy {name!r} has no parameter {', '.join(unknown)}; its parameters: {accepted}")
    return cls(**params)


def _policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}") from None


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Decision",
    "InstanceState",
    "Policy",
    "PolicyBase",
    "RouteRequest",
    "make_policy",
    "policy_params",
]
