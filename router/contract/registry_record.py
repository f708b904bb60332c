"""The fleet registry in Redis: how engines announce themselves and routers find them.

Plain Redis types, one prefix (`kvroute:registry:`):

    {prefix}engine:{instance_id}   STRING  the engine's record (JSON below), with a TTL the engine
                                           refreshes (default: every 1 s, TTL 3 s); gone = lapsed
    {prefix}ids                    SET     instance ids that registered (routers drop lapsed ones)
    {prefix}events                 PUBSUB  {"type": "join" | "leave" | "role", "record": {...}}, so
                                           routers act at once instead of at their next poll

Record: {"instance_id", "url" (where routers reach it), "role", "model", "cluster_id", "epoch",
"state" ("ready" | "draining"), "ts"}. A draining engine deletes its key and announces
"leave" first thing, so routers stop sending to it before it refuses anything.
"""

from __future__ import annotations

import dataclasses
import time

import orjson

PREFIX = "kvroute:registry:"
IDS = PREFIX + "ids"
CHANNEL = PREFIX + "events"
EVENT_TYPES = ("join", "leave", "role")


def engine_key(instance_id: str) -> str:
    return PREFIX + "engine:" + instance_id


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EngineRecord:
    instance_id: str
    url: str
    role: str = "both"
    model: str = ""
    cluster_id: str = ""
    epoch: int = 0
    state: str = "ready"
    ts: float = dataclasses.field(default_factory=time.time)

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "EngineRecord":
        try:
            d = orjson.loads(raw)
            url = str(d["url"])
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"url must be http(s), got {url!r}")
            return cls(instance_id=str(d["instance_id"]), url=url.rstrip("/"), role=str(d.get("role", "both")),
                       model=str(d.get("model", "")), cluster_id=str(d.get("cluster_id", "")),
                       epoch=int(d.get("epoch", 0)), state=str(d.get("state", "ready")), ts=float(d.get("ts", 0.0)))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed registry record: {e}") from None


def announcement(kind: str, record: EngineRecord) -> bytes:
    return orjson.dumps({"type": kind, "record": dataclasses.asdict(record)})
