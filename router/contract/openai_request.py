"""Parse and validate OpenAI completion / chat-completion bodies (engine and router alike).

Validation happens before anything is queued or forwarded, and every problem
becomes a BadRequest naming the field.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvroute.router.contract.errors import BadRequest
from kvroute.router.contract.openai_sampling import sampling_fields
from kvroute.router.contract.protocol import u32le

KINDS = ("completion", "chat")
MAX_TOKEN_ID = 0xFFFFFFFF  # ids are hashed as little-endian uint32 (router/contract/protocol.py)
FORWARDED_IDS = "kvroute_prompt_token_ids"
INT64 = 1 << 63  # `seed` is a signed 64-bit integer, as in vLLM


class CompletionRequest(msgspec.Struct, frozen=True):
    kind: str  # "completion" | "chat"
    body: dict
    model: str | None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    prompt_ids_le: bytes = b""  # prompt_ids as little-endian uint32 (packed once, while checking their range)
    messages: tuple[dict, ...] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    cache_salt: str | None = None
    kv_transfer_params: dict | None = None  # prefill/decode disaggregation (see engine/transfer/kv_transfer.py)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM): usage in every chunk
    # router/contract/openai_sampling.py:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # top tokens per position; None = no logprobs


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number", param=name)
    if not lo <= value <= hi:
        raise BadRequest(f"'{name}' must be between {lo} and {hi}, got {value}", param=name)
    return float(value)


def _optional_int(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadRequest(f"'{name}' must be between {lo} and {hi}, got {value}", param=name)
    return value


def _stream_options(body: dict) -> dict:
    options = body.get("stream_options")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    if not isinstance(options.get("include_usage", False), (bool, type(None))):
        raise BadRequest("'stream_options.include_usage' must be a boolean", param="stream_options")
    return options


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise BadRequest("'stop' must be a non-empty string or a list of up to 4 non-empty strings", param="stop")
    return tuple(stop)


def _prompt(body: dict) -> tuple[str | None, tuple[tuple[int, ...], bytes] | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        return prompt, None
    if isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:  # C speed; bools excluded
        return None, token_ids(prompt, "prompt", typed=True)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise BadRequest("only one prompt per request is supported", param="prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, float)) for p in prompt):
        raise BadRequest(f"token ids in 'prompt' must be integers between 0 and {MAX_TOKEN_ID}", param="prompt")
    raise BadRequest("'prompt' must be a string or a non-empty list of token ids", param="prompt")


def token_ids(ids: list, param: str, typed: bool = False) -> tuple[tuple[int, ...], bytes]:
    """A client's token ids, checked (ints, not bools; 0 <= id <= MAX_TOKEN_ID), and packed as
    little-endian uint32: the packing is the range check (it refuses anything outside it), and
    the packed bytes are what the block hashes are computed from. `typed`: the caller has checked
    the element types already."""
    if not ids or not (typed or set(map(type, ids)) == {int}):  # one C pass; bools excluded
        raise BadRequest(f"'{param}' must be a non-empty list of integer token ids", param=param)
    try:
        packed = u32le(ids)
    except OverflowError:
        raise BadRequest(f"token ids in '{param}' must be between 0 and {MAX_TOKEN_ID}", param=param) from None
    return tuple(ids), packed


def _messages(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(_text_part(p) or _image_part(p) for p in content):
                raise BadRequest(f"messages[{i}].content parts must be text or image_url parts", param="messages")
        elif not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", param="messages")
    return tuple(messages)


def _text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _image_part(part: Any) -> bool:
    """An OpenAI image part: {"type": "image_url", "image_url": {"url": ...}} (or the URL alone). The
    router keys it (router/contract/vision.py); a kvroute engine refuses it (its tokenizer takes text)."""
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return False
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    return isinstance(url, str) and bool(url)


def parse_request(body: Any, kind: str) -> CompletionRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise BadRequest("only n=1 is supported", param="n")
    options = _stream_options(body)
    max_tokens = _optional_int(body, "max_tokens")
    if "max_completion_tokens" in body:
        max_tokens = _optional_int(body, "max_completion_tokens")
    if max_tokens is not None and max_tokens <= 0:
        raise BadRequest(f"'max_tokens' must be at least 1, got {max_tokens}", param="max_tokens")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("'ignore_eos' must be a boolean", param="ignore_eos")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise BadRequest("'cache_salt' must be a string", param="cache_salt")
    if salt == "":  # as vLLM: an empty salt would silently share the unsalted cache
        raise BadRequest("'cache_salt' must be a non-empty string if provided", param="cache_salt")
    kv_params = body.get("kv_transfer_params")
    if kv_params is not None and not isinstance(kv_params, dict):
        raise BadRequest("'kv_transfer_params' must be an object", param="kv_transfer_params")
    fields: dict = sampling_fields(body, kind)
    if kind == "chat":
        fields["messages"] = _messages(body)
        if FORWARDED_IDS in body:  # the router's tokenization of these messages (router/service/steering.py)
            fields["prompt_ids"], fields["prompt_ids_le"] = token_ids(body[FORWARDED_IDS], FORWARDED_IDS)
    else:
        fields["prompt"], ids = _prompt(body)
        if ids is not None:
            fields["prompt_ids"], fields["prompt_ids_le"] = ids
    return CompletionRequest(
        kind=kind,
        body=body,
        model=model,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        seed=_optional_int(body, "seed", -INT64, INT64 - 1),
        stop=_stop(body),
        ignore_eos=ignore_eos,
        cache_salt=salt or None,
        kv_transfer_params=kv_params,
        **fields,
    )
