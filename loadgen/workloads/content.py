"""Synthetic prompt content: token ids of the built-in vocabulary, deterministic for a seed.

Ids 0-4 are the tokenizer's special tokens and never appear. Content that must be
the same wherever it appears (a trace's hash id, a shared prefix) comes from its
own generator seeded by (seed, key), so it does not depend on generation order.
"""

from __future__ import annotations

import numpy as np

VOCAB_SIZE = 8192  # the built-in BPE (router/contract/tokenizer.py); any larger vocabulary holds these ids too
FIRST_ID = 5  # ids 0-4 are special tokens
_MAX_REDRAWS = 64


def random_tokens(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """n ids drawn uniformly from the ordinary (non-special) vocabulary."""
    return tuple(rng.integers(FIRST_ID, VOCAB_SIZE, size=n).tolist())


def keyed_tokens(seed: int, key: int, n: int, stream: int = 0) -> tuple[int, ...]:
    """Fixed content for (seed, key): the same key always gives the same n tokens."""
    return random_tokens(np.random.default_rng([seed, stream, key]), n)


def distinct_start(rng: np.random.Generator, n: int, used: set[int]) -> tuple[int, ...]:
    """n random ids whose first id is not in `used` (then added to it).

    Keeps siblings (questions after one shared prefix, group prefixes) from sharing
    even their first token, so the shared part is exactly what the workload claims.
    """
    tokens = random_tokens(rng, n)
    if n == 0:
        return tokens
    for _ in range(_MAX_REDRAWS):
        if tokens[0] not in used or len(used) >= VOCAB_SIZE - FIRST_ID:
            break
        tokens = (int(rng.integers(FIRST_ID, VOCAB_SIZE)),) + tokens[1:]
    used.add(tokens[0])
    return tokens


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_int(name: str, value: object, minimum: int = 1) -> None:
    """Raise ValueError (naming the flag) unless value is an int >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{flag(name)} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{flag(name)} must be at least {minimum}, got {value}")


def check_number(name: str, value: object, minimum: float = 0.0, strict: bool = False) -> None:
    """Raise ValueError unless value is a number >= minimum (> minimum when strict)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{flag(name)} must be a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = "greater than" if strict else "at least"
        raise ValueError(f"{flag(name)} must be {bound} {minimum:g}, got {value}")
