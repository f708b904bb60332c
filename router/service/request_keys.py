"""The prepare stage's keys: a request's adapter, images and salt, and its hashes under them.

`model` names a base model or one of its adapters (router/fleet/model_keys.py); chat image parts
become placeholders before tokenizing and keyed image runs after (router/contract/vision.py); the
block hashes follow the key rule of the model's engines (router/contract/block_keys.py). Plain
requests keep the fast path (router/decision/prefix_hashes.py).
"""

from __future__ import annotations

from kvroute.router.contract.block_keys import KEY_RULES, NO_KEYS, RequestKeys
from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.openai_request import CompletionRequest
from kvroute.router.contract.tokenizer import Tokenizer
from kvroute.router.contract.vision import chat_text, place_images
from kvroute.router.decision.prefix_hashes import PrefixHashes
from kvroute.router.fleet import model_keys
from kvroute.router.service.metrics import RouterMetrics


def chat_messages(req: CompletionRequest, tokenizer: Tokenizer) -> tuple[list[dict], list[str]]:
    """The messages to render (image parts as placeholders) and the images' URLs in order."""
    return chat_text(list(req.messages or ()), tokenizer.vision)


def keyed(enc: Encoding, req: CompletionRequest, adapter: str | None, urls: list[str], tokenizer: Tokenizer,
          instances, model: str, metrics: RouterMetrics) -> tuple[Encoding, RequestKeys]:
    """The prompt with image runs expanded, and what its keys carry (counted by key)."""
    if adapter is None and req.cache_salt is None and not urls:
        return enc, NO_KEYS
    placed = place_images(enc.ids, urls, tokenizer.vision, model_keys.model_path(instances, model))
    if urls:
        enc = Encoding.of(placed.ids)
        metrics.request_keys.labels("image").inc(len(urls))
        if placed.unhashed:
            metrics.request_keys.labels(f"image_unhashed_{placed.unhashed}").inc()
    if adapter is not None:
        metrics.request_keys.labels("adapter").inc()
    if req.cache_salt is not None:
        metrics.request_keys.labels("salt").inc()
    keys = RequestKeys(adapter=adapter, salt=req.cache_salt, images=placed.images,
                       hashable_tokens=placed.hashable_tokens)
    return enc, keys


def block_hashes(memo: PrefixHashes, enc: Encoding, block_size: int, model: str, keys: RequestKeys,
                 instances, seed: int) -> list[int]:
    if keys.plain:
        return memo.of(enc, block_size, seed)
    return KEY_RULES[model_keys.key_rule(instances, model)].request_hashes(enc.data, block_size, model, keys)


def explain(keys: RequestKeys, rule: str, hashed_blocks: int, num_tokens: int, block_size: int) -> dict:
    """POST /router/explain's `keys`: what the request's keys carried and what was hashed."""
    out = {**keys.carried(), "key_rule": rule, "hashed_tokens": hashed_blocks * block_size}
    if keys.hashable_tokens >= 0:
        out["note"] = (f"an image has no local hash (a remote URL, or not placeable): routed on the "
                       f"{keys.hashable_tokens} tokens before it")
    elif hashed_blocks * block_size < num_tokens - block_size + 1 and keys.images and not KEY_RULES[rule].keys_images:
        out["note"] = "these engines key no images: routed on the text before the first image"
    return out


def match_note(keys: RequestKeys, cached_tokens: int, info) -> str:
    """Why an instance holds what it holds of this prompt."""
    if cached_tokens:
        return f"{cached_tokens} tokens cached under the request's keys"
    what = [f"adapter {keys.adapter!r}"] if keys.adapter else []
    what += ["the salt"] * (keys.salt is not None) + [f"{len(keys.images)} image(s)"] * bool(keys.images)
    if info is not None and keys.adapter and keys.adapter not in info.adapters:
        return f"does not serve adapter {keys.adapter!r}: nothing cached"
    return "no block of this prompt indexed" + (f" under {', '.join(what)}" if what else "")
