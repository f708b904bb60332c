"""Write tests/unit/data/vllm_keys.json: block keys as vLLM's own code computes them.

Run it where the vLLM package imports (it is not a kvroute dependency); what was used:

    python3 -m venv --system-site-packages /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install --no-deps vllm==0.34.0
    /tmp/vllm-venv/bin/pip install pybase64 cachetools cbor2 llguidance xgrammar
    /tmp/vllm-venv/bin/python -m kvroute.scripts.vllm_key_fixtures   # from the repository root

It imports only vLLM's hashing modules (vllm.v1.core.kv_cache_utils, vllm.multimodal.hasher,
vllm.multimodal.media) and the request record they read, and records for each case the inputs
(token ids, block size, adapter, images with their placeholder offset and length, salt) and what
vLLM made of them: each image's hash (`MultiModalHasher.hash_kwargs` over the image as vLLM's
`ImageMediaIO` loads a data URI), the per-block extra keys as the block hasher uses them and as
`BlockStored.extra_keys` publishes them (`to_event_extra_keys`), and the block hashes
(`hash_block_tokens` with sha256_cbor, as the events send them: `maybe_convert_block_hash`).
tests/unit/test_vllm_key_parity.py holds the router's keys to them.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import pathlib
import sys

from kvroute.benchmarks.checkout import root

OUT = "tests/unit/data/vllm_keys.json"  # in the checkout
MODEL_ID = "llava-hf/llava-1.5-7b-hf"
IMAGE_TOKEN = 32000  # LLaVA-1.5's <image>; vLLM expands it to the image's placeholder run
BLOCK_SIZE = 16


def _png(width: int, height: int, mode: str, shift: int) -> str:
    from PIL import Image

    image = Image.new(mode, (width, height))
    channels = len(mode)
    image.putdata([tuple((x * 37 + y * 11 + c * 53 + shift) % 256 for c in range(channels))
                   for y in range(height) for x in range(width)])
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = {"red": _png(8, 8, "RGB", 0), "blue": _png(6, 4, "RGB", 101), "alpha": _png(4, 4, "RGBA", 7)}


def _tokens(n: int, images: list[dict]) -> list[int]:
    ids = [(i * 7919 + 13) % 32000 for i in range(n)]
    for img in images:
        ids[img["offset"]:img["offset"] + img["length"]] = [IMAGE_TOKEN] * img["length"]
    return ids


CASES = [
    {"name": "text", "n": 72, "images": [], "adapter": None, "salt": None},
    {"name": "adapter_sql", "n": 72, "images": [], "adapter": ("sql", 1, "/adapters/sql"), "salt": None},
    {"name": "adapter_chat", "n": 72, "images": [], "adapter": ("chat", 2, "/adapters/chat"), "salt": None},
    {"name": "one_image", "n": 72, "images": [{"image": "red", "offset": 5, "length": 20}],
     "adapter": None, "salt": None},
    {"name": "two_images", "n": 88, "images": [{"image": "red", "offset": 3, "length": 10},
                                               {"image": "blue", "offset": 14, "length": 24}],
     "adapter": None, "salt": None},
    {"name": "image_at_block_start", "n": 64, "images": [{"image": "alpha", "offset": 16, "length": 16}],
     "adapter": None, "salt": None},
    {"name": "salt", "n": 72, "images": [], "adapter": None, "salt": "tenant-a"},
    {"name": "adapter_two_images_salt", "n": 88, "images": [{"image": "blue", "offset": 0, "length": 12},
                                                            {"image": "red", "offset": 40, "length": 9}],
     "adapter": ("sql", 1, "/adapters/sql"), "salt": "tenant-b"},
]


def image_hash(data_uri: str) -> str:
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media.image import ImageMediaIO

    media_type, _, b64 = data_uri[len("data:"):].partition(";base64,")
    item = ImageMediaIO().load_base64(media_type, b64)  # what vLLM's media connector does with a data URI
    return MultiModalHasher.hash_kwargs("blake3", model_id=MODEL_ID, image=item)


def _jsonable(value):
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def run_case(case: dict) -> dict:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    images = [dict(img, hash=image_hash(IMAGES[img["image"]])) for img in case["images"]]
    tokens = _tokens(case["n"], images)
    features = [MultiModalFeatureSpec(data=None, modality="image", identifier=img["hash"],
                                      mm_position=PlaceholderRange(offset=img["offset"], length=img["length"]),
                                      mm_hash=img["hash"]) for img in images]
    lora = LoRARequest(*case["adapter"]) if case["adapter"] else None
    request = Request(request_id=case["name"], prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=1),
                      pooling_params=None, mm_features=features or None, lora_request=lora,
                      cache_salt=case["salt"], block_hasher=kcu.get_request_block_hasher(BLOCK_SIZE, sha256_cbor))
    keys, mm_idx = [], 0
    for i in range(len(tokens) // BLOCK_SIZE):
        extra, mm_idx = kcu.generate_block_hash_extra_keys(request, i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE, mm_idx)
        keys.append(extra)
    return {
        "name": case["name"],
        "model_id": MODEL_ID,
        "block_size": BLOCK_SIZE,
        "token_ids": tokens,
        "adapter": case["adapter"][0] if case["adapter"] else None,
        "salt": case["salt"],
        "images": [{"data_uri": IMAGES[img["image"]], "offset": img["offset"], "length": img["length"]}
                   for img in images],
        "vllm": {
            "image_hashes": [img["hash"] for img in images],
            "block_extra_keys": _jsonable(keys),
            "event_extra_keys": _jsonable(kcu.to_event_extra_keys(keys)),
            "block_hashes": [kcu.maybe_convert_block_hash(h) for h in request.block_hashes],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, help=f"where to write them (default: {OUT} of the checkout)")
    args = parser.parse_args(argv)
    out = args.out or root() / OUT
    import vllm
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu

    kcu.init_none_hash(sha256_cbor)
    doc = {"vllm_version": vllm.__version__, "made_by": "python -m kvroute.scripts.vllm_key_fixtures",
           "cases": [run_case(case) for case in CASES]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}: {len(doc['cases'])} cases from vLLM {vllm.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
