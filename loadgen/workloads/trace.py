"""trace:FILE: replay a Mooncake-format JSONL trace (plain or .gz) with synthetic content, scaled to a small machine.

Each line is {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}; each hash id stands for one 512-token block of prompt content,
and requests whose hash_ids start the same share that prefix. The replay maps each
hash id to fixed synthetic content of `trace_block_tokens` tokens (the same id,
the same tokens), so the input length scales by trace_block_tokens / 512; the
last block is cut so the prompt is ceil(input_length x that scale) tokens, and
prompts longer than `trace_max_input` are truncated (keeping their prefix).
Output lengths are capped at `trace_max_output`. Send times are the timestamps
relative to the first line, multiplied by `trace_time_scale` (2.0 = half the
rate). `num_requests` takes the first N lines. `info()` says how it scaled.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
from typing import IO

from kvroute.loadgen.workload_base import RequestSpec
from kvroute.loadgen.workloads.content import check_int, check_number, keyed_tokens

SOURCE_BLOCK_TOKENS = 512  # Mooncake's block size
_BLOCK_STREAM, _PAD_STREAM = 5, 6


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    path: str = ""
    num_requests: int | None = None  # None = every line
    trace_block_tokens: int = 32
    trace_time_scale: float = 1.0
    trace_max_input: int = 2048
    trace_max_output: int = 128

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("the trace workload needs a file: --workload trace:FILE")
        if not pathlib.Path(self.path).is_file():
            raise ValueError(f"trace file {self.path!r} does not exist")
        if self.num_requests is not None:
            check_int("num_requests", self.num_requests)
        check_int("trace_block_tokens", self.trace_block_tokens)
        check_number("trace_time_scale", self.trace_time_scale, 0.0, strict=True)
        check_int("trace_max_input", self.trace_max_input)
        check_int("trace_max_output", self.trace_max_output)


def read_trace(path: str, limit: int | None = None) -> list[dict]:
    """The first `limit` lines of a Mooncake trace, checked; ValueError names the bad line."""
    lines: list[dict] = []
    try:
        with _open_text(path) as f:
            for n, line in enumerate(f, 1):
                if limit is not None and len(lines) >= limit:
                    break
                if line.strip():
                    lines.append(_entry(path, n, line))
    except (OSError, EOFError, UnicodeDecodeError) as e:  # unreadable, a broken .gz, not text
        raise ValueError(f"cannot read trace file {path!r}: {e}") from None
    if not lines:
        raise ValueError(f"trace file {path!r} has no requests")
    return lines


def _entry(path: str, n: int, line: str) -> dict:
    try:
        row = json.loads(line)
        return {"timestamp": float(row["timestamp"]), "input_length": int(row["input_length"]),
                "output_length": int(row["output_length"]), "hash_ids": [int(h) for h in row["hash_ids"]]}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} line {n}: not a Mooncake trace line ({e})") from None


def _open_text(path: str) -> IO[str]:
    """The file as text, gunzipped when its name ends in .gz (the packaged sample is)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class TraceWorkload:
    name = "trace"

    def __init__(self, config: TraceConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self.lines = read_trace(config.path, config.num_requests)

    def _block(self, cache: dict[int, tuple[int, ...]], hash_id: int) -> tuple[int, ...]:
        if hash_id not in cache:
            cache[hash_id] = keyed_tokens(self.seed, hash_id, self.config.trace_block_tokens, _BLOCK_STREAM)
        return cache[hash_id]

    def scaled_input(self, input_length: int) -> int:
        return max(1, math.ceil(input_length * self.config.trace_block_tokens / SOURCE_BLOCK_TOKENS))

    def requests(self) -> list[RequestSpec]:
        c = self.config
        cache: dict[int, tuple[int, ...]] = {}
        start_ms = self.lines[0]["timestamp"]
        specs = []
        for i, line in enumerate(self.lines):
            n = min(self.scaled_input(line["input_length"]), c.trace_max_input)
            blocks = line["hash_ids"][: math.ceil(n / c.trace_block_tokens)]
            prompt = tuple(t for h in blocks for t in self._block(cache, h))[:n]
            if len(prompt) < n:  # more tokens than hash ids cover: unique filler
                prompt += keyed_tokens(self.seed, i, n - len(prompt), _PAD_STREAM)
            specs.append(RequestSpec(
                index=i, prompt_ids=prompt, max_tokens=max(1, min(line["output_length"], c.trace_max_output)),
                group=f"prefix-{line['hash_ids'][0]}" if line["hash_ids"] else f"req-{i}",
                arrival_s=(line["timestamp"] - start_ms) / 1000.0 * c.trace_time_scale))
        return specs

    def info(self) -> dict:
        c = self.config
        inputs = [line["input_length"] for line in self.lines]
        scaled = [min(self.scaled_input(n), c.trace_max_input) for n in inputs]
        outputs = [line["output_length"] for line in self.lines]
        span_s = (self.lines[-1]["timestamp"] - self.lines[0]["timestamp"]) / 1000.0
        return {
            "workload": self.name, "seed": self.seed, "file": str(c.path), "requests": len(self.lines),
            "source_block_tokens": SOURCE_BLOCK_TOKENS, "block_tokens": c.trace_block_tokens,
            "token_scale": c.trace_block_tokens / SOURCE_BLOCK_TOKENS, "time_scale": c.trace_time_scale,
            "max_input": c.trace_max_input, "max_output": c.trace_max_output,
            "mean_input_source": sum(inputs) / len(inputs), "mean_input": sum(scaled) / len(scaled),
            "truncated_inputs": sum(self.scaled_input(n) > c.trace_max_input for n in inputs),
            "mean_output_source": sum(outputs) / len(outputs),
            "capped_outputs": sum(n > c.trace_max_output for n in outputs),
            "span_source_s": span_s, "span_s": span_s * c.trace_time_scale,
        }
