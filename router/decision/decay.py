"""Exponential decay by a half-life: the counts and estimates admission keeps decay so."""

from __future__ import annotations


def decayed(value: float, since: float, now: float, halflife_s: float) -> float:
    """`value` as of `since`, decayed to `now` (a clock that went back decays nothing)."""
    return value * 0.5 ** (max(0.0, now - since) / halflife_s)
