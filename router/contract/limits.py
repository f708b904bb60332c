"""Limits checked before the work they bound: body bytes, prompt characters, token ids.

A request is refused at the cheapest point that can tell it will not fit:

    body bytes      from Content-Length, before reading        (413, request_too_large)
    prompt chars    after parsing, before tokenizing            (400, context_length_exceeded)
    token ids       before hashing: below 2^32 and the vocabulary (400, invalid_request)
    prompt tokens   after tokenizing, before routing            (400, context_length_exceeded)

Defaults follow the model's context (`max_model_len`, advertised by engines at /kv/info):
`max_prompt_chars` = 8 characters per token of context (natural text runs 3-5, so a prompt
past it cannot fit once tokenized), `max_body_bytes` = 4 bytes per such character (UTF-8's
worst case), but never below 1 MiB so JSON overhead and chat structure always fit.
A configured value (> 0) overrides either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from kvroute.router.contract.constraints import NOT_NEGATIVE, at_least
from kvroute.router.contract.errors import BadRequest, ContextTooLong
from kvroute.router.contract.openai_request import CompletionRequest
from kvroute.router.contract.settings import check_settings, setting

CHARS_PER_TOKEN = 8
# A chat template wraps every message in text of its own (ChatML: 24 characters plus the role),
# so a prompt of many empty messages is counted by what it will tokenize, not by its content alone.
MESSAGE_TEMPLATE_CHARS = 16
BYTES_PER_CHAR = 4
MIN_BODY_BYTES = 1 << 20
FALLBACK_MAX_MODEL_LEN = 32_768  # before any engine has told us its context


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """request limits (router/contract/limits.py)"""

    max_body_bytes: int = setting(0, "largest request body", check=NOT_NEGATIVE,
                                  default_text="0: 32 bytes per token of the model's context, at least 1 MiB")
    max_prompt_chars: int = setting(0, "longest prompt in characters, checked before tokenizing", check=NOT_NEGATIVE,
                                    default_text="0: 8 per token of context")
    tokenize_workers: int = setting(2, "threads that tokenize long prompts off the event loop", check=at_least(1))
    tokenize_queue: int = setting(64, "long prompts that may wait for a tokenizer thread (on the router, per tenant: "
                                      "tenants are served fairly); beyond it, 503 + Retry-After", check=at_least(1))

    def __post_init__(self) -> None:
        check_settings(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    max_model_len: int
    vocab_size: int
    max_prompt_chars: int
    max_body_bytes: int

    @classmethod
    def derive(cls, max_model_len: int, vocab_size: int, prompt_chars: int = 0, body_bytes: int = 0) -> Limits:
        """Limits for a model; `prompt_chars`/`body_bytes` > 0 are the operator's overrides."""
        max_model_len = max_model_len or FALLBACK_MAX_MODEL_LEN
        chars = prompt_chars or CHARS_PER_TOKEN * max_model_len
        body = body_bytes or max(MIN_BODY_BYTES, BYTES_PER_CHAR * chars)
        return cls(max_model_len, vocab_size, chars, body)


def prompt_chars(req: CompletionRequest) -> int:
    if req.messages is not None:
        total = 0
        for m in req.messages:
            content = m["content"]  # a string or a list of parts (openai_request._messages checked)
            total += MESSAGE_TEMPLATE_CHARS + len(m["role"])
            if isinstance(content, str):
                total += len(content)
            else:
                total += sum(len(p.get("text", "")) for p in content)
        return total
    return len(req.prompt) if req.prompt is not None else 0


def check_prompt_chars(req: CompletionRequest, limits: Limits) -> int:
    """The prompt's character count, refused before tokenizing when it cannot fit the context."""
    chars = prompt_chars(req)
    if chars > limits.max_prompt_chars:
        param = "messages" if req.messages is not None else "prompt"
        raise ContextTooLong(
            f"prompt has {chars} characters; the limit is {limits.max_prompt_chars} "
            f"({CHARS_PER_TOKEN} per token of the model's {limits.max_model_len}-token context; --max-prompt-chars)",
            param=param)
    return chars


def check_token_count(n: int, limits: Limits) -> None:
    if n >= limits.max_model_len:
        raise ContextTooLong(f"prompt has {n} tokens; this model's context is {limits.max_model_len} tokens",
                             param="prompt")


def check_vocabulary(ids: Sequence[int] | bytes, limits: Limits) -> None:
    """A client's token ids must be in the model's vocabulary. `ids` may be packed (little-endian
    uint32 bytes, as `token_ids` returns them): their maximum is then one numpy call."""
    if not limits.vocab_size or not ids:
        return
    top = int(np.frombuffer(ids, "<u4").max()) if isinstance(ids, bytes) else max(ids)
    if top >= limits.vocab_size:
        raise BadRequest(f"token id {top} is out of the vocabulary (size {limits.vocab_size})", param="prompt")


def check_token_ids(ids: Sequence[int], limits: Limits) -> None:
    check_token_count(len(ids), limits)
    check_vocabulary(ids, limits)
