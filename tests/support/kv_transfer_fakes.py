"""Fakes for the KV-transfer trust tests: ids, a canary listener, forged handles, an evil prefill."""

import asyncio
import os
import random

import orjson
import xxhash
from aiohttp import web

from kvroute.engine.transfer.kv_transfer import END_INDEX, FRAME, tail_hash
from kvroute.router.contract.kv_auth import sign
from kvroute.router.contract.protocol import block_hashes, hash_seed

SECRET = "trust-test-secret"
BS = 16


def ids(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(5, 8192) for _ in range(n)]


async def post(http, url, body, path="/v1/completions"):
    async with http.post(url + path, json=body) as r:
        return r.status, orjson.loads(await r.read())


class Listener:
    """A raw TCP listener that counts every connection it is offered (the SSRF canary)."""

    def __init__(self):
        self.connections = 0
        self.server = None

    async def start(self):
        async def on_connect(reader, writer):
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self):
        self.server.close()
        await self.server.wait_closed()


def forged_handle(address, prompt, cluster_id="evil", signature=None):
    seed = hash_seed("kvroute-tiny")
    hashes = block_hashes(prompt, BS, seed)
    handle = {"cluster_id": cluster_id, "address": address, "request_id": "x", "block_hashes": hashes,
              "num_tokens": len(prompt), "first_token": 7, "cached_tokens": 0, "expires": 4e9,
              "tail_hash": tail_hash(prompt, BS, seed, hashes[-1] if hashes else None)}
    if signature is not None:
        handle["signature"] = signature
    return {"do_remote_prefill": True, "handle": handle}


def evil_prefill(info: dict, prompt: list[int], payload_bytes: int, length_delta: int = 0) -> web.Application:
    """Answers /kv/info like a compatible engine and /kv/transfer with frames carrying random K/V
    labelled with `prompt`'s block hashes and valid checksums (optionally a wrong length)."""
    hashes = block_hashes(prompt, BS, hash_seed("kvroute-tiny"))

    async def kv_info(_):
        return web.json_response({**info, "cluster_id": "evil", "role": "prefill"})

    async def transfer(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        n_blocks = -(-len(prompt) // BS)
        for i in range(n_blocks):
            payload = os.urandom(payload_bytes)
            h = hashes[i] if i < len(hashes) else 0
            await resp.write(FRAME.pack(i, h, xxhash.xxh3_64_intdigest(payload), len(payload) + length_delta)
                             + payload)
        await resp.write(FRAME.pack(END_INDEX, 0, 0, 0))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/kv/info", kv_info)
    app.router.add_post("/kv/transfer", transfer)
    return app


HANDLE_FIELDS = ("cluster_id", "address", "request_id", "block_hashes", "num_tokens", "first_token",
                 "cached_tokens", "expires", "tail_hash")  # TransferHandle.signed_fields, in order


def sign_handle(handle: dict, secret: str = SECRET) -> str:
    """What a prefill engine holding `secret` would sign this handle with."""
    return sign(secret, "handle", [handle[k] for k in HANDLE_FIELDS])
