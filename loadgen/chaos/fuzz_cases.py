"""The malformed bodies, by category. Every case is invalid by the OpenAI API's rules, so
the only right answer is a 4xx with an OpenAI error body; the one exception is a
`kv_transfer_params` sent to the router, which strips it and serves the rest (`expect`
"stripped": a 200 whose answer carries no transfer handle).

    json    invalid JSON: syntax errors, every truncation of a valid body, non-objects
    utf8    bad UTF-8 bytes and lone surrogate escapes in every string field
    types   a wrong-typed value in every field kvroute reads (fuzz_fields.py)
    range   numbers past the edges: negative, zero, past int64/uint64, infinite
    tokens  token ids >= 2^32, >= the vocabulary, negative, floats, strings, in every block position
    huge    50 MB bodies (with Content-Length and chunked), bodies and prompts just past the limits
    deep    100k nested arrays and objects, and depth just past the parser's limit
    kv      kv_transfer_params of every shape: non-objects, grants and handles unsigned,
            forged, expired, wrong-typed field by field, pointing anywhere
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import orjson

from kvroute.loadgen.chaos.fuzz_fields import BASE, FIELDS, OUT_OF_RANGE, PATHS, POOL
from kvroute.loadgen.chaos.httpraw import RawRequest
from kvroute.router.contract.limits import Limits

MB = 1 << 20
HOLE = "@@fuzz@@"


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    category: str
    name: str
    request: RawRequest
    expect: str = "4xx"  # or "stripped", or "4xx-or-close" (the client itself hung up mid-body)


def with_raw(kind: str, path: tuple, raw: str | bytes, stream: bool = False, extra: dict | None = None) -> bytes:
    """The base body of `kind` with the raw JSON `raw` placed at `path` (dicts made on the way)."""
    body = copy.deepcopy(BASE[kind])
    body.update(extra or {})
    if stream:
        body["stream"] = True
    node: Any = body  # a dict or list on the way down
    for key in path[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
            node[key] = {}
        node = node[key]
    node[path[-1]] = HOLE
    raw = raw.encode() if isinstance(raw, str) else raw
    return orjson.dumps(body).replace(b'"' + HOLE.encode() + b'"', raw, 1)


def _case(category: str, name: str, kind: str, body, expect: str = "4xx", **request) -> FuzzCase:
    return FuzzCase(category, name, RawRequest(PATHS[kind], body, **request), expect)


def json_cases() -> Iterator[FuzzCase]:
    broken = ["", " ", "{", "}", "{,}", '{"prompt": "hi"', '{"prompt": "hi",}', "{'prompt': 'hi'}", '{prompt: "hi"}',
              '{"prompt": "hi"} trailing', '{"prompt": "hi"}{"prompt": "hi"}', '{"prompt": NaN}',
              '{"prompt": "hi", "temperature": NaN}', '{"prompt": "hi", "temperature": Infinity}', "-Infinity",
              '{"prompt": "hi" /* comment */}', '// comment\n{"prompt": "hi"}', '{"prompt": "a\nb"}',
              '{"prompt": "a\x01b"}', '{"prompt": "\\x41"}', '{"prompt": "\\u12"}', '{"prompt": 01}',
              '{"prompt": .5}', '{"prompt": 1.}', '{"prompt": +1}', '{"prompt": 0x10}', '{"prompt" "hi"}',
              '{"prompt": "hi" "max_tokens": 2}', '{"prompt": [1, 2,]}', '{"prompt": [1 2]}', '{"prompt": tru}',
              '{"prompt": nul}', '{"prompt": "hi", "max_tokens": 2,,}', "\ufeff{\"prompt\": \"hi\"}",
              "null", "[]", '[{"prompt": "hi"}]', "1", '"prompt"', "true", "{}"]
    for kind in PATHS:
        for i, text in enumerate(broken):
            yield _case("json", f"{kind} syntax #{i}: {text[:24]!r}", kind, text.encode())
        valid = orjson.dumps(BASE[kind])
        for n in range(len(valid)):
            yield _case("json", f"{kind} truncated at byte {n}", kind, valid[:n])


BAD_UTF8 = (b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
            b"\xf8\x88\x80\x80\x80", b"\x80", b"\xe2\x82", b"\xc3")
BAD_ESCAPES = (b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\udc00\\ud800")
STRING_FIELDS = (("completion", ("prompt",)), ("chat", ("messages", 0, "content", 0, "text")),
                 ("chat", ("messages", 0, "role")), ("completion", ("model",)), ("completion", ("stop",)),
                 ("completion", ("cache_salt",)), ("completion", ("user",)))


def utf8_cases() -> Iterator[FuzzCase]:
    for kind, path in STRING_FIELDS:
        for bad in BAD_UTF8 + BAD_ESCAPES:
            raw = b'"ok ' + bad + b' ok"'
            yield _case("utf8", f"{'.'.join(map(str, path))} holds {bad!r}", kind, with_raw(kind, path, raw))
    yield _case("utf8", "bad UTF-8 in a key", "completion", b'{"prompt": "hi", "\xff\xfe": 1}')


def type_cases() -> Iterator[FuzzCase]:
    for field in FIELDS:
        for raw, value in POOL:
            if field.valid(value) or (value is None and not field.required):
                continue
            for kind in field.kinds:
                for stream in (False, True):
                    body = with_raw(kind, field.path, raw, stream=stream and field.name != "stream")
                    yield _case("types", f"{kind} {field.name}={raw}{' stream' if stream else ''}", kind, body)


def range_cases() -> Iterator[FuzzCase]:
    for name, raws in OUT_OF_RANGE.items():
        for raw in raws:
            for kind in PATHS:
                for stream in (False, True):
                    body = with_raw(kind, (name,), raw, stream=stream)
                    yield _case("range", f"{kind} {name}={raw[:24]}{' stream' if stream else ''}", kind, body)


def token_cases(limits: Limits) -> Iterator[FuzzCase]:
    v = limits.vocab_size
    bad = [str(1 << 32), str((1 << 32) + 1), str((1 << 64) - 1), str(1 << 64), str(v), str(v + 1), str(1 << 31),
           "-1", "-2147483648", "-9223372036854775808", "1.5", "1e3", "5.0", '"5"', "true", "null", "[5]", "{}"]
    forms = {"alone": (0, 1), "first of 40": (0, 40), "inside a full block": (20, 40), "in the partial tail": (40, 41),
             "last of one full block": (15, 16)}
    for raw in bad:
        for where, (at, n) in forms.items():
            ids = ["7"] * n
            ids[at] = raw
            prompt = "[" + ", ".join(ids) + "]"
            if n == 1 and raw in ('"5"', "[5]"):
                continue  # ["5"] and [[5]] are batches of one valid prompt
            for stream in (False, True):
                s = " stream" if stream else ""
                yield _case("tokens", f"id {raw} {where}{s}", "completion", with_raw("completion", ("prompt",), prompt,
                                                                                   stream))
            yield _case("tokens", f"id {raw} {where}, batch of one", "completion",
                        with_raw("completion", ("prompt",), "[" + prompt + "]"))


class Filler:
    """A body of `head + unit * count + tail`, produced piece by piece (never held whole)."""

    def __init__(self, head: bytes, unit: bytes, count: int, tail: bytes) -> None:
        self.head, self.unit, self.count, self.tail = head, unit, count, tail
        self.size = len(head) + len(unit) * count + len(tail)

    def __iter__(self):
        yield self.head
        per = max(1, (1 << 16) // len(self.unit))
        for start in range(0, self.count, per):
            yield self.unit * min(per, self.count - start)
        yield self.tail


def huge_cases(limits: Limits) -> Iterator[FuzzCase]:
    big = 50 * MB
    prompt = Filler(b'{"prompt": "', b"a", big, b'"}')
    chat = Filler(b'{"messages": [{"role": "user", "content": "', b"a", big, b'"}]}')
    ids = Filler(b'{"prompt": [', b"7, ", big // 3, b"7]}")
    for name, body in (("50 MB prompt", prompt), ("50 MB token ids", ids)):
        yield _case("huge", f"{name}, Content-Length", "completion", body, declared_length=body.size)
        yield _case("huge", f"{name}, chunked", "completion", body, chunked=True)
    yield _case("huge", "50 MB chat message, Content-Length", "chat", chat, declared_length=chat.size)
    yield _case("huge", "50 MB chat message, chunked", "chat", chat, chunked=True)
    over = limits.max_body_bytes + 1 - len(b'{"prompt": ""}')
    yield _case("huge", "body 1 byte over --max-body-bytes", "completion", b'{"prompt": "' + b"a" * over + b'"}')
    chars = limits.max_prompt_chars + 1
    yield _case("huge", "prompt 1 character over --max-prompt-chars", "completion",
                orjson.dumps({"prompt": "a" * chars}))
    yield _case("huge", "chat 1 character over --max-prompt-chars", "chat",
                orjson.dumps({"messages": [{"role": "user", "content": "a" * (chars // 100 + 1)}] * 100}))
    yield _case("huge", "one token past the context", "completion",
                orjson.dumps({"prompt": [7] * limits.max_model_len}))
    tiny = {"role": "user", "content": ""}
    count = (limits.max_body_bytes - 64) // len(orjson.dumps(tiny) + b",")
    yield _case("huge", f"{count} empty chat messages", "chat", orjson.dumps({"messages": [tiny] * count}))
    yield _case("huge", "100k stop strings", "completion", with_raw("completion", ("stop",),
                                                                    "[" + ", ".join(['"s"'] * 100_000) + "]"))
    # The client promises 1000 bytes, sends 15 and closes its side: a 4xx or a close, never a 5xx.
    yield _case("huge", "body shorter than its Content-Length", "completion", b'{"prompt": "hi"', "4xx-or-close",
                declared_length=1000)


def deep_cases() -> Iterator[FuzzCase]:
    n = 100_000
    arrays, objects = "[" * n + "]" * n, '{"a": ' * n + "1" + "}" * n
    places = {"prompt": ("completion", ("prompt",)), "messages": ("chat", ("messages",)),
              "message content": ("chat", ("messages", 0, "content")), "stop": ("completion", ("stop",)),
              "stream_options": ("completion", ("stream_options",)),
              "kv_transfer_params": ("completion", ("kv_transfer_params",))}
    for where, (kind, path) in places.items():
        yield _case("deep", f"100k nested arrays as {where}", kind, with_raw(kind, path, arrays))
        yield _case("deep", f"100k nested objects as {where}", kind, with_raw(kind, path, objects))
    yield _case("deep", "100k nested arrays as the body", "completion", arrays.encode())
    yield _case("deep", "1025 nested arrays as the prompt", "completion",
                with_raw("completion", ("prompt",), "[" * 1025 + "1" + "]" * 1025))
    yield _case("deep", "1000 nested arrays as the prompt", "completion",
                with_raw("completion", ("prompt",), "[" * 1000 + "1" + "]" * 1000))
    yield _case("deep", "1000 nested arrays as stop", "completion",
                with_raw("completion", ("stop",), "[" * 1000 + '"x"' + "]" * 1000))
