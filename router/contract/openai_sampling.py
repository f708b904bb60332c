"""The sampling fields of an OpenAI body beyond temperature/top_p (vLLM's extensions included).

    presence_penalty, frequency_penalty   [-2, 2], default 0
    repetition_penalty                    > 0 (vLLM), default 1
    top_k                                 -1 or 0 = off, else >= 1 (vLLM)
    min_p                                 [0, 1] (vLLM)
    logit_bias                            {"token id": bias in [-100, 100]}, at most 1024 entries
    logprobs                              completions: an integer 0..20 (top tokens per position);
                                          chat: a boolean, with top_logprobs 0..20

`sampling_fields(body, kind)` returns them as CompletionRequest fields; `logprobs` is the
number of top tokens wanted (None: no logprobs). Token ids are checked against the
vocabulary by the engine, which knows it.
"""

from __future__ import annotations

from typing import Any

from kvroute.router.contract.errors import BadRequest

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_LOGIT_BIAS = 1024


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number", param=name)
    if value > hi or value < lo or (lo_open and value == lo):
        bound = f"greater than {lo}" if lo_open else f"at least {lo}"
        raise BadRequest(f"'{name}' must be {bound} and at most {hi}, got {value}", param=name)
    return float(value)


def _int(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"'{name}' must be an integer from {lo} to {hi}, got {value!r}", param=name)
    return value


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise BadRequest(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} token ids", param="logit_bias")
    out = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise BadRequest(f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise BadRequest(f"'logit_bias' values must be numbers from -100 to 100, got {value!r}",
                             param="logit_bias")
        out.append((int(key), float(value)))
    return tuple(out)


def _logprobs(body: dict, kind: str) -> int | None:
    if kind == "completion":
        return _int(body, "logprobs", 0, MAX_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise BadRequest("'logprobs' must be a boolean for chat completions", param="logprobs")
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def sampling_fields(body: dict, kind: str) -> dict[str, Any]:
    if body.keys().isdisjoint(_FIELDS):  # none given: the defaults (most requests)
        return dict(_DEFAULTS)
    return _checked(body, kind)


def _checked(body: dict, kind: str) -> dict[str, Any]:
    top_k = _int(body, "top_k", -1, 1 << 31)
    return {
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _number(body, "repetition_penalty", 1.0, 0.0, 100.0, lo_open=True),
        "top_k": max(0, top_k or 0),
        "min_p": _number(body, "min_p", 0.0, 0.0, 1.0),
        "logit_bias": _logit_bias(body),
        "logprobs": _logprobs(body, kind),
    }


_DEFAULTS = _checked({}, "completion")  # what every check gives a body that names none (chat gives the same)
_FIELDS = frozenset(_DEFAULTS) | {"top_logprobs"}  # the body keys the checks read
