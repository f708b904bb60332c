"""The HTTP side of the load generator: probe the target, build request bodies, stream one request.

Requests are OpenAI streaming completions (or chat completions) with
`ignore_eos: true` and `max_tokens` so the output length is what the workload
says. Prompts go as token-id lists by default (exact prefix sharing; kvroute and
vLLM-style servers accept them); `prompt_format="text"` decodes them with the
built-in tokenizer for servers that need strings (re-tokenizing that text may
shift a few tokens at block boundaries, so sharing is approximate). The chat API
always sends text, as one user message. A token is counted per non-empty SSE
content chunk; TTFT is the first such chunk.
"""

from __future__ import annotations

import time

import aiohttp
import orjson
import xxhash

from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.workload_base import RequestSpec

INSTANCE_HEADER = "x-kvroute-instance"
BEST_HEADER = "x-kvroute-best-cached-tokens"  # the router's routing-loss figures (router/service/routing_loss.py)
PREDICTED_HEADER = "x-kvroute-predicted-cached-tokens"
APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PROMPT_FORMATS = ("tokens", "text")
_ERROR_CHARS = 300


class TargetError(Exception):
    """The target cannot be reached or does not look like an OpenAI-compatible server."""


def normalize_target(url: str) -> str:
    """'http://host:port' from 'http://host:port/', 'http://host:port/v1' or 'host:port'."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def probe_target(session: aiohttp.ClientSession, target: str, timeout_s: float = 5.0) -> str | None:
    """Check the target answers; return its first model id from /v1/models (None if it lists none)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    statuses = []
    try:
        for path in ("/v1/models", "/health"):
            async with session.get(target + path, timeout=timeout) as resp:
                statuses.append(f"{resp.status} to GET {path}")
                if resp.status != 200:
                    continue
                if path == "/health":
                    return None
                try:
                    models = (await resp.json(content_type=None)).get("data") or []
                    return str(models[0]["id"]) if models else None
                except (ValueError, AttributeError, KeyError, TypeError, IndexError):
                    return None
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise TargetError(f"cannot reach {target}: {str(e) or type(e).__name__}") from None
    raise TargetError(f"{target} does not look like an OpenAI-compatible server (answered {', '.join(statuses)})")


def request_body(spec: RequestSpec, model: str | None, api: str = "completions", prompt_format: str = "tokens",
                 tokenizer=None, temperature: float | None = None, priority: int | None = None) -> bytes:
    """The JSON body for one spec; `tokenizer` (router.contract.tokenizer) is needed for text prompts and chat."""
    body: dict = {"max_tokens": spec.max_tokens, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    if temperature is not None:
        body["temperature"] = temperature
    if priority is not None:
        body["priority"] = priority
    if model or spec.adapter:
        body["model"] = spec.adapter or model  # an adapter is named as vLLM serves --lora-modules
    if api == "chat":
        body["messages"] = [{"role": "user", "content": tokenizer.decode(spec.prompt_ids)}]
    elif prompt_format == "text":
        body["prompt"] = tokenizer.decode(spec.prompt_ids)
    else:
        body["prompt"] = list(spec.prompt_ids)
    return orjson.dumps(body)


def _content(chunk: dict) -> str:
    choices = chunk.get("choices") or ()
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return choice.get("text") or ""
    return (choice.get("delta") or {}).get("content") or ""


def _error_text(text: str) -> str:
    try:
        err = orjson.loads(text).get("error")
        text = err.get("message", text) if isinstance(err, dict) else str(err or text)
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return " ".join(text.split())[:_ERROR_CHARS] or "empty error body"


def _take_usage(record: RequestRecord, usage: dict) -> None:
    record.prompt_tokens = int(usage.get("prompt_tokens") or record.prompt_tokens)
    if usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        record.cached_tokens = int(details["cached_tokens"])
    if isinstance(details.get("cached_tokens_by_tier"), dict):
        record.cached_tokens_by_tier = {str(k): int(v) for k, v in details["cached_tokens_by_tier"].items()}


async def _read_stream(resp: aiohttp.ClientResponse, record: RequestRecord, start: float) -> None:
    last = None
    chunks = 0
    digest = xxhash.xxh3_64()
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = orjson.loads(data)
        if "error" in chunk:
            record.error = _error_text(data.decode())
            break
        text = _content(chunk)
        if text:
            digest.update(text.encode())
            now = time.perf_counter()
            if last is None:
                record.ttft_s = now - start
            else:
                record.itl_s.append(now - last)
            last = now
            chunks += 1
        if chunk.get("usage"):
            _take_usage(record, chunk["usage"])
    record.output_digest = digest.hexdigest() if chunks else ""
    if not record.output_tokens:
        record.output_tokens = chunks
    if chunks == 0 and not record.error:
        record.error = "the stream ended without any output"


def _count_header(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


async def send_request(session: aiohttp.ClientSession, url: str, body: bytes, record: RequestRecord, t0: float,
                       timeout_s: float = 300.0, headers: tuple[tuple[str, str], ...] = ()) -> RequestRecord:
    """POST one streaming request and fill `record` (times relative to perf_counter() value t0)."""
    start = time.perf_counter()
    record.send_s = start - t0
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json", **dict(headers)},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            record.status = resp.status
            record.instance = resp.headers.get(INSTANCE_HEADER, "")
            record.best_cached_tokens = _count_header(resp.headers.get(BEST_HEADER))
            record.predicted_cached_tokens = _count_header(resp.headers.get(PREDICTED_HEADER))
            if resp.status != 200:
                record.error = _error_text(await resp.text())
            else:
                await _read_stream(resp, record, start)
    except TimeoutError:
        record.error = f"timed out after {timeout_s:g} s"
    except (aiohttp.ClientError, OSError, ValueError) as e:
        record.error = f"{type(e).__name__}: {str(e)[:_ERROR_CHARS]}"
    record.e2e_s = time.perf_counter() - start
    return record
