"""Prefill/decode disaggregation on the virtual clock, as router/service/disagg.py and the engines do it.

Instances 0..P-1 start prefill-role, the rest decode-role (P = 0: every instance "both");
roles may change while it runs (the planner, loadgen/sim/planning.py), as POST /admin/role
does: what runs keeps going, new work follows the new roles. "both" instances take what
decode instances take, as router/service/disagg.py does; with no prefill (or no decode) instance
left, requests run whole, chosen by the policy among the "both" instances if any, else among all
(router/decision/decode_choice.py `disaggregated`, `colocated_roles`: the router's rule). Per
arrival (`plan`), the router's code
(router/decision/route.py `plan_prefill`): the policy picks a prefill instance among the
prefill ones; if the prompt's predicted uncached tokens there are fewer than
`min_uncached`, the policy picks a decode instance instead and the request runs whole there. Otherwise, when the
prefill's first token is out, the decode instance is picked by decode load (fewest
requests -- router in-flight or engine running + waiting -- then KV usage; ties at
random), as the router does.

The prefill runs the prompt with max_tokens 1 and `pin_kv`: its blocks stay held
after the first token (TTFT). `hand_off` then queues a decode sequence (prompt +
first token) on the decode instance, which admits it pull-based and FIFO when its
block manager can allocate its blocks (`match_prefix`: locally cached blocks are
not pulled). The pull takes `latency + pulled blocks x KV bytes per block /
bandwidth` (`SimRunner.transfer_time`, link `kv_link`); at its end the prefill
frees its blocks (they stay in its prefix cache) and the decode sequence runs
with the prompt computed, decoding the rest.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import cast

from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.loadgen.sim.cluster import CALL, Cluster
from kvroute.loadgen.sim.instance import SimInstance
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.router.decision.base import RouteRequest
from kvroute.router.decision.decode_choice import (
    DECODE_ROLES,
    PREFILL_ROLES,
    colocated_roles,
    disaggregated,
    pick_decode_member,
)
from kvroute.router.decision.route import Routed, RouteDecision
from kvroute.router.index.base import PrefixMatch


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DisaggConfig:
    num_prefill: int  # instances 0..num_prefill-1 start prefill-role, the rest decode-role (0: all "both")
    min_uncached: int  # fewer predicted uncached prompt tokens: run whole on a decode instance
    seed: int = 0  # of the decode choice's ties


class Disagg:
    def __init__(self, cluster: Cluster, view: LoadView, decision: RouteDecision, config: DisaggConfig) -> None:
        num_prefill = config.num_prefill
        if not 0 <= num_prefill < len(cluster.instances):
            raise ValueError(f"--prefill-instances must leave at least one decode instance, got {num_prefill} "
                             f"of {len(cluster.instances)}")
        self.cluster, self.view, self.decision = cluster, view, decision
        self.min_uncached = config.min_uncached
        self.rng = random.Random(config.seed)
        for inst in cluster.instances:
            self.set_role(inst, "both" if not num_prefill else "prefill" if inst.index < num_prefill else "decode")
        cluster.step_listeners.append(self._on_change)
        self.num_transfers = 0
        self.blocks_pulled = 0
        self.blocks_local = 0  # found in the decode instance's prefix cache, not pulled
        self.num_whole = 0  # short uncached prompts run whole on a decode instance
        self.prefill_decode_tokens = 0  # decode tokens scheduled on prefill instances (must stay 0)

    def set_role(self, inst: SimInstance, role: str) -> None:
        """`inst` takes new work of `role` (what runs there keeps going), as POST /admin/role does."""
        inst.role = role
        self.view.set_role(inst.index, role)

    # -- routing --------------------------------------------------------------------

    def plan(self, route: RouteRequest, matches: Mapping[str, PrefixMatch], now: float) -> tuple[Routed, bool]:
        """(the decision, whether it is a prefill whose decode is picked at its first token): the
        router's rule (router/decision/route.py `plan_prefill`), else whole where the policy picks.
        A prefill is recorded (`RouteDecision.routed`) here; a whole request is not yet."""
        view, decision, present = self.view, self.decision, self._present
        if not disaggregated(present):  # colocated, for now: where the router's proxy sends it
            roles = colocated_roles(present)
            return decision.choose(route, view.group(roles) if roles else view.all(), matches, now), False
        routed = decision.plan_prefill(route, view.group(PREFILL_ROLES), matches, now, self.min_uncached)
        if routed is not None:
            return routed, True
        self.num_whole += 1
        return decision.choose(route, view.group(DECODE_ROLES), matches, now), False

    def _present(self, roles: tuple[str, ...]) -> bool:
        return bool(self.view.group(roles).members)

    def pick_decode(self) -> int:
        member = pick_decode_member(self.view.group(DECODE_ROLES), self.rng)
        assert member is not None  # the simulated fleet has decode engines while it disaggregates
        return member

    # -- prefill -> decode ----------------------------------------------------------

    def hand_off(self, prefilled: Sequence, prefill: SimInstance, decode: int) -> Sequence:
        """Queue the decode half of `prefilled` (which holds its first token) on instance `decode`."""
        seq = Sequence(prefilled.request_id, prefilled.token_ids[: prefilled.num_prompt], prefilled.sampling,
                       prefilled.hash_seed, prefilled.arrival, adapter=prefilled.adapter)
        seq.token_ids.append(prefilled.token_ids[-1])
        seq.num_cached = prefilled.num_cached
        seq.remote = (prefilled, prefill)
        inst = self.cluster.instances[decode]
        inst.remote.append(seq)
        self._admit(inst)
        return seq

    def _on_change(self, inst: SimInstance) -> None:
        if inst.remote:  # whatever its role now: it accepted these before
            self._admit(inst)
        if inst.role == "prefill" and inst.step is not None:
            self.prefill_decode_tokens += sum(1 for s in inst.step.seqs if s.num_generated > 0)

    def _admit(self, inst: SimInstance) -> None:
        """Allocate blocks for queued decode requests in arrival order; start each one's pull."""
        bm = inst.block_manager
        while inst.remote:
            seq = inst.remote[0]
            hits = bm.match_prefix(seq)
            if not bm.can_allocate(seq, hits):
                break
            inst.remote.popleft()
            bm.allocate(seq, hits)
            inst.num_held += 1
            pulled = bm.blocks_needed(seq.num_prompt) - len(hits)
            self.num_transfers += 1
            self.blocks_pulled += pulled
            self.blocks_local += len(hits)
            done = self.cluster.now + inst.runner.transfer_time(pulled)
            self.cluster.push(done, CALL, lambda seq=seq, inst=inst: self._pulled(seq, inst))
        self.cluster.publish(inst)

    def _pulled(self, seq: Sequence, inst: SimInstance) -> None:
        prefilled, prefill = cast(tuple[Sequence, SimInstance], seq.remote)  # set by hand_off
        seq.remote = None
        prefill.block_manager.free(prefilled)
        prefill.num_held -= 1
        self.cluster.kick(prefill)
        inst.num_held -= 1
        seq.num_computed = seq.num_prompt
        inst.block_manager.commit_computed(seq)
        self.cluster.publish(inst)
        seq.status = SeqStatus.RUNNING
        inst.scheduler.running.append(seq)
        self.cluster.kick(inst)

    def stats(self) -> dict:
        return {"prefill_instances": sum(i.role == "prefill" for i in self.cluster.instances),
                "transfers": self.num_transfers, "kv_blocks_pulled": self.blocks_pulled,
                "kv_blocks_local": self.blocks_local, "whole_on_decode": self.num_whole,
                "prefill_decode_tokens": self.prefill_decode_tokens}
