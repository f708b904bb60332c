"""The prefill engine's answer, as the disaggregation path (router/service/disagg.py) uses it: parsed
and checked, its first token as the client's first stream chunk, its usage, and its transfer handle
while it is still worth sending to a decode engine."""

from __future__ import annotations

import time

import orjson

HANDLE_MARGIN_S = 1.0  # a handle this close to its expiry is not sent again: the retry goes whole


def parse_prefilled(data: bytes) -> dict | None:
    """A prefill answer with one choice and, if present, a handle object; None if malformed."""
    try:
        prefilled = orjson.loads(data)
        choice = prefilled["choices"][0]
        params = prefilled.get("kv_transfer_params")
        if not isinstance(choice, dict) or (params and not isinstance(params.get("handle"), dict)):
            return None
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return prefilled


def first_chunk(kind: str, prefilled: dict, finish_reason: str | None = None) -> dict:
    """The stream chunk carrying the prefill's first token, with its logprobs (and its end, if it
    was the last); usage goes in a chunk of its own (`usage_chunk`), as OpenAI streams it."""
    choice = prefilled["choices"][0]
    chunk = {k: prefilled.get(k) for k in ("id", "created", "model")}
    logprobs = choice.get("logprobs")
    if kind == "chat":
        text = (choice.get("message") or {}).get("content") or ""
        chunk["object"] = "chat.completion.chunk"
        chunk["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": logprobs,
                             "finish_reason": finish_reason}]
    else:
        chunk["object"] = "text_completion"
        chunk["choices"] = [{"index": 0, "text": choice.get("text", ""), "logprobs": logprobs,
                             "finish_reason": finish_reason}]
    return chunk


def usage_chunk(kind: str, prefilled: dict) -> dict:
    chunk = {k: prefilled.get(k) for k in ("id", "created", "model")}
    chunk["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {**chunk, "choices": [], "usage": prefilled.get("usage")}


def valid_handle(prefilled: dict) -> dict | None:
    """The prefill's transfer params while its handle is valid (HANDLE_MARGIN_S before it expires)."""
    params = prefilled["kv_transfer_params"]
    expires = params["handle"].get("expires")
    if isinstance(expires, (int, float)) and expires < time.time() + HANDLE_MARGIN_S:
        return None
    return params
