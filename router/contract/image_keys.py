"""Images of chat requests: their hashes as vLLM computes them, without downloading anything.

vLLM keys an image by `MultiModalHasher.hash_kwargs(model_id=..., image=...)` (vllm/multimodal/
hasher.py, blake3 by default): a stream of framed chunks over the sorted keywords, where an
image that came as encoded bytes (a data URI, as vLLM's media connector loads it) is hashed by
those bytes, not its pixels. A chunk is its length (8 bytes little-endian) and its bytes; a value
is a tag (0 none, 1 sequence, 2 mapping, 3 leaf) and then its parts:

    framed("image") 03 [framed(bytes)                                 RGB without transparency
                       | framed("image") 02 len=2 framed("io_config") {image_mode, rgba_background_color}
                                                  framed("data") 03 framed(bytes)]   converted to RGB
    framed("model_id") 03 framed(model id)

`image_hash` does the same here for a data URI; anything else (an http(s) URL, which vLLM would
fetch, a client-chosen `uuid` with media kwargs, bytes that are not an image) has no local hash:
`None`, and the router routes the request on its text before that image (counted). The image's
mode is read from its header (Pillow opens lazily): vLLM converts every image to RGB, and an
image it converts is hashed with the conversion settings. tests/unit/test_vllm_key_parity.py
holds the hashes to what vLLM's own hasher gave (tests/unit/data/vllm_keys.json).
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

_TAG_LEAF, _TAG_SEQUENCE, _TAG_MAPPING = b"\x03", b"\x01", b"\x02"
_RGB_CONVERSION = {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}  # vLLM's defaults


def _framed(chunk: bytes) -> bytes:
    return len(chunk).to_bytes(8, "little") + chunk


def _value(obj) -> bytes:
    if isinstance(obj, dict):
        return _TAG_MAPPING + len(obj).to_bytes(8, "little") + b"".join(
            _framed(str(k).encode()) + _value(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return _TAG_SEQUENCE + len(obj).to_bytes(8, "little") + b"".join(_value(v) for v in obj)
    if isinstance(obj, str):
        return _TAG_LEAF + _framed(obj.encode("utf-8"))
    if isinstance(obj, int):
        return _TAG_LEAF + _framed(np.array(obj).tobytes())
    return _TAG_LEAF + _framed(bytes(obj))


def data_uri_bytes(url: str) -> bytes | None:
    """The bytes of a base64 `data:` URI; None for any other URL or a malformed one."""
    if not url.startswith("data:"):
        return None
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None


def _needs_conversion(data: bytes) -> bool | None:
    """Whether vLLM converts this image to RGB (None: not an image Pillow can open)."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.mode != "RGB" or "transparency" in image.info
    except Exception:  # any undecodable header: no local hash
        return None


def image_hash(url: str, model_id: str) -> str | None:
    """vLLM's hash of the image at `url` for `model_id`, when it can be computed from the URL alone."""
    data = data_uri_bytes(url)
    if data is None:
        return None
    converted = _needs_conversion(data)
    if converted is None:
        return None
    from blake3 import blake3

    item = {"io_config": _RGB_CONVERSION, "data": data} if converted else data
    hasher = blake3()
    hasher.update(_framed(b"image") + _TAG_LEAF + _framed(b"image") + _value(item))
    hasher.update(_framed(b"model_id") + _value(model_id))
    return hasher.hexdigest()
