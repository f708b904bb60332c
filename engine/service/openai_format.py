"""OpenAI response bodies and stream chunks for completions and chat completions."""

from __future__ import annotations

import time


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
          cached_by_tier: dict[str, int] | None = None) -> dict:
    """OpenAI usage; `cached_tokens` counts every tier, `cached_tokens_by_tier` splits it (kvroute extension)."""
    by_tier = {"device": cached_tokens, "host": 0, "remote": 0}
    if cached_by_tier:
        by_tier = {tier: cached_by_tier.get(tier, 0) for tier in by_tier}
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "cached_tokens_by_tier": by_tier},
    }


class ResponseFormat:
    """Builds the bodies of one request; `kind` is "completion" or "chat".

    Streaming usage follows OpenAI: with `include_usage` every chunk carries `"usage": null`
    (or the usage so far, with vLLM's `continuous_usage_stats`) and `usage_chunk` is the last
    one before [DONE], with `choices: []`; without it no chunk has a usage field."""

    def __init__(self, kind: str, request_id: str, model: str, include_usage: bool = False) -> None:
        self.kind = kind
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _envelope(self, obj: str, choices: list, usage_: dict | None) -> dict:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            body["usage"] = usage_
        return body

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def chunk(self, text: str | None, finish_reason: str | None = None, usage_: dict | None = None,
              first: bool = False, logprobs: dict | None = None) -> dict:
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": text or ""} if first else {}
            if text and not first:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        body = self._envelope(self.chunk_object, [choice], None)
        if self.include_usage:
            body["usage"] = usage_
        return body

    def usage_chunk(self, usage_: dict) -> dict:
        return self._envelope(self.chunk_object, [], usage_)

    def full(self, text: str, finish_reason: str | None, usage_: dict, logprobs: dict | None = None) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            return self._envelope("chat.completion", [choice], usage_)
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice], usage_)
