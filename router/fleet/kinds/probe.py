"""Discovery for engines that do not serve kvroute's /kv/info: model and tokenizer checks.

The contract for a vLLM or SGLang engine (no kvroute endpoint needed):

- model: `GET /v1/models`, the first model that is not an adapter of another (`parent`
  unset), with its `max_model_len` when given; its LoRA adapters are the models whose `parent`
  is it (vLLM lists `--lora-modules` and adapters loaded at run time so), and its `root` the
  model as loaded (what vLLM's image hashes name).
- tokenizer: the router tokenizes with `--tokenizer DIR` (the engine's Hugging Face
  directory) and checks it once against the engine: `POST /tokenize` of a fixed prompt
  and of a fixed chat (vLLM and kvroute serve it) must give the router's ids. A
  disagreement marks the instance incompatible (routed on load only, reported in
  /router/instances); an engine without /tokenize is trusted, with a warning.
- block size: the router hashes with `--kv-event-block-size` (default 16) for these
  engines and maps the engine's own block size from each event's `block_size`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from kvroute.router.contract.tokenizer import Tokenizer, load_tokenizer
from kvroute.router.fleet.kinds.http import EngineHTTP, NotServed

log = logging.getLogger(__name__)

PROBE_TEXT = "kvroute tokenizer check: Hello, world! 1234 naïve café 你好"
PROBE_CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]


@functools.lru_cache(maxsize=4)
def router_tokenizer(path: str | None) -> Tokenizer:
    return load_tokenizer(path)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ServedModel:
    model: str
    max_model_len: int | None
    adapters: tuple[str, ...]
    root: str


async def served_model(http: EngineHTTP, url: str) -> ServedModel:
    data = await http.json(url + "/v1/models")
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list) or not cards:
        raise ValueError(f"{url}/v1/models lists no model")
    bases = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str) and not c.get("parent")]
    if not bases:
        raise ValueError(f"{url}/v1/models lists no base model with an 'id'")
    base, length, root = bases[0]["id"], bases[0].get("max_model_len"), bases[0].get("root")
    adapters = tuple(c["id"] for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)
                     and c.get("parent") == base)
    return ServedModel(model=base, max_model_len=length if isinstance(length, int) else None, adapters=adapters,
                       root=root if isinstance(root, str) and root else base)


async def tokenizer_fingerprint(http: EngineHTTP, url: str, model: str, tokenizer: Tokenizer) -> str:
    """The router's fingerprint when the engine's /tokenize agrees (or cannot be asked), else why not."""
    checks: list[tuple[str, dict[str, object], list[int]]] = [
        ("completion", {"model": model, "prompt": PROBE_TEXT}, tokenizer.encode(PROBE_TEXT))]
    if tokenizer.chat_template is not None:
        checks.append(("chat", {"model": model, "messages": PROBE_CHAT, "add_generation_prompt": True},
                       tokenizer.encode_chat(PROBE_CHAT)))
    for what, body, ours in checks:
        try:
            answer = await http.json(url + "/tokenize", body)
        except NotServed:
            log.warning("%s has no /tokenize: trusting that --tokenizer matches its tokenizer", url)
            return tokenizer.fingerprint
        theirs = answer.get("tokens") if isinstance(answer, dict) else None
        if theirs != ours:
            log.error("%s tokenizes a %s differently from the router (%s... vs %s...): give --tokenizer the "
                      "engine's model directory", url, what, str(theirs)[:60], str(ours)[:60])
            return f"<engine /tokenize disagrees on a {what}>"
    return tokenizer.fingerprint
