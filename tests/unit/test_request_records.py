"""The records a request makes on its way through the router (docs/architecture.md, "Records on
the request path") are immutable, and the ones that cross modules are keyword-only, so a field
added later breaks callers loudly instead of shifting them."""

import pytest

from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.openai_request import parse_request
from kvroute.router.decision.admission import Prediction
from kvroute.router.decision.base import Decision, InstanceState, RouteRequest
from kvroute.router.decision.route import Routed
from kvroute.router.decision.scoring.replication import Copy
from kvroute.router.decision.scoring.tier_credit import TierCredit
from kvroute.router.index.base import PrefixMatch
from kvroute.router.planner.recent import Finished
from kvroute.router.service.request_trace import RequestTrace
from kvroute.router.service.routing import Choice, Forecast, Prepared
from kvroute.router.service.usage import Usage


def records():
    request = parse_request({"prompt": "hi", "max_tokens": 2}, "completion")
    route = RouteRequest(num_tokens=3, block_hashes=(1,), block_size=16)
    decision = Decision(instance="a", uncached_tokens=3)
    state = InstanceState("a")
    routed = Routed(member="a", decision=decision, candidates=["a"], state=state)
    return {
        "CompletionRequest": request,
        "Encoding": Encoding(ids=[1, 2, 3], data=b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"),
        "RouteRequest": route,
        "Decision": decision,
        "InstanceState": state,
        "Routed": routed,
        "Prepared": Prepared(request=request, model="m", num_tokens=3, route=route, started=0.0,
                             trace=RequestTrace(model="m", stream=False, prompt_tokens=3)),
        "Forecast": Forecast(routed=routed, matches={}),
        "Choice": Choice(instance=object(), decision=decision, matches={}, candidates=[]),
        "Usage": Usage(3, 2),
        "Finished": Finished(at=1.0, model="m", ok=True, ttft=None, tpot=None, prompt_tokens=3, output_tokens=2),
        "Prediction": Prediction(ttft_s=0.1),
        "PrefixMatch": PrefixMatch({"device": 2}),
        "TierCredit": TierCredit({"device": 2}, {"device": 0.1}, 2.0),
        "Copy": Copy(None, 7, 0.5),
    }


@pytest.mark.parametrize("name", list(records()))
def test_a_request_record_cannot_be_changed(name):
    record = records()[name]
    field = type(record).__struct_fields__[0]
    with pytest.raises(AttributeError):
        setattr(record, field, getattr(record, field))


@pytest.mark.parametrize("make", [
    lambda: RouteRequest(3, (1,), 16),
    lambda: Decision("a"),
    lambda: Routed("a", Decision(instance="a"), ["a"], InstanceState("a")),
    lambda: Encoding([1], b"\x01\x00\x00\x00"),
    lambda: Prepared(None, "m", 0, None, 0.0, None),
    lambda: Choice(None, Decision(instance="a"), {}, []),
    lambda: Finished(1.0, "m", True, None, None, 3, 2),
    lambda: Forecast(None, {}),
    lambda: Prediction(0.1),
])
def test_records_that_cross_modules_are_keyword_only(make):
    with pytest.raises(TypeError):
        make()


def test_equal_fields_make_equal_records_and_the_fields_are_kept():
    a = RouteRequest(num_tokens=3, block_hashes=(1, 2), block_size=16, request_id="r1")
    assert a == RouteRequest(num_tokens=3, block_hashes=(1, 2), block_size=16, request_id="r1")
    assert (a.num_tokens, a.block_hashes, a.block_size, a.request_id) == (3, (1, 2), 16, "r1")
    assert InstanceState("a") != InstanceState("a", inflight=1)
    def prepared():
        return Prepared(request=None, model="m", num_tokens=0, route=None, started=0.0, trace=None)

    assert prepared().token_ids == []  # a fresh list per record
    assert prepared().token_ids is not prepared().token_ids
