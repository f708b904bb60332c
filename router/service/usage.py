"""What an engine reported it did for one request: the OpenAI `usage` object, read off the relayed bytes.

    usage_from_body(raw)          a non-streamed JSON body -> Usage | None
    scanner = StreamUsage()       a streamed (SSE) body, fed the chunks as they are relayed:
    scanner.feed(chunk) ...       keeps the last `usage` object seen (OpenAI sends it in the final
    scanner.usage                 chunk, `choices: []`, when the request asked
                                  `stream_options.include_usage`; vLLM and kvroute engines do)

The router relays the engine's bytes unchanged; these only look. A line is parsed only
when it holds a non-null `"usage": {`, so the per-chunk cost is one regex search (a chunk of
whole lines without one is not even split), and a partial line is buffered up to
`MAX_LINE_BYTES` (longer lines are skipped, not grown).
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

import msgspec
import orjson

MAX_LINE_BYTES = 1 << 20
_USAGE = re.compile(rb'"usage"\s*:\s*\{')


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens; None when not reported

    @classmethod
    def from_dict(cls, d: Any) -> Usage | None:
        """None unless `d` is a usage object with integer prompt and completion token counts."""
        if not isinstance(d, dict):
            return None
        prompt, completion = d.get("prompt_tokens"), d.get("completion_tokens")
        if not _count(prompt) or not _count(completion):
            return None
        details = d.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(prompt, completion, cached if _count(cached) else None)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(payload: bytes) -> Usage | None:
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return Usage.from_dict(data.get("usage")) if isinstance(data, dict) else None


def usage_from_body(raw: bytes) -> Usage | None:
    """The usage of a non-streamed completion or chat-completion body. Only the body from its last
    `"usage"` key on is parsed, as `{"usage": ...}`, when that is valid JSON: then it is the top-level
    usage (a nested key would leave one brace too many; inside a JSON string the quotes are escaped),
    and a body that ends with it (kvroute and SGLang engines write it last) costs the usage object's
    parse, not the whole answer's; else the body is parsed whole (vLLM writes fields after it)."""
    at = raw.rfind(b'"usage"')
    if at < 0:
        return None
    try:
        data = orjson.loads(b"{" + raw[at:])
    except orjson.JSONDecodeError:
        return _parse(raw) if _USAGE.search(raw) else None
    return Usage.from_dict(data.get("usage"))


class StreamUsage:
    """Feed it the SSE bytes of one response, in any chunking; `usage` is the last one seen."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until its end

    def feed(self, chunk: bytes) -> None:
        if not self._partial and not self._skipping and chunk.endswith(b"\n") and not _USAGE.search(chunk):
            return  # whole lines only, none with a usage object: nothing to keep
        lines = chunk.split(b"\n")
        lines[0] = self._partial + lines[0]
        self._partial = lines.pop()
        for line in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._line(line)
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._skipping = b"", True

    def _line(self, line: bytes) -> None:
        if line.startswith(b"data:") and _USAGE.search(line):
            usage = _parse(line[5:].strip())
            if usage is not None:
                self.usage = usage
