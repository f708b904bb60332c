"""The cost model prices loading a LoRA adapter where it is not resident (one implementation:
router/decision/scoring/kv_cost.py, which the simulator runs too)."""

import random

import pytest

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.decision.base import InstanceState, RouteRequest
from kvroute.router.decision.policies import make_policy
from kvroute.router.fleet.kinds.vllm import lora_residency


def states(resident_on: str, slots: int = 2):
    def one(i):
        load = LoadRecord(instance=i, running=0, waiting=0, kv_used_blocks=0, kv_total_blocks=100,
                          queued_prefill_tokens=0, adapters=("sql",) if i == resident_on else ("chat",),
                          adapter_slots=slots)
        return InstanceState.of(i, 0, 0, load)
    return [one("a"), one("b")]


def test_an_adapter_request_goes_where_its_adapter_is_resident():
    policy = make_policy("kv_aware", rng=random.Random(0))
    request = RouteRequest(num_tokens=64, block_hashes=(), block_size=16, adapter="sql")
    for resident in ("a", "b"):
        decision = policy.select(request, states(resident), {})
        assert decision.instance == resident
        other = "b" if resident == "a" else "a"
        assert decision.terms[other][0] - decision.terms[resident][0] == 0.05  # adapter_load_s, in the wait term


def test_no_price_without_an_adapter_or_from_engines_that_report_no_slots():
    policy = make_policy("kv_aware", rng=random.Random(0))
    plain = RouteRequest(num_tokens=64, block_hashes=(), block_size=16)
    assert len(set(t[0] for t in policy.select(plain, states("a"), {}).terms.values())) == 1
    unreported = RouteRequest(num_tokens=64, block_hashes=(), block_size=16, adapter="sql")
    assert len(set(t[0] for t in policy.select(unreported, states("a", slots=-1), {}).terms.values())) == 1


def test_vllm_lora_info_gives_the_latest_resident_adapters_and_slots():
    text = ('vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters=""} 10.0\n'
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="chat,sql",waiting_lora_adapters="x"} 12.5\n')
    assert lora_residency(text) == {"adapters": ("chat", "sql", "x"), "adapter_slots": 4}
    assert lora_residency("vllm:num_requests_running 0\n") == {}


def test_a_load_record_carries_adapters_and_refuses_a_malformed_list():
    d = LoadRecord(instance="e", running=0, waiting=0, kv_used_blocks=0, kv_total_blocks=1, queued_prefill_tokens=0,
                   adapters=("sql",), adapter_slots=2).to_dict()
    back = LoadRecord.from_dict(d)
    assert back.adapters == ("sql",) and back.adapter_slots == 2
    with pytest.raises(ValueError, match="adapters"):
        LoadRecord.from_dict({**d, "adapters": "sql"})
