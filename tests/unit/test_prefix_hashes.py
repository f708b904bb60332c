"""PrefixHashes' memo (router/decision/prefix_hashes.py) on hand-made encodings: what it remembers,
its counters, its bound, and which entry it evicts."""

import pytest

from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.protocol import block_hashes, u32le
from kvroute.router.decision.prefix_hashes import PrefixHashes

BS = 4


def enc(lead: int, tail: int, n_lead: int = 8, n_tail: int = 5, pieces: int = 2) -> Encoding:
    """A prompt of `n_lead` ids named by its leading pieces (`pieces` of them), then `n_tail` more."""
    ids = [lead] * n_lead + [tail] * n_tail
    key = tuple(f"piece{lead}.{k}" for k in range(pieces - 1)) + (n_lead,)
    return Encoding(ids=ids, data=u32le(ids), prefix_key=key, prefix_tokens=n_lead)


def test_a_known_prefix_is_hashed_once_and_counted():
    memo = PrefixHashes(max_hashes=64)
    first, second = enc(1, 2), enc(1, 3)
    assert memo.of(first, BS, 7) == block_hashes(first.ids, BS, 7)
    assert (memo.hits, memo.misses, memo.held) == (0, 1, 2)  # the 2 full blocks of the 8-id lead
    assert memo.of(second, BS, 7) == block_hashes(second.ids, BS, 7)
    assert (memo.hits, memo.misses, memo.held) == (1, 1, 2)
    assert memo.of(second, BS, 8) == block_hashes(second.ids, BS, 8)  # another seed: another entry
    assert (memo.hits, memo.misses, memo.held) == (1, 2, 4)


def test_a_prompt_without_cached_leading_pieces_is_not_remembered():
    memo = PrefixHashes(max_hashes=64)
    for e in (enc(1, 2, pieces=1), Encoding.of([5] * 13)):
        assert memo.of(e, BS, 7) == block_hashes(e.ids, BS, 7)
    assert (memo.hits, memo.misses, memo.held) == (0, 0, 0)


def test_a_prefix_of_a_quarter_of_the_bound_is_remembered_and_a_larger_one_is_not():
    memo = PrefixHashes(max_hashes=8)
    memo.of(enc(1, 2), BS, 7)  # 2 hashes: 8 // 4
    assert memo.held == 2
    memo.of(enc(3, 2, n_lead=12), BS, 7)  # 3 hashes
    assert memo.held == 2 and memo.misses == 2


def test_the_memo_holds_up_to_its_bound_then_evicts_the_least_recently_used():
    memo = PrefixHashes(max_hashes=8)
    for lead in (1, 2, 3, 4):
        memo.of(enc(lead, 9), BS, 7)
    assert memo.held == 8
    memo.of(enc(1, 8), BS, 7)  # 1 is now the most recently used
    assert memo.hits == 1
    memo.of(enc(5, 9), BS, 7)  # over the bound: 2, the least recently used, goes
    assert memo.held == 8
    hits = memo.hits
    for lead in (1, 3, 4, 5):
        memo.of(enc(lead, 7), BS, 7)
    assert memo.hits == hits + 4
    memo.of(enc(2, 7), BS, 7)
    assert memo.hits == hits + 4  # a miss


def test_the_bound_must_be_positive():
    assert PrefixHashes(max_hashes=1).max_hashes == 1
    with pytest.raises(ValueError, match=r"^prefix hashes: max_hashes must be >= 1$"):
        PrefixHashes(max_hashes=0)
    fresh = PrefixHashes()
    assert (fresh.hits, fresh.misses, fresh.held) == (0, 0, 0)
