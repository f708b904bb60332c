"""OpenAI `logprobs` objects from the engine's TokenLogprobs.

    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}],
                  "text_offset": [...]}   (top_logprobs holds the N best plus the sampled token)
    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
                  "bytes"}, ...N]}]}

A token's text is that token decoded alone (special tokens kept), as vLLM does; `bytes`
are its UTF-8 bytes and `text_offset` the running length of those texts. Log-probabilities
are clamped at -9999.0 (vLLM's floor) so -inf never reaches JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from kvroute.engine.core.work import TokenLogprobs
from kvroute.router.contract.tokenizer import Tokenizer

FLOOR = -9999.0


@functools.lru_cache(maxsize=1 << 16)
def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _lp(value: float) -> float:
    return max(FLOOR, value) if value == value else FLOOR  # NaN -> floor


class LogprobFormatter:
    """Formats the logprobs of one request, chunk by chunk (offsets carry over)."""

    def __init__(self, tokenizer: Tokenizer, kind: str) -> None:
        self.tokenizer = tokenizer
        self.kind = kind
        self.offset = 0

    def format(self, entries: Sequence[TokenLogprobs]) -> dict:
        return self._chat(entries) if self.kind == "chat" else self._completion(entries)

    def _text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)

    def _completion(self, entries: Sequence[TokenLogprobs]) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = self._text(e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(_lp(e.logprob))
            top = {self._text(t): _lp(lp) for t, lp in e.top}
            top.setdefault(text, _lp(e.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self._text(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}

    def _chat(self, entries: Sequence[TokenLogprobs]) -> dict:
        return {"content": [{**self._entry(e.token_id, e.logprob),
                             "top_logprobs": [self._entry(t, lp) for t, lp in e.top]} for e in entries]}
