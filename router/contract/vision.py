"""Images in chat requests: where their placeholder tokens land, and their keys.

A vision model's prompt holds, for each image, a run of placeholder tokens that the engine's
processor makes from one image token. For models whose processor expands every image to the same
number of tokens (LLaVA-1.5: `<image>` x 576), the model directory says so: `config.json`
`image_token_index` (or `image_token_id`) and `processor_config.json` / `preprocessor_config.json`
`image_seq_length` (`VisionLayout.load`). Chat content with image parts is rendered as vLLM
renders it for string-content templates: the message's image placeholders, one per image, then
its text, joined by newlines. The router then finds the image tokens in the prompt's ids, expands
each to its run, and keys each image by its hash (router/contract/image_keys.py).

An image without a local hash (an http(s) URL: the router downloads nothing), or a prompt whose
image tokens the router cannot place (a model whose image size decides its token count, or no
layout in the tokenizer directory), is routed on the text before it: `hashable_tokens` stops the
block hashes there, and the reason is counted (`kvroute_router_request_keys_total`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from kvroute.router.contract.block_keys import ImageKey
from kvroute.router.contract.image_keys import image_hash


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VisionLayout:
    token: str  # the image token's text ("<image>")
    token_id: int
    tokens_per_image: int

    @classmethod
    def load(cls, path: pathlib.Path, token_text) -> VisionLayout | None:
        """The layout in a Hugging Face model directory, or None (`token_text`: id -> token text)."""
        config = _json(path / "config.json")
        token_id = config.get("image_token_index", config.get("image_token_id"))
        count = None
        for name in ("processor_config.json", "preprocessor_config.json"):
            count = count or _json(path / name).get("image_seq_length")
        if not isinstance(token_id, int) or not isinstance(count, int) or count < 1:
            return None
        text = token_text(token_id)
        return cls(token=text, token_id=token_id, tokens_per_image=count) if text else None


def _json(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def image_url(part: Any) -> str | None:
    """The URL of an OpenAI `image_url` content part (None for any other part)."""
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    return url if isinstance(url, str) else None


def chat_text(messages: list[dict], layout: VisionLayout | None) -> tuple[list[dict], list[str]]:
    """Messages with image parts rendered as placeholders (as vLLM does for string-content
    templates), and the images' URLs in prompt order."""
    urls: list[str] = []
    out = []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, list) or not any(image_url(p) for p in content):
            out.append(msg)
            continue
        images = [u for u in map(image_url, content) if u is not None]
        urls += images
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        holders = [layout.token if layout else ""] * len(images)
        out.append({**msg, "content": "\n".join([*holders, *[t for t in texts if isinstance(t, str)]])})
    return out, urls


@dataclasses.dataclass(frozen=True, slots=True)
class PlacedImages:
    ids: list[int]  # the prompt with each image token expanded to its run
    images: tuple[ImageKey, ...]  # the images hashed, up to the first that was not
    hashable_tokens: int  # -1: all were; else the tokens before the first image that was not
    unhashed: str = ""  # why not: "remote_url", "undecodable", "unplaced"


def place_images(ids: list[int], urls: list[str], layout: VisionLayout | None, model_path: str) -> PlacedImages:
    if not urls:
        return PlacedImages(ids, (), -1)
    if layout is None or ids.count(layout.token_id) != len(urls):
        first = ids.index(layout.token_id) if layout and layout.token_id in ids else 0
        return PlacedImages(ids, (), first, "unplaced")
    out: list[int] = []
    keys: list[ImageKey] = []
    cut, why = -1, ""
    n = layout.tokens_per_image
    for token in ids:
        if token != layout.token_id:
            out.append(token)
            continue
        url = urls[len(keys)] if cut < 0 else None
        digest = image_hash(url, model_path) if url is not None else None
        if digest is None and cut < 0:
            cut, why = len(out), "remote_url" if url is not None and not url.startswith("data:") else "undecodable"
        if cut < 0 and digest is not None:
            keys.append(ImageKey(hash=digest, offset=len(out), length=n))
        out.extend([token] * n)
    return PlacedImages(out, tuple(keys), cut, why)
