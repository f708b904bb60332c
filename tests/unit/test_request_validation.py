"""Wrong-typed and out-of-range fields that `kvroute chaos` found accepted (issue 9): each
is a 400 naming the field, on the router and the engine alike (one parser serves both)."""

import pytest

from kvroute.router.contract.errors import BadRequest, ContextTooLong
from kvroute.router.contract.limits import Limits, check_prompt_chars
from kvroute.router.contract.openai_request import parse_request

PROMPT = {"prompt": "hello", "max_tokens": 2}


@pytest.mark.parametrize("field,value", [
    ("stream_options", False), ("stream_options", 0), ("stream_options", ""), ("stream_options", []),
    ("stream_options", {"include_usage": "yes"}), ("stream_options", {"include_usage": 1}),
    ("stream_options", {"include_usage": [True]}),
    ("n", True), ("n", 1.0),
    ("seed", 1 << 63), ("seed", -(1 << 63) - 1), ("seed", (1 << 64) - 1),
    ("max_tokens", "ten"),  # wrong even when max_completion_tokens is the one used
])
def test_wrong_field_is_400_naming_it(field, value):
    body = {**PROMPT, "max_completion_tokens": 2, field: value}
    with pytest.raises(BadRequest) as e:
        parse_request(body, "completion")
    assert e.value.param == field.split(".")[0]


@pytest.mark.parametrize("field,value,parsed", [
    ("stream_options", None, {"include_usage": False, "continuous_usage": False}),
    ("stream_options", {}, {"include_usage": False, "continuous_usage": False}),
    ("stream_options", {"include_usage": None}, {"include_usage": False}),
    ("stream_options", {"include_usage": True}, {"include_usage": True}),
    ("n", 1, {}), ("n", None, {}),
    ("seed", -(1 << 63), {"seed": -(1 << 63)}), ("seed", (1 << 63) - 1, {"seed": (1 << 63) - 1}),
    ("seed", None, {"seed": None}), ("seed", 0, {"seed": 0}),
])
def test_edge_values_still_accepted(field, value, parsed):
    req = parse_request({**PROMPT, field: value}, "completion")
    assert (req.kind, req.prompt, req.max_tokens, req.stream) == ("completion", "hello", 2, False)
    assert req.body[field] == value
    for name, want in parsed.items():
        assert getattr(req, name) == want and type(getattr(req, name)) is type(want), name


def test_many_empty_chat_messages_are_refused_before_tokenizing():
    """Template text per message counts: 36k empty messages took the router's loop 0.3-1.3 s to
    tokenize inline (0 content characters) before their 400."""
    limits = Limits.derive(4096, 8192)
    req = parse_request({"messages": [{"role": "user", "content": ""}] * 36_000}, "chat")
    with pytest.raises(ContextTooLong):
        check_prompt_chars(req, limits)
    one = parse_request({"messages": [{"role": "user", "content": "hi"}]}, "chat")
    assert check_prompt_chars(one, limits) < 100
