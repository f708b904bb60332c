"""One routing decision (router/decision/route.py) and the decode engine choice
(router/decision/decode_choice.py) on a hand-made group: which members the policy sees,
what is filtered, what is recorded, and when a disaggregated request gets a prefill engine."""

import random

import pytest

from kvroute.router.decision.base import Decision, InstanceState, RouteRequest
from kvroute.router.decision.candidates import LeastLoaded
from kvroute.router.decision.decode_choice import pick_decode_member
from kvroute.router.decision.route import NoCandidates, RouteDecision, RouteSettings, uncached_tokens
from kvroute.router.index.base import PrefixMatch


class Group:
    """Members are their ids; `load` buckets them by requests in flight."""

    def __init__(self, *states: InstanceState) -> None:
        self.by_state = {s.id: s for s in states}
        self.members = [s.id for s in states]
        self.by_id = {s.id: s.id for s in states}
        self.load = LeastLoaded(self.members, level_of=lambda m: self.by_state[m].inflight)

    def states(self, chosen):
        return [self.by_state[m] for m in chosen]


class Picky:
    """Picks the last candidate (or `choice`), records what it saw and what it was told."""

    def __init__(self, uses_index=True, choice=None, uncached=None):
        self.uses_index, self.choice, self.uncached = uses_index, choice, uncached
        self.seen, self.routed, self.asked = [], [], []

    def select(self, request, candidates, matches):
        self.seen.append([c.id for c in candidates])
        self.asked.append((request, matches))
        return Decision(instance=self.choice or candidates[-1].id, uncached_tokens=self.uncached)

    def on_routed(self, request, instance):
        self.routed.append(instance)
        self.asked.append((request, instance))


def req(hashes=(11, 12, 13), num_tokens=48, block_size=16):
    return RouteRequest(num_tokens=num_tokens, block_hashes=tuple(hashes), block_size=block_size)


def group(n=5, **inflight):
    return Group(*[InstanceState(f"i{k}", inflight=inflight.get(f"i{k}", 0)) for k in range(n)])


def test_uncached_tokens_is_the_policys_prediction_when_it_makes_one():
    state = InstanceState("a")
    matches = {"a": PrefixMatch({"device": 2})}
    assert uncached_tokens(Decision(instance="a", uncached_tokens=5), state, matches, 48, 16) == 5
    assert uncached_tokens(Decision(instance="a", uncached_tokens=0), state, matches, 48, 16) == 0


def test_uncached_tokens_else_the_index_match_on_a_cache_compatible_instance():
    matches = {"a": PrefixMatch({"device": 2})}
    assert uncached_tokens(Decision(instance="a"), InstanceState("a"), matches, 48, 16) == 16
    assert uncached_tokens(Decision(instance="a"), InstanceState("a"), {"a": PrefixMatch({"device": 4})}, 48, 16) == 0
    assert uncached_tokens(Decision(instance="a"), InstanceState("a", cache_ok=False), matches, 48, 16) == 48
    assert uncached_tokens(Decision(instance="b"), InstanceState("b"), matches, 48, 16) == 48


def test_the_fast_path_is_only_for_index_policies():
    assert RouteDecision(Picky(), RouteSettings(fast_candidates=2)).fast_k == 2
    plain = RouteDecision(Picky(uses_index=False), RouteSettings(fast_candidates=2))
    assert plain.fast_k == 0 and plain.recent is None
    assert RouteDecision(Picky()).recent is None


def test_without_filters_the_policy_sees_every_member():
    policy = Picky()
    routed = RouteDecision(policy).choose(req(), group(3), {}, 0.0)
    assert policy.seen == [["i0", "i1", "i2"]]
    assert routed.member == "i2" and routed.decision.instance == "i2"
    assert list(routed.candidates) == ["i0", "i1", "i2"] and routed.state.id == "i2"
    assert policy.routed == []  # choose records nothing


def test_excluded_and_full_members_are_not_candidates():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(max_inflight=2))
    routed = decision.choose(req(), group(4, i1=2, i2=1, i3=3), {}, 0.0, exclude=("i0",))
    assert policy.seen == [["i2"]] and list(routed.candidates) == ["i2"] and routed.state.id == "i2"


def test_nothing_usable_raises_no_candidates_saying_why():
    with pytest.raises(NoCandidates, match="^overloaded$") as full:
        RouteDecision(Picky(), RouteSettings(max_inflight=1)).choose(req(), group(2, i0=1, i1=1), {}, 0.0)
    assert full.value.overloaded
    with pytest.raises(NoCandidates, match="^every member excluded$") as excluded:
        RouteDecision(Picky()).choose(req(), group(2), {}, 0.0, exclude=("i0", "i1"))
    assert not excluded.value.overloaded
    with pytest.raises(NoCandidates) as both:
        RouteDecision(Picky(), RouteSettings(max_inflight=1)).choose(req(), group(2, i0=1), {}, 0.0,
                                                                      exclude=("i1",))
    assert not both.value.overloaded


def test_overloaded_when_the_least_loaded_member_is_at_the_limit():
    decision = RouteDecision(Picky(), RouteSettings(max_inflight=2))
    assert decision.overloaded(group(3, i0=2, i1=2, i2=5))
    assert not decision.overloaded(group(3, i0=2, i1=1, i2=5))
    assert not RouteDecision(Picky()).overloaded(group(2, i0=9, i1=9))


def test_fast_candidates_are_holders_recent_senders_and_the_least_loaded():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(fast_candidates=2, recent_ttl_s=2.0))
    members = group(6, i0=1, i1=0, i2=3, i3=0, i4=2, i5=4)
    decision.routed(req(), "i5", now=10.0)  # a recent sender of block 11
    assert policy.routed == ["i5"]
    matches = {"i4": PrefixMatch({"device": 1}), "gone": PrefixMatch({"device": 3})}  # "gone" is no member
    decision.choose(req(), members, matches, 11.0)
    assert policy.seen[-1] == ["i4", "i5", "i1", "i3"]
    decision.choose(req(), members, matches, 12.0)  # the send expired at 12 s
    assert policy.seen[-1] == ["i4", "i1", "i3"]
    decision.choose(req(hashes=()), members, {}, 11.0)  # no blocks: the least loaded only
    assert policy.seen[-1] == ["i1", "i3"]


def test_the_policy_gets_the_request_and_the_matches():
    policy = Picky()
    decision, r, matches = RouteDecision(policy), req(), {"i0": PrefixMatch({"device": 1})}
    decision.decide(r, group(2), matches, 0.0)
    assert policy.asked == [(r, matches), (r, "i1")]


def test_exclusions_on_the_fast_path_keep_to_the_fast_candidates_while_any_is_left():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(fast_candidates=2))
    decision.choose(req(), group(5), {}, 0.0, exclude=("i0",))  # fast: i0, i1
    assert policy.seen == [["i1"]]


def test_decide_and_plan_prefill_read_the_recent_senders_at_their_time():
    policy = Picky(choice="i3")
    decision = RouteDecision(policy, RouteSettings(fast_candidates=1, recent_ttl_s=2.0))
    members = group(4, i0=0, i1=1, i2=1, i3=2)
    decision.routed(req(), "i3", now=10.0)
    assert decision.decide(req(), members, {}, 11.0).member == "i3"
    assert policy.seen[-1] == ["i3", "i0"]
    assert decision.plan_prefill(req(), members, {}, 11.5, min_uncached=1).member == "i3"
    assert policy.seen[-1] == ["i3", "i0"]
    policy.choice = None
    decision.plan_prefill(req(), members, {}, 14.0, min_uncached=1)  # both sends expired by now
    assert policy.seen[-1] == ["i0"]


def test_a_group_no_larger_than_k_is_looked_at_whole():
    policy = Picky()
    RouteDecision(policy, RouteSettings(fast_candidates=3)).choose(req(), group(3, i0=5), {}, 0.0)
    assert policy.seen == [["i0", "i1", "i2"]]


def test_fast_candidates_all_filtered_fall_back_to_every_member():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(fast_candidates=1, max_inflight=3))
    members = group(4, i0=0, i1=0, i2=1, i3=2)
    decision.choose(req(), members, {}, 0.0, exclude=("i0",))
    assert policy.seen[-1] == ["i1", "i2", "i3"]


def test_routed_records_the_first_block_only_on_the_fast_path():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(fast_candidates=1))
    decision.routed(req(hashes=()), "i1", 0.0)
    assert len(decision.recent) == 0 and policy.routed == ["i1"]
    decision.routed(req(), "i1", 0.0)
    assert list(decision.recent.match(11, 0.5)) == ["i1"] and not list(decision.recent.match(12, 0.5))


def test_decide_chooses_and_records():
    policy = Picky()
    decision = RouteDecision(policy, RouteSettings(fast_candidates=1))
    routed = decision.decide(req(), group(3), {}, 1.0, exclude=("i0",))  # fast: i0, excluded: i1, i2
    assert routed.member == "i2" and policy.routed == ["i2"] and list(decision.recent.match(11, 1.5)) == ["i2"]


def test_plan_prefill_needs_a_prefill_engine_and_enough_uncached_tokens():
    prefill = Group(InstanceState("p0"), InstanceState("p1"))
    matches = {"p1": PrefixMatch({"device": 2})}  # 32 of 48 tokens cached there: 16 to prefill
    decision = RouteDecision(Picky())
    assert decision.plan_prefill(req(), Group(), matches, 0.0, min_uncached=1) is None
    assert decision.plan_prefill(req(), prefill, matches, 0.0, min_uncached=1, exclude=("p0", "p1")) is None
    assert decision.plan_prefill(req(), prefill, matches, 0.0, min_uncached=17) is None
    assert decision.policy.routed == []
    routed = decision.plan_prefill(req(), prefill, matches, 0.0, min_uncached=16)
    assert routed.member == "p1" and decision.policy.routed == ["p1"]


def test_plan_prefill_trusts_the_policys_prediction():
    prefill = Group(InstanceState("p0"))
    assert RouteDecision(Picky(uncached=3)).plan_prefill(req(), prefill, {}, 0.0, min_uncached=4) is None
    assert RouteDecision(Picky(uncached=4)).plan_prefill(req(), prefill, {}, 0.0, min_uncached=4) is not None


def test_plan_prefill_without_recording_looks_at_every_prefill_engine():
    policy = Picky(choice="p0")
    decision = RouteDecision(policy, RouteSettings(fast_candidates=1))
    prefill = Group(InstanceState("p0", inflight=3), InstanceState("p1"), InstanceState("p2"))
    routed = decision.plan_prefill(req(), prefill, {}, 0.0, min_uncached=1, record=False)
    assert routed.member == "p0" and policy.seen == [["p0", "p1", "p2"]] and policy.routed == []
    assert len(decision.recent) == 0
    decision.plan_prefill(req(), prefill, {}, 0.0, min_uncached=1)
    assert policy.seen[-1] == ["p1"] and policy.routed == ["p0"]


def test_decode_member_has_the_least_decode_load_then_kv_usage():
    decodes = Group(InstanceState("d0", inflight=3), InstanceState("d1", running=1, waiting=1, kv_usage=0.6),
                    InstanceState("d2", inflight=1, running=2, kv_usage=0.5),
                    InstanceState("d3", inflight=2, kv_usage=0.4))
    assert pick_decode_member(decodes, random.Random(0)) == "d3"  # 2, 2, 2 in flight or running: least KV
    decodes = Group(InstanceState("d0", inflight=1, running=4), InstanceState("d1", inflight=4, running=1),
                    InstanceState("d2", inflight=3, waiting=1, kv_usage=0.9))
    assert pick_decode_member(decodes, random.Random(0)) == "d2"  # the most of the two counts: 4, 4, 4


def test_decode_member_ties_go_at_random():
    decodes = Group(*[InstanceState(f"d{k}", running=1) for k in range(3)], InstanceState("d3", running=2))
    picks = {pick_decode_member(decodes, random.Random(seed)) for seed in range(40)}
    assert picks == {"d0", "d1", "d2"}


def test_decode_load_is_in_flight_only_when_it_exceeds_running_plus_waiting():
    decodes = Group(InstanceState("d0", inflight=3, running=2, waiting=2), InstanceState("d1", running=3, kv_usage=0.1))
    assert pick_decode_member(decodes, random.Random(0)) == "d1"  # 4 against 3
