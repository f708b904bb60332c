"""The tokenizer shared by routers and engines: encode, decode, chat template, fingerprint.

`load_tokenizer(None)` is the built-in 8192-token byte-level BPE (router/contract/data/, made by
kvroute/scripts/train_tokenizer.py) with a ChatML template; `load_tokenizer(DIR)` reads a local
Hugging Face model directory (tokenizer.json, tokenizer_config.json, chat_template.jinja,
generation_config.json, config.json). The built-in directory has that same layout.

Special tokens, as Hugging Face does it:

- `encode(text)` (completions): if tokenizer_config.json sets `add_bos_token`/`add_eos_token`,
  those decide (Llama-2 style); otherwise tokenizer.json's post-processor does (Llama-3
  style). The built-in adds nothing.
- `encode_chat(messages)`: the template's text (with the generation prompt) is encoded
  without special tokens, as Hugging Face's `apply_chat_template(tokenize=True)`, vLLM and
  SGLang do: BOS appears exactly where the template writes `bos_token`, so the router's ids
  are the ids such an engine computes (and caches) for the same messages.

The fingerprint covers what decides token ids: tokenizer.json in canonical form (sorted
keys, padding and truncation dropped), the chat template and the special-token rules.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
import xxhash

from kvroute.router.contract.encoding import EncodePlan, FullPlan
from kvroute.router.contract.segment_cache import SegmentCache
from kvroute.router.contract.vision import VisionLayout

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"
BUILTIN_NAME = "kvroute-bpe-8k"


def validate_messages(messages: Any) -> list[dict]:
    """Check OpenAI chat messages; return copies whose content is a plain string.

    Content given as a list of {"type": "text", "text": ...} parts is joined with newlines.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}].role must be a non-empty string")
        out.append({**msg, "content": _content_text(msg.get("content"), i)})
    return out


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
    texts = []
    for part in content:
        ok = isinstance(part, dict) and part.get("type") == "text"
        if not ok or not isinstance(part.get("text"), str):
            raise ValueError(f"messages[{i}].content parts must be {{\"type\": \"text\", \"text\": str}}")
        texts.append(part["text"])
    return "\n".join(texts)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.cache
def _compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
    """A loaded tokenizer; build it with `load_tokenizer`. Thread-safe, immutable."""

    name: str
    fingerprint: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    stop_token_ids: frozenset[int]
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None = dataclasses.field(repr=False)
    add_bos_token: bool | None  # None: tokenizer.json's post-processor decides
    add_eos_token: bool | None
    backend: tokenizers.Tokenizer = dataclasses.field(repr=False)
    # Pieces between special tokens, tokenized once (router/contract/segment_cache.py); None: always in full.
    segments: SegmentCache | None = dataclasses.field(default=None, repr=False)
    # What the post-processor puts before a completion prompt, when that is all it adds (else None).
    post_prefix: tuple[int, ...] | None = None
    vision: VisionLayout | None = None  # where images' placeholder tokens go (router/contract/vision.py)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt; releases the GIL while the Rust encoder runs."""
        return self.plan(text, add_special_tokens).finish().ids

    def plan(self, text: str, add_special_tokens: bool = True) -> EncodePlan:
        """`encode` in two steps (router/contract/encoding.py): the lookups now, the encoding on `finish()`."""
        rules = add_special_tokens and self.add_bos_token is None and self.add_eos_token is None
        lead: tuple[int, ...] = ()
        tail: tuple[int, ...] = ()
        if add_special_tokens and not rules:
            if self.add_bos_token and self.bos_token_id is not None:
                lead = (self.bos_token_id,)
            if self.add_eos_token and self.eos_token_id is not None:
                tail = (self.eos_token_id,)
        if self.segments is not None and (not rules or self.post_prefix is not None):
            return self.segments.plan(text, self.post_prefix if rules and self.post_prefix is not None else lead, tail)
        return FullPlan(self.backend, text, rules, lead, tail)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Any) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        if self.chat_template is None:
            raise ValueError(f"tokenizer {self.name} has no chat template: use /v1/completions")
        try:
            return _compile_template(self.chat_template).render(
                messages=validate_messages(messages),
                add_generation_prompt=True,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                tools=None,
                documents=None,
            )
        except (jinja2.TemplateError, TypeError) as exc:
            raise ValueError(f"the chat template rejected the messages: {exc}") from None

    def encode_chat(self, messages: Any) -> list[int]:
        return self.plan_chat(messages).finish().ids

    def plan_chat(self, messages: Any) -> EncodePlan:
        return self.plan(self.apply_chat_template(messages), add_special_tokens=False)


def load_tokenizer(path: str | pathlib.Path | None = None) -> Tokenizer:
    """The built-in tokenizer (None, loaded once per process) or a Hugging Face model dir."""
    if path is None:
        return _builtin()
    return _load_dir(pathlib.Path(path))


@functools.lru_cache(maxsize=1)
def _builtin() -> Tokenizer:
    return _load_dir(DATA_DIR, name=BUILTIN_NAME)


def _load_dir(path: pathlib.Path, name: str | None = None) -> Tokenizer:
    canonical, backend = _load_backend(path)
    segments = SegmentCache.build(json.loads(canonical), backend)
    config = _read_json(path / "tokenizer_config.json", optional=True)
    template = _chat_template(path, config)
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    bos_id = backend.token_to_id(bos) if bos else None
    eos_id = backend.token_to_id(eos) if eos else None
    add_bos, add_eos = _flag(config, "add_bos_token"), _flag(config, "add_eos_token")
    stops = {eos_id} if eos_id is not None else set()
    for extra in ("generation_config.json", "config.json"):
        stops |= _id_set(_read_json(path / extra, optional=True).get("eos_token_id"))
    rules = f"bos={bos_id} add_bos={add_bos} eos={eos_id} add_eos={add_eos}"
    digest = xxhash.xxh3_64()
    for part in (canonical, template or "", rules):
        digest.update(part.encode("utf-8") + b"\x00")
    return Tokenizer(
        name=name or path.resolve().name,
        fingerprint=digest.hexdigest(),
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        stop_token_ids=frozenset(stops),
        bos_token=bos,
        eos_token=eos,
        chat_template=template,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        backend=backend,
        segments=segments,
        post_prefix=_post_prefix(backend),
        vision=VisionLayout.load(path, backend.id_to_token),
    )


def _post_prefix(backend: tokenizers.Tokenizer) -> tuple[int, ...] | None:
    """The ids the post-processor adds before a prompt, if it adds nothing after it."""
    first: tuple[int, ...] | None = None
    for probe in ("x", "hello world", "  a\nb"):
        plain = backend.encode(probe, add_special_tokens=False).ids
        full = backend.encode(probe, add_special_tokens=True).ids
        if len(full) < len(plain) or full[len(full) - len(plain):] != plain:
            return None
        prefix = tuple(full[: len(full) - len(plain)])
        if first is not None and prefix != first:
            return None
        first = prefix
    return first


def _load_backend(path: pathlib.Path) -> tuple[str, tokenizers.Tokenizer]:
    """tokenizer.json in canonical form, and the Rust tokenizer built from it."""
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise ValueError(f"{path} {problem}: pass a Hugging Face model directory with a tokenizer.json")
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"no tokenizer.json in {path}: kvroute needs a Hugging Face fast tokenizer")
    spec = _read_json(file)
    spec["padding"] = spec["truncation"] = None
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return canonical, tokenizers.Tokenizer.from_str(canonical)
    except Exception as exc:  # the Rust parser raises a bare Exception
        raise ValueError(f"{file} is not a valid tokenizers file: {exc}") from None


def _read_json(file: pathlib.Path, optional: bool = False) -> dict:
    if optional and not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {file}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object")
    return data


def _chat_template(path: pathlib.Path, config: dict) -> str | None:
    file = path / "chat_template.jinja"
    source: object  # checked below: a string, or None
    if file.is_file():
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {file}: {exc}") from None
    else:
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
    if source is None:
        return None
    if not isinstance(source, str):
        raise ValueError(f"the chat template in {path} must be a string")
    try:
        _compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"the chat template in {path} is not valid Jinja: {exc}") from None
    return source


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # serialized AddedToken
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _flag(config: dict, key: str) -> bool | None:
    value = config.get(key)
    return value if isinstance(value, bool) else None


def _id_set(value: Any) -> set[int]:
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
