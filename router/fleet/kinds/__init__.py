"""Engine kinds: how the router discovers an engine and reads its load.

    kvroute  GET /kv/info and /load; KV events from /kv/events (or Redis, or ZeroMQ)
    vllm     GET /v1/models, /tokenize check, Prometheus /metrics; KV events over ZeroMQ only
    sglang   the same, with sglang:* metrics or /get_load; KV events over ZeroMQ only
    auto     (default) /kv/info answers -> kvroute; else /metrics names vllm:* or sglang:*

`--engine-kind KIND` sets every engine's kind, `--engine-kind URL=KIND` one engine's.
An engine's KV events come over ZeroMQ whenever it has `--kv-event-source`, whatever its
kind; a vLLM or SGLang engine without one is routed on load alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Protocol

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.fleet.kinds.http import EngineHTTP, NotServed
from kvroute.router.fleet.kinds.kvroute import KvrouteKind
from kvroute.router.fleet.kinds.sglang import SglangKind
from kvroute.router.fleet.kinds.vllm import VllmKind
from kvroute.router.fleet.settings import FleetSettings
from kvroute.router.fleet.upstream_errors import NotAnEngine


class EngineKind(Protocol):
    name: str
    has_kv_feed: bool  # serves kvroute's own /kv/events and /kv/snapshot
    key_rule: str  # how its engine keys adapters, images and salts (router/contract/block_keys.py KEY_RULES)

    async def discover(self, http: EngineHTTP, inst, config: FleetSettings) -> EngineInfo: ...

    async def load(self, http: EngineHTTP, inst) -> LoadRecord: ...


ENGINE_KINDS: dict[str, EngineKind] = {k.name: k for k in (KvrouteKind(), VllmKind(), SglangKind())}
KIND_NAMES = ("auto", *ENGINE_KINDS)


def parse_kinds(items: Iterable[str], engines: Iterable[str]) -> Mapping[str, str]:
    """`--engine-kind` values -> {engine URL: kind}; raises ValueError with a sentence."""
    urls = [e.rstrip("/") for e in engines]
    default, out = "auto", {}
    for item in items:
        url, sep, kind = item.rpartition("=")
        if kind not in KIND_NAMES:
            raise ValueError(f"--engine-kind must be one of {', '.join(KIND_NAMES)} (or URL=KIND), got {item!r}")
        if not sep:
            default = kind
            continue
        url = url.rstrip("/")
        if url not in urls:
            raise ValueError(f"--engine-kind {item!r}: {url} is not one of the --engine URLs")
        out[url] = kind
    return {url: out.get(url, default) for url in urls}


async def detect(http: EngineHTTP, url: str) -> str:
    """The kind of the engine at `url`, from what it serves."""
    try:
        await http.json(url + "/kv/info")
        return "kvroute"
    except (NotServed, ValueError) as e:
        why = str(e).replace(url, "")
    try:
        text = await http.text(url + "/metrics")
    except NotServed:
        text = ""
    for name in ("vllm", "sglang"):
        if f"\n{name}:" in text or text.startswith(f"{name}:"):
            return name
    raise NotAnEngine(f"{why}, and /metrics has no vllm:* or sglang:* series (if it is one, pass "
                      f"--engine-kind {url}=vllm|sglang|kvroute)")


async def discover_info(http: EngineHTTP, inst, config: FleetSettings) -> EngineInfo:
    """What the engine at `inst.url` is (its kind resolved first when it is "auto")."""
    if inst.kind == "auto":
        inst.kind = await detect(http, inst.url)
    kind = ENGINE_KINDS[inst.kind]
    inst.engine_feed = kind.has_kv_feed
    return dataclasses.replace(await kind.discover(http, inst, config), key_rule=kind.key_rule)


async def poll_load(http: EngineHTTP, inst) -> LoadRecord:
    return await ENGINE_KINDS[inst.kind].load(http, inst)


def assign_kinds(instances, config: FleetSettings) -> None:
    kinds = parse_kinds(config.engine_kinds, config.engines)
    for inst in instances:
        inst.kind = kinds.get(inst.url, "auto")
