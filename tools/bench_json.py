"""orjson against the standard json module on the router's and engine's JSON work.

    python tools/bench_json.py

Parsing a completion body of 8,192 token ids (what the router and engine read per
request) and serializing one stream chunk (what the engine writes per token).
"""

from __future__ import annotations

import argparse
import json
import random
import timeit

import orjson


def per_call(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def main() -> None:
    rng = random.Random(0)
    body = json.dumps({"prompt": [rng.randrange(5, 8192) for _ in range(8192)], "max_tokens": 16}).encode()
    chunk = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": None}]}
    print(f"parse {len(body)}-byte body: json {per_call(lambda: json.loads(body), 200) * 1e3:.3f} ms, "
          f"orjson {per_call(lambda: orjson.loads(body), 200) * 1e3:.3f} ms")
    print(f"serialize a stream chunk: json {per_call(lambda: json.dumps(chunk).encode(), 20000) * 1e6:.2f} us, "
          f"orjson {per_call(lambda: orjson.dumps(chunk), 20000) * 1e6:.2f} us")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
