"""The planner's decision: which role each engine should have, and why (DistServe's P:D
choice, made online). Pure: an `Observation` in, a `Plan` out; `kvroute planner` feeds it
from a router over HTTP (router/planner/service.py) and `kvroute sim` from the virtual
clock (loadgen/sim/planning.py), so both run this code.

Per interval, over the recent window:

    need_p = uncached prompt tokens/s  / prefill_tokens_per_s   (engines' worth of prefill)
    need_d = output tokens/s           / decode_tokens_per_s    (engines' worth of decode at the TPOT SLO)
    util   = (need_p + need_d) / N                              (N engines that are not draining)

`prefill_tokens_per_s` and `decode_tokens_per_s` are one engine's capacities, from a
profile (as Dynamo's planner takes them): `kvroute sim --profile` prints them for a cost
model. Decode capacity depends on context length, so a profile may give the decode step
instead (`decode_step_s + batch x (decode_seq_s + decode_context_s x context)`, what
`kvroute engine --backend sim --calibrate` fits): the capacity is then the largest batch
(up to `max_running`) meeting the TPOT SLO at the recent requests' mean context, over
that step.

Colocated or split? Colocated, every engine "both", no request pays a hand-off, but
prefill chunks stall decode steps. With prefill taking u_p = need_p / N of each engine's
time in chunks of c = min(mean uncached prompt, max_batched_tokens) / prefill_tokens_per_s
seconds, decode steps come short (d = decode_step_s + B x per_seq, B from Little's law)
or long (d + c); a request's n output tokens meet ~Poisson(n x q) long steps, q the share
of long steps, so its TPOT p90 is
    ((n - 1 - k90) x d + k90 x (d + c)) / (n - 1),   k90 = the Poisson 90th percentile.
The fleet runs colocated while that is within `colocate_below` of the TPOT SLO (once
colocated and meeting its SLOs, up to `colocate_below + colocate_margin`); without a
step model, while util is below `colocate_below`. Otherwise it splits
P = round(N x need_p / (need_p + need_d)) + bias prefill engines, the rest decode,
at least `min_prefill` / `min_decode` of each. `bias` is the SLO feedback the capacities
cannot give: +1 while TTFT misses its SLO and TPOT has room, -1 the other way, back toward
0 while both are met.

Hysteresis: a new target must come out the same `hold` intervals in a row, and at least
`cooldown_s` after the last change, before engines switch -- unless the split in force
is overloaded (a role's demand beyond its engines' capacity: a queue is growing), which
switches at once; then the fewest engines switch, the least loaded first. `desired` is the replica
count per role the load asks for at `target_utilization` (published for an autoscaler; the planner
itself only re-roles).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kvroute.router.contract.protocol import ROLES
from kvroute.router.planner.config import PlannerConfig

# The roles (router/contract/protocol.py ROLES) in the order `assign` fills them: among equally
# loaded surplus engines prefill is served first, then decode. Plans and reports list them so.
ORDER = ("prefill", "decode", "both")
assert set(ORDER) == set(ROLES)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineView:
    id: str
    role: str
    running: int = 0
    waiting: int = 0
    draining: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    now: float
    engines: Sequence[EngineView]
    requests: int = 0
    prefill_tokens_per_s: float = 0.0  # uncached prompt tokens, the prefill work
    output_tokens_per_s: float = 0.0
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    mean_context_tokens: float = 0.0  # prompt + half the output, over the window's requests
    mean_prompt_tokens: float = 0.0  # uncached prompt tokens per request (prefill work per request)
    mean_output_tokens: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    at: float
    changes: dict[str, str]  # engine id -> new role (empty: nothing to do)
    target: dict[str, int]  # role -> engines, what the planner aims at
    desired: dict[str, int]  # role -> replicas the load asks for (for autoscalers)
    reason: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Planner:
    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.bias = 0
        self.pending: dict[str, int] | None = None
        self.pending_count = 0
        self.last_change = -math.inf

    def decide(self, obs: Observation) -> Plan:
        c = self.config
        engines = [e for e in obs.engines if not e.draining]
        n = len(engines)
        need_p = obs.prefill_tokens_per_s / c.prefill_tokens_per_s
        need_d = obs.output_tokens_per_s / self.decode_capacity(obs.mean_context_tokens)
        desired = {"prefill": math.ceil(need_p / c.target_utilization),
                   "decode": math.ceil(need_d / c.target_utilization)}
        if n < 2 or obs.requests == 0:
            return Plan(obs.now, {}, _counts(engines), desired, "no traffic or fewer than 2 engines: no change")
        current = _counts(engines)
        target, why = self._target(obs, n, need_p, need_d, current)
        if target == current:
            self.pending, self.pending_count = None, 0
            return Plan(obs.now, {}, target, desired, f"keep {_fmt(current)}: {why}")
        if target != self.pending:
            self.pending, self.pending_count = target, 0
        self.pending_count += 1
        urgent = _overloaded(current, need_p, need_d) and obs.now - self.last_change >= c.interval_s
        if not urgent and (self.pending_count < c.hold or obs.now - self.last_change < c.cooldown_s):
            return Plan(obs.now, {}, target, desired, f"{_fmt(target)} pending ({self.pending_count}/{c.hold} "
                                                      f"intervals, cool-down): {why}")
        self.pending, self.pending_count, self.last_change = None, 0, obs.now
        changes = assign(engines, target)
        return Plan(obs.now, changes, target, desired, f"{_fmt(current)} -> {_fmt(target)}: {why}")

    def decode_capacity(self, context_tokens: float) -> float:
        """One engine's decode tokens/s at the TPOT SLO (the profile's figure, or its step model)."""
        c = self.config
        if c.decode_step_s <= 0 or context_tokens <= 0:
            return c.decode_tokens_per_s
        per_seq = c.decode_seq_s + c.decode_context_s * context_tokens
        batch = c.max_running if per_seq <= 0 else int((c.slo_tpot_s - c.decode_step_s) / per_seq)
        batch = max(1, min(c.max_running, batch))
        return batch / (c.decode_step_s + batch * per_seq)

    def _target(self, obs: Observation, n: int, need_p: float, need_d: float,
                current: dict[str, int]) -> tuple[dict[str, int], str]:
        c = self.config
        util = (need_p + need_d) / n
        load = f"util {util:.2f} (prefill {need_p:.2f}, decode {need_d:.2f} engines' worth)"
        colocated = current["both"] == n
        meeting = colocated and self._slos_met(obs)
        threshold = c.colocate_below + (c.colocate_margin if meeting else 0.0)
        fit, what = self._colocated_fit(obs, n, need_p, util)
        if fit < threshold or need_p + need_d == 0:
            self.bias = 0
            return {"prefill": 0, "decode": 0, "both": n}, f"{load}; colocated: {what} < {threshold:g}"
        self._feedback(obs, current)
        p = round(n * need_p / (need_p + need_d)) + self.bias
        p = max(c.min_prefill, min(n - c.min_decode, p))
        slo = f"TTFT p90 {_ms(obs.ttft_p90_s)}, TPOT p90 {_ms(obs.tpot_p90_s)}, SLO bias {self.bias:+d}"
        return {"prefill": p, "decode": n - p, "both": 0}, f"{load}; {slo}"

    def _colocated_fit(self, obs: Observation, n: int, need_p: float, util: float) -> tuple[float, str]:
        """How colocation would fare, as a fraction (1 = at the limit): the predicted colocated
        TPOT p90 over the SLO with a step model, else the utilization."""
        c = self.config
        if c.decode_step_s <= 0 or obs.mean_context_tokens <= 0:
            return util, f"util {util:.2f}"
        per_seq = c.decode_seq_s + c.decode_context_s * obs.mean_context_tokens
        u_p, r = need_p / n, obs.output_tokens_per_s / n
        room = 1.0 - u_p - r * per_seq
        if room <= 0 or u_p >= 1:
            return math.inf, "predicted colocated TPOT unbounded"
        short = c.decode_step_s + min(c.max_running, r * c.decode_step_s / room) * per_seq
        chunk = min(obs.mean_prompt_tokens, c.max_batched_tokens) / c.prefill_tokens_per_s
        long_rate, short_rate = u_p / (short + chunk), (1 - u_p) / short
        steps = max(1.0, obs.mean_output_tokens - 1)
        k90 = _poisson_quantile(steps * long_rate / (long_rate + short_rate), 0.9)
        tpot = ((steps - min(k90, steps)) * short + min(k90, steps) * (short + chunk)) / steps
        return tpot / c.slo_tpot_s, f"predicted colocated TPOT p90 {_ms(tpot)} / SLO"

    def _slos_met(self, obs: Observation) -> bool:
        c = self.config
        return ((obs.ttft_p90_s is None or obs.ttft_p90_s <= c.slo_ttft_s)
                and (obs.tpot_p90_s is None or obs.tpot_p90_s <= c.slo_tpot_s))

    def _feedback(self, obs: Observation, current: dict[str, int]) -> None:
        """Move the bias by the SLO misses of the split now in force (not during colocation)."""
        if current["both"]:
            return
        c = self.config
        ttft_bad = obs.ttft_p90_s is not None and obs.ttft_p90_s > c.slo_ttft_s
        tpot_bad = obs.tpot_p90_s is not None and obs.tpot_p90_s > c.slo_tpot_s
        ttft_room = obs.ttft_p90_s is None or obs.ttft_p90_s < 0.8 * c.slo_ttft_s
        tpot_room = obs.tpot_p90_s is None or obs.tpot_p90_s < 0.8 * c.slo_tpot_s
        limit = max(1, (current["prefill"] + current["decode"]) // 2)
        if ttft_bad and tpot_room:
            self.bias = min(limit, self.bias + 1)
        elif tpot_bad and ttft_room:
            self.bias = max(-limit, self.bias - 1)
        elif not ttft_bad and not tpot_bad and self.bias:
            self.bias -= 1 if self.bias > 0 else -1


def assign(engines: Sequence[EngineView], target: dict[str, int]) -> dict[str, str]:
    """The fewest role changes that reach `target`; the least loaded engines move first."""
    have = {role: [e for e in engines if e.role == role] for role in ORDER}
    surplus: list[EngineView] = []
    for role in ORDER:
        extra = len(have[role]) - target.get(role, 0)
        if extra > 0:
            surplus += sorted(have[role], key=lambda e: e.running + e.waiting)[:extra]
    surplus.sort(key=lambda e: e.running + e.waiting)
    changes = {}
    for role in ORDER:
        for _ in range(max(0, target.get(role, 0) - len(have[role]))):
            changes[surplus.pop(0).id] = role
    return changes


def _overloaded(current: dict[str, int], need_p: float, need_d: float) -> bool:
    """The split in force cannot keep up: prefill or decode demand beyond its engines."""
    if current["both"] and not current["prefill"]:
        return False  # colocated: both kinds of work share every engine
    return need_p > current["prefill"] or need_d > current["decode"] + current["both"]


def _counts(engines: Sequence[EngineView]) -> dict[str, int]:
    return {role: sum(e.role == role for e in engines) for role in ORDER}


def _fmt(counts: dict[str, int]) -> str:
    if counts.get("both") and not counts.get("prefill") and not counts.get("decode"):
        return f"colocated x{counts['both']}"
    text = f"{counts.get('prefill', 0)}P:{counts.get('decode', 0)}D"
    return text + (f"+{counts['both']}both" if counts.get("both") else "")


def _poisson_quantile(mean: float, q: float) -> int:
    k, p = 0, math.exp(-mean)
    cdf = p
    while cdf < q and k < 10_000:
        k += 1
        p *= mean / k
        cdf += p
    return k


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"
