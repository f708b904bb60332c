"""A prompt's token ids as the router uses them, and the plan that produces them.

Tokenizing is split in two so the router can choose where the expensive half runs:
`Tokenizer.plan(...)` / `plan_chat(...)` does the cheap part on the event loop
(render the chat template, cut the text at special tokens, look the pieces up in the
segment cache) and says how many characters are left to encode (`missing_chars`);
`plan.finish()` encodes those, inline when few, in the tokenize pool when many
(router/contract/tokenize_pool.py).

An `Encoding` carries the ids twice: as a list (forwarded to engines) and as the
little-endian uint32 bytes block hashing reads (router/contract/protocol.py), so the bytes of a
cached piece are packed once, when it is cached, not per request. `prefix_key`
identifies the token ids of the leading pieces that came whole from the cache (each
cached piece has a serial number that is never reused), and `prefix_tokens` says how
many ids they make: equal keys mean equal leading ids, which is what lets
router/decision/prefix_hashes.py reuse the block hashes of a prefix it has hashed before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import msgspec
import tokenizers

from kvroute.router.contract.protocol import u32le


class Encoding(msgspec.Struct, frozen=True, kw_only=True):
    ids: list[int]
    data: bytes  # `ids` as little-endian uint32
    prefix_key: tuple = ()
    prefix_tokens: int = 0

    @classmethod
    def of(cls, ids: Sequence[int], data: bytes = b"") -> Encoding:
        """Ids that did not come from the cache (a client's token ids, a full encode); `data`, when
        given, is `ids` packed already."""
        ids = list(ids)
        return cls(ids=ids, data=data or u32le(ids))


class EncodePlan(Protocol):
    @property
    def missing_chars(self) -> int: ...  # characters still to encode: what `finish` costs

    def finish(self) -> Encoding: ...


@dataclasses.dataclass(slots=True)
class FullPlan:
    """Encode the whole text (a tokenizer the segment cache cannot serve exactly)."""

    backend: tokenizers.Tokenizer
    text: str
    add_special_tokens: bool
    lead: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    @property
    def missing_chars(self) -> int:
        return len(self.text)

    def finish(self) -> Encoding:
        ids = self.backend.encode_batch_fast([self.text], add_special_tokens=self.add_special_tokens)[0].ids
        if self.lead or self.tail:
            ids = [*self.lead, *ids, *self.tail]
        return Encoding.of(ids)
