"""The fleet registry in Redis: how engines announce themselves and routers find them.

Plain Redis types, one prefix (`kvroute:registry:`):

    {prefix}engine:{instance_id}   STRING  the engine's record (JSON below), with a TTL the engine
                                           refreshes (default: every 1 s, TTL 3 s); gone = lapsed
    {prefix}ids                    SET     instance ids that registered (routers drop lapsed ones)
    {prefix}events                 PUBSUB  {"type": "join" | "leave" | "role", "record": {...}}, so
                                           routers act at once instead of at their next poll

Record: {"instance_id", "url" (where routers reach it), "role", "model", "cluster_id", "epoch",
"state" ("ready" | "draining"), "ts", "expires", "signature"}. A draining engine deletes its key
and announces "leave" first thing, so routers stop sending to it before it refuses anything.

Anyone who can write to the registry's Redis could otherwise enlist an engine of their own and
be sent clients' prompts. With a fleet secret (`--kv-secret` / KVROUTE_KV_SECRET, the one that
signs KV transfers) an engine signs each record it writes: HMAC-SHA256 over ("registry", every
field but the signature), router/contract/kv_auth.py `sign`, valid until `expires` (the engine
rewrites it every refresh). A router with the secret believes only records that verify and have
not expired, announcements included (a forged "leave" would empty the fleet); it counts and
skips the rest. A router without a secret believes every record and says so once at start.
"""

from __future__ import annotations

import dataclasses
import time

import orjson

from router.contract.kv_auth import sign, verify

PREFIX = "kvroute:registry:"
IDS = PREFIX + "ids"
CHANNEL = PREFIX + "events"
EVENT_TYPES = ("join", "leave", "role")
SIGNED_FOR_S = 30.0  # how long a signed record stays valid after it was written (clocks within this)


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
    expires: float = 0.0  # unix time after which a signed record is void (0: unsigned)
    signature: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    def signed_fields(self) -> list:
        return [self.instance_id, self.url, self.role, self.model, self.cluster_id, self.epoch, self.state,
                self.ts, self.expires]

    def signed(self, secret: str | None) -> "EngineRecord":
        """This record signed with the fleet secret (unchanged without one)."""
        if not secret:
            return self
        record = dataclasses.replace(self, expires=round(self.ts + SIGNED_FOR_S, 3))
        return dataclasses.replace(record, signature=sign(secret, "registry", record.signed_fields()))

    def refusal(self, secret: str | None, now: float) -> str | None:
        """Why a router holding `secret` must not believe this record (None: it may)."""
        if not secret:
            return None
        if self.signature is None:
            return "unsigned"
        if not verify(secret, "registry", self.signed_fields(), self.signature):
            return "bad_signature"
        if self.expires < now:
            return "expired"
        return None

    @classmethod
    def from_json(cls, raw: bytes | str) -> "EngineRecord":
        try:
            d = orjson.loads(raw)
            url = str(d["url"])
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"url must be http(s), got {url!r}")
            signature = d.get("signature")
            return cls(instance_id=str(d["instance_id"]), url=url.rstrip("/"), role=str(d.get("role", "both")),
                       model=str(d.get("model", "")), cluster_id=str(d.get("cluster_id", "")),
                       epoch=int(d.get("epoch", 0)), state=str(d.get("state", "ready")), ts=float(d.get("ts", 0.0)),
                       expires=float(d.get("expires", 0.0)), signature=None if signature is None else str(signature))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed registry record: {e}") from None


def announcement(kind: str, record: EngineRecord) -> bytes:
    return orjson.dumps({"type": kind, "record": dataclasses.asdict(record)})
