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

Pieces of at least MIN_CACHED_CHARS characters live in an LRU bounded by the number of
token ids it holds (`max_tokens`); shorter ones ("assistant\n", "\n") in a small table
that is emptied when full. Both are shared by the event loop (`plan`: split and look up)
and the threads of the tokenize pool (`finish`: encode what was missing) under one lock.
Each entry keeps its ids, their packed bytes and a serial number never given to another
entry, so a prompt's leading cached pieces name its leading ids (router/contract/encoding.py).
"""

from __future__ import annotations

import collections
import itertools
import re
import threading
from typing import NamedTuple

import tokenizers

from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.protocol import u32le

SAFE_PRE_TOKENIZERS = ("ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit")
PROBES = ("hello{t}world", " lead{t} trail ", "a{t}{t}\n\nb", "{t}x", "x{t}", "naïve {t}\n  café 1234",
          "  {t}\t\t{t}  ")
MIN_CACHED_CHARS = 32  # shorter pieces go to the small table, not the LRU
SHORT_ENTRIES = 4096
BATCH_CHARS = 2048  # a miss this long is encoded by encode_batch_fast (releases the GIL); shorter: encode


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


class _Entry(NamedTuple):
    serial: int
    ids: list[int]  # never modified
    data: bytes


class SegmentCache:
    def __init__(self, backend: tokenizers.Tokenizer, added: dict[str, int], max_tokens: int = 2_000_000) -> None:
        self.backend = backend
        self.added = added
        alternatives = sorted(added, key=len, reverse=True)  # leftmost-longest, as the tokenizer matches
        self.pattern = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if added else None
        self.max_tokens = max_tokens
        self.cached_tokens = 0
        self.hits = self.misses = 0
        self._serials = itertools.count(1)
        self._special = {text: _Entry(-1 - i, [i], u32le([i])) for text, i in added.items()}
        self._lru: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._short: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    @classmethod
    def build(cls, spec: dict, backend: tokenizers.Tokenizer) -> SegmentCache | None:
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
        return self.plan(text).finish(store).ids

    def plan(self, text: str, lead: tuple[int, ...] = (), tail: tuple[int, ...] = ()) -> SegmentPlan:
        """Cut `text` at special tokens and look the pieces up; `lead`/`tail` ids go around it."""
        pieces = self.pattern.split(text) if self.pattern is not None else [text]
        entries: list[_Entry | None] = [None] * len(pieces)
        missing: list[int] = []
        missing_chars = 0
        special, lru, short = self._special, self._lru, self._short
        with self._lock:
            for i, piece in enumerate(pieces):
                if i % 2:
                    entries[i] = special[piece]
                    continue
                if not piece:
                    continue
                long = len(piece) >= MIN_CACHED_CHARS
                entry = (lru if long else short).get(piece)
                if entry is None:
                    missing.append(i)
                    missing_chars += len(piece)
                    self.misses += long
                    continue
                if long:
                    lru.move_to_end(piece)
                    self.hits += 1
                entries[i] = entry
        return SegmentPlan(self, pieces, entries, missing, missing_chars, lead, tail)

    def _store(self, items) -> None:
        with self._lock:
            for piece, entry in items:
                if len(piece) < MIN_CACHED_CHARS:
                    if len(self._short) >= SHORT_ENTRIES:
                        self._short.clear()
                    self._short[piece] = entry
                    continue
                if piece in self._lru or len(entry.ids) > self.max_tokens // 4:
                    continue
                self._lru[piece] = entry
                self.cached_tokens += len(entry.ids)
            while self.cached_tokens > self.max_tokens:
                _, old = self._lru.popitem(last=False)
                self.cached_tokens -= len(old.ids)

    def _entry(self, ids: list[int]) -> _Entry:
        return _Entry(next(self._serials), ids, u32le(ids))


class SegmentPlan:
    """The pieces of one text, looked up; `finish` encodes the missing ones and joins them."""

    __slots__ = ("cache", "pieces", "entries", "missing", "missing_chars", "lead", "tail")

    def __init__(self, cache: SegmentCache, pieces, entries, missing, missing_chars, lead, tail) -> None:
        self.cache, self.pieces, self.entries = cache, pieces, entries
        self.missing, self.missing_chars, self.lead, self.tail = missing, missing_chars, lead, tail

    def finish(self, store: bool = True) -> Encoding:
        cache, pieces, entries = self.cache, self.pieces, self.entries
        first_miss = self.missing[0] if self.missing else len(pieces)
        if self.missing:
            big = [i for i in self.missing if len(pieces[i]) >= BATCH_CHARS]
            if big:
                for i, enc in zip(big, cache.backend.encode_batch_fast([pieces[i] for i in big],
                                                                       add_special_tokens=False)):
                    entries[i] = cache._entry(enc.ids)
            encode = cache.backend.encode
            for i in self.missing:
                if entries[i] is None:
                    entries[i] = cache._entry(encode(pieces[i], add_special_tokens=False).ids)
            if store:
                cache._store((pieces[i], entries[i]) for i in self.missing)
        ids = list(self.lead)
        data = [u32le(self.lead)] if self.lead else []
        key = [self.lead]
        prefix_tokens = len(self.lead)
        for i, entry in enumerate(entries):
            if entry is None:
                continue
            ids.extend(entry.ids)
            data.append(entry.data)
            if i < first_miss:
                key.append(entry.serial)
                prefix_tokens += len(entry.ids)
        if self.tail:
            ids.extend(self.tail)
            data.append(u32le(self.tail))
            if first_miss == len(pieces):
                key.append(self.tail)
                prefix_tokens += len(self.tail)
        return Encoding(ids=ids, data=b"".join(data), prefix_key=tuple(key), prefix_tokens=prefix_tokens)
