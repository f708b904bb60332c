"""Incremental detokenization: generated token ids -> text deltas, never a split character."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvroute.router.contract.tokenizer import Tokenizer

_DETOK_CONTEXT = 5


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas, holding back incomplete characters.

    Each step decodes a short window of ids twice, up to the last emitted id and up to the
    newest, and emits the difference unless it ends in U+FFFD (a character whose bytes have
    not all arrived). `prompt_ids` gives the first ids context (leading-space handling).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = [int(i) for i in prompt_ids[max(len(prompt_ids) - _DETOK_CONTEXT, 0) :]]
        self._prefix = 0
        self._read = len(self._ids)
        self._text = ""

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return self._text

    def add(self, ids: int | Iterable[int]) -> str:
        """Feed one id or several; return the new text (possibly empty)."""
        if isinstance(ids, Iterable):
            self._ids.extend(int(i) for i in ids)
        else:
            self._ids.append(int(ids))
        return self._emit(final=False)

    def finish(self) -> str:
        """Emit whatever is held back, even an incomplete character, at the end of a sequence."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self._tokenizer.backend.decode
        prefix_text = decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        new_text = decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._text += delta
        return delta
