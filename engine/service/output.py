"""Turn generated token ids into text deltas, honouring stop strings.

Text that could still turn out to be the start of a stop string is held back,
so a streamed response never shows part of a stop string.
"""

from __future__ import annotations

from kvroute.router.contract.detokenizer import IncrementalDetokenizer
from kvroute.router.contract.tokenizer import Tokenizer


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = (), prompt_ids: list[int] | None = None) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids or ())
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.emitted = 0  # characters of the visible text already returned
        self.stopped = False
        self.num_tokens = 0

    @property
    def text(self) -> str:
        return self._visible(self.detok.text)

    def add(self, token_id: int) -> str:
        """New visible text after one more token (may be empty while held back)."""
        if self.stopped:
            return ""
        self.num_tokens += 1
        self.detok.add(token_id)
        return self._advance(final=False)

    def finish(self) -> str:
        """The rest of the text once generation has ended."""
        if not self.stopped:
            self.detok.finish()
        return self._advance(final=True)

    def _visible(self, text: str) -> str:
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                self.stopped = True
                text = text[:i]
        return text

    def _advance(self, final: bool) -> str:
        text = self._visible(self.detok.text)
        limit = len(text) if final or self.stopped else max(self.emitted, len(text) - self.hold)
        delta = text[self.emitted : limit]
        self.emitted = limit
        return delta
