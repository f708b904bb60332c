"""Constraints a setting may declare (router/contract/settings.py): a range, or a URL's schemes. Each
says what is wrong with a value in words, and shows its rule in --help and the docs."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


class Check(Protocol):
    """A constraint on one value: `problem` says what is wrong ("must be at least 1") or None;
    `text` is the rule as --help and the docs show it (">= 1")."""

    text: str

    def problem(self, value: Any) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # low < value, not low <= value

    @property
    def text(self) -> str:
        low = None if self.low is None else f"{'>' if self.open_low else '>='} {self.low:g}"
        if self.high is None:
            return low or ""
        if low is None or not self.open_low:
            return f"<= {self.high:g}" if low is None else f"{self.low:g}-{self.high:g}"
        return f"{low}, <= {self.high:g}"

    def problem(self, value: Any) -> str | None:
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        if low_ok and (self.high is None or value <= self.high):
            return None
        if self.low is not None and self.high is not None:
            return (f"must be above {self.low:g} and at most {self.high:g}" if self.open_low
                    else f"must be between {self.low:g} and {self.high:g}")
        if self.high is not None:
            return f"must be at most {self.high:g}"
        if self.open_low:
            return "must be positive" if self.low == 0 else f"must be above {self.low:g}"
        return f"must be at least {self.low:g}"


POSITIVE = Range(0, open_low=True)
NOT_NEGATIVE = Range(0)


def at_least(low: float) -> Range:
    return Range(low)


@dataclasses.dataclass(frozen=True)
class Prefix:
    """A URL (or endpoint) with one of the given schemes."""

    prefixes: tuple[str, ...]
    text: str  # "an http(s) URL"

    def problem(self, value: Any) -> str | None:
        return None if str(value).startswith(self.prefixes) else f"must be {self.text}"


HTTP_URL = Prefix(("http://", "https://"), "an http(s) URL")
