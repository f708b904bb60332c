"""`kv_transfer_params` of every shape, each pointing at a canary listener.

An engine must refuse every one (403 for anything unverifiable, 400 for a malformed
object) before it pins, connects or writes anything; the router must drop the field and
serve the request as a plain one. Addresses in grants and handles name the canary, so
any connection an engine makes on a client's word is counted (`no-ssrf`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import orjson

from kvroute.loadgen.chaos.fuzz_cases import FuzzCase, _case, with_raw

FAKE_SIGNATURE = "ab" * 32


def _grant(canary: str) -> dict:
    return {"instance": "e0", "address": canary, "expires": round(time.time() + 600, 3), "nonce": "n1",
            "signature": FAKE_SIGNATURE}


def _handle(canary: str) -> dict:
    return {"cluster_id": "e0", "address": canary, "request_id": "cmpl-fuzz", "block_hashes": [1, 2],
            "num_tokens": 40, "first_token": 5, "cached_tokens": 0, "expires": round(time.time() + 600, 3),
            "signature": FAKE_SIGNATURE}


WRONG = ("null", "1", "-1", "1.5", '"x"', "[]", "{}", "true", "18446744073709551616")


def _shapes(canary: str) -> Iterator[tuple[str, str]]:
    """(name, raw JSON of the kv_transfer_params value)."""
    dump = lambda v: orjson.dumps(v).decode()  # noqa: E731
    for raw in ('"x"', "1", "true", "[]", "[{}]", "1.5", '{"x": 1}', '{"do_remote_decode": false}'):
        yield f"kv_transfer_params={raw}", raw
    for flag in ("do_remote_decode", "do_remote_prefill"):
        for value in ("true", '"yes"', "1", "[1]"):
            yield f"{flag}={value}, nothing else", f'{{"{flag}": {value}}}'
    yield "both flags", dump({"do_remote_decode": True, "do_remote_prefill": True, "grant": _grant(canary),
                              "handle": _handle(canary)})
    for raw in WRONG:
        yield f"grant={raw}", f'{{"do_remote_decode": true, "grant": {raw}}}'
        yield f"handle={raw}", f'{{"do_remote_prefill": true, "handle": {raw}}}'
    grant, handle = _grant(canary), _handle(canary)
    yield "grant with a forged signature", dump({"do_remote_decode": True, "grant": grant})
    yield "grant without a signature", dump({"do_remote_decode": True, "grant": {**grant, "signature": None}})
    yield "expired grant", dump({"do_remote_decode": True, "grant": {**grant, "expires": 1.0}})
    yield "handle with a forged signature", dump({"do_remote_prefill": True, "handle": handle})
    yield "handle without a signature", dump({"do_remote_prefill": True, "handle": {**handle, "signature": None}})
    yield "expired handle", dump({"do_remote_prefill": True, "handle": {**handle, "expires": 1.0}})
    for key in grant:
        for raw in WRONG:
            body = dump({"do_remote_decode": True, "grant": {**grant, key: "@@"}}).replace('"@@"', raw)
            yield f"grant.{key}={raw}", body
    for key in handle:
        for raw in WRONG:
            body = dump({"do_remote_prefill": True, "handle": {**handle, key: "@@"}}).replace('"@@"', raw)
            yield f"handle.{key}={raw}", body
    yield "handle with 2^64 as a block hash", dump({"do_remote_prefill": True, "handle": handle}).replace(
        "[1,2]", "[18446744073709551615, 18446744073709551616]")
    yield "handle with 100k block hashes", dump({"do_remote_prefill": True,
                                                 "handle": {**handle, "block_hashes": list(range(100_000))}})


def kv_cases(canary: str, target: str) -> Iterator[FuzzCase]:
    expect = "stripped" if target == "router" else "4xx"
    prompt = {"prompt": [7] * 40, "max_tokens": 2}
    for name, raw in _shapes(canary):
        for stream in (False, True):
            body = with_raw("completion", ("kv_transfer_params",), raw, stream=stream, extra=prompt)
            yield _case("kv", f"{name}{' stream' if stream else ''}", "completion", body, expect)
