"""A decode engine checks every pulled frame against its own prompt (engine/transfer/remote_prefill.py):
a prefill peer that is confused (or buggy) and sends valid frames of another prompt's blocks, under
a handle signed for this prompt, must not get its K/V written here: the pull fails, the blocks are
computed here, and the answer is the one a clean engine gives."""

from __future__ import annotations

import asyncio

from kvroute.engine.service.server import ENGINE
from tests.support.kv_transfer_fakes import SECRET, evil_prefill, forged_handle, ids, post, sign_handle
from tests.support.loopback import LoopbackServer


def signed(params: dict) -> dict:
    handle = params["handle"]
    handle["signature"] = sign_handle(handle)
    return params


async def pull_failures(http, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('kvroute_engine_kv_pull_failures_total{reason="TransferError"}'))


async def test_frames_of_another_prompt_are_refused_and_computed_here(start_engine, http):
    decode_url, decode = await start_engine(backend="torch", role="decode", instance_id="dec", kv_secret=SECRET)
    clean_url, _ = await start_engine(backend="torch", role="both", instance_id="ref")
    engine = decode.app[ENGINE]
    async with http.get(decode_url + "/kv/info") as r:
        info = await r.json()
    prompt, other = ids(11, 96), ids(12, 96)
    # right checksums and lengths, but the blocks (and their hashes) are `other`'s
    peer = await LoopbackServer(evil_prefill(info, other, engine.runner.transfer_payload_bytes)).start()
    try:
        params = signed(forged_handle(peer.url, prompt))
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        status, out = await asyncio.wait_for(post(http, decode_url, {**body, "kv_transfer_params": params}), 30)
        assert status == 200 and out["usage"]["completion_tokens"] == 4
        assert await pull_failures(http, decode_url) == 1
        _, ref = await post(http, clean_url, {**body, "prompt": prompt + [7], "max_tokens": 3})
        assert out["choices"][0]["text"].endswith(ref["choices"][0]["text"])
        # the prefix cache holds this prompt's blocks as computed here: a later request reuses them
        # and answers as the clean engine does
        later = {"prompt": prompt + ids(13, 20), "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        _, got = await post(http, decode_url, later)
        _, want = await post(http, clean_url, later)
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= 80
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        await peer.close()
