"""Policy inputs without a tokenizer: stand-in block hash chains and the route requests made of them."""

import xxhash

from kvroute.router.decision.policies import RouteRequest

BS = 16


def chain(prefix: int, n: int, tail: int = 0, n_tail: int = 0) -> tuple[int, ...]:
    """Stand-in block hashes: n shared blocks of `prefix`, then n_tail blocks unique to `tail`."""
    shared = tuple(xxhash.xxh3_64_intdigest(f"p{prefix}:{i}".encode()) for i in range(n))
    return shared + tuple(xxhash.xxh3_64_intdigest(f"t{prefix}:{tail}:{i}".encode()) for i in range(n_tail))


def req(blocks, num_tokens=None, request_id=""):
    blocks = tuple(blocks)
    return RouteRequest(num_tokens=num_tokens if num_tokens is not None else len(blocks) * BS + 5, block_hashes=blocks,
                        block_size=BS, request_id=request_id)
