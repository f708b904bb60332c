"""Tokenize what repeats only once: token ids of the text between special tokens, cached.

A Hugging Face tokenizer cuts its input at added (special) tokens before anything else
and encodes each piece in between on its own: the BPE never merges across
`<|im_end|>`. So the ids of a rendered chat (or of a completion prompt holding special
tokens) are the concatenation of each piece's ids and the special tokens' ids, and a
piece seen before -- a long system prompt, an earlier turn of the conversation -- needs
no encoding again. That holds exactly when nothing in the pipeline looks across a cut:
no normalizer, a byte-level or regex pre-tokenizer that adds no prefix space, a BPE
model, and added tokens that strip no neighbouring whitespace. `SegmentCache.build`
checks those conditions, then checks itself against full encodes of probe strings, and
returns None (encode in full) for any tokenizer that fails either.

The cache is an LRU bounded by the number of token ids it holds (`max_tokens`); it is
shared by the threads of the tokenize pool (router/tokenize_pool.py) under one lock.
"""

from __future__ import annotations

import collections
import re
import threading
from typing import Sequence

import tokenizers

SAFE_PRE_TOKENIZERS = ("ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit")
PROBES = ("hello{t}world", " lead{t} trail ", "a{t}{t}\n\nb", "{t}x", "x{t}", "naïve {t}\n  café 1234",
          "  {t}\t\t{t}  ")
MIN_CACHED_CHARS = 32  # shorter pieces are cheaper to encode than to look up


def _pre_tokenizers_safe(spec: dict | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizers_safe(p) for p in spec.get("pretokenizers", ()))
    if kind == "ByteLevel":
        return not spec.get("add_prefix_space", False)
    return kind in SAFE_PRE_TOKENIZERS


def structurally_safe(spec: dict) -> bool:
    added = spec.get("added_tokens") or []
    return (spec.get("normalizer") is None and _pre_tokenizers_safe(spec.get("pre_tokenizer"))
            and (spec.get("model") or {}).get("type") == "BPE"
            and all(not (t.get("lstrip") or t.get("rstrip") or t.get("single_word")) for t in added))


class SegmentCache:
    def __init__(self, backend: tokenizers.Tokenizer, added: dict[str, int], max_tokens: int = 2_000_000) -> None:
        self.backend = backend
        self.added = added
        alternatives = sorted(added, key=len, reverse=True)  # leftmost-longest, as the tokenizer matches
        self.pattern = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if added else None
        self.max_tokens = max_tokens
        self.cached_tokens = 0
        self.hits = self.misses = 0
        self._lru: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def build(cls, spec: dict, backend: tokenizers.Tokenizer) -> "SegmentCache | None":
        """A cache for this tokenizer, or None when reusing pieces would not be exact."""
        if not structurally_safe(spec):
            return None
        added = {t["content"]: t["id"] for t in spec.get("added_tokens") or () if t.get("content")}
        cache = cls(backend, added)
        for token in list(added)[:4] or [""]:
            for probe in PROBES:
                text = probe.format(t=token)
                if cache.encode(text, store=False) != backend.encode(text, add_special_tokens=False).ids:
                    return None
        return cache

    def encode(self, text: str, store: bool = True) -> list[int]:
        """Exactly `backend.encode(text, add_special_tokens=False).ids`, reusing cached pieces."""
        pieces = self.pattern.split(text) if self.pattern is not None else [text]
        found: dict[int, Sequence[int]] = {}
        misses: list[int] = []
        with self._lock:
            for i in range(0, len(pieces), 2):
                piece = pieces[i]
                ids = self._lru.get(piece) if len(piece) >= MIN_CACHED_CHARS else None
                if ids is not None:
                    self._lru.move_to_end(piece)
                    found[i] = ids
                    self.hits += 1
                elif piece:
                    misses.append(i)
                    self.misses += len(piece) >= MIN_CACHED_CHARS
        if misses:
            encoded = self.backend.encode_batch_fast([pieces[i] for i in misses], add_special_tokens=False)
            for i, enc in zip(misses, encoded):
                found[i] = enc.ids
            if store:
                self._store((pieces[i], found[i]) for i in misses)
        out: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:
                out.append(self.added[piece])
            elif piece:
                out.extend(found[i])
        return out

    def _store(self, items) -> None:
        with self._lock:
            for piece, ids in items:
                if len(piece) < MIN_CACHED_CHARS or piece in self._lru or len(ids) > self.max_tokens // 4:
                    continue
                self._lru[piece] = tuple(ids)
                self.cached_tokens += len(ids)
            while self.cached_tokens > self.max_tokens:
                _, ids = self._lru.popitem(last=False)
                self.cached_tokens -= len(ids)
