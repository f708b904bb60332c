"""The fleet registry in Redis: how engines announce themselves and routers find them.

Plain Redis types, one prefix (`kvroute:registry:`):

    {prefix}engine:{instance_id}   STRING  the engine's record (JSON below), with a TTL the engine
                                           refreshes (default: every 1 s, TTL 3 s); gone = lapsed
    {prefix}ids                    SET     instance ids that registered (routers drop lapsed ones)
    {prefix}events                 PUBSUB  {"type": "join" | "leave" | "role", "record": {...}}, so
                                           routers act at once instead of at their next poll

Record: {"instance_id", "url" (where routers reach it), "role", "model", "cluster_id", "epoch"
(the engine's, new at each start: router/contract/protocol.py new_epoch), "state" ("ready" |
"draining" | "left"), "ts", "expires", "nonce" (random, new in every record), "signature"}. A
draining engine deletes its key and announces "leave" first thing, with a record whose state is
"left", so routers stop sending to it before it refuses anything.

Anyone who can write to the registry's Redis could otherwise enlist an engine of their own and
be sent clients' prompts. With a fleet secret (`--kv-secret` / KVROUTE_KV_SECRET, the one that
signs KV transfers) an engine signs each record it writes: HMAC-SHA256 over ("registry", every
field but the signature), router/contract/kv_auth.py `sign`, valid until `expires` (the engine
rewrites it every refresh). A router with the secret believes only records that verify and have
not expired, announcements included (a forged "leave" would empty the fleet), and a "leave" only
with a record that says "left" (the announcement's type is not signed: the live record copied
into a "leave" must not drop the engine); it counts and skips the rest. A router without a secret
believes every record's signature and says so once at start.

Either way a record dated more than MAX_CLOCK_SKEW_S ahead of the router's clock is refused, and
so is one older than the newest it believed of the same instance, by (epoch, ts): a record
replayed from an engine's earlier life (its "leave" after it restarted) changes nothing
(router/fleet/registry_trust.py keeps the newest per instance).
"""

from __future__ import annotations

import dataclasses
import secrets
import time

import orjson

from kvroute.router.contract.kv_auth import sign, verify

PREFIX = "kvroute:registry:"
IDS = PREFIX + "ids"
CHANNEL = PREFIX + "events"
EVENT_TYPES = ("join", "leave", "role")
SIGNED_FOR_S = 30.0  # how long a signed record stays valid after it was written (clocks within this)
MAX_CLOCK_SKEW_S = 5.0  # a record dated further ahead of the router's clock is refused
LEFT = "left"  # the state of the record a "leave" announces
MAX_NONCE_CHARS = 64


def engine_key(instance_id: str) -> str:
    return PREFIX + "engine:" + instance_id


def new_nonce() -> str:
    return secrets.token_hex(8)


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
    nonce: str = dataclasses.field(default_factory=new_nonce)  # tells two records of one instant apart
    signature: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    def signed_fields(self) -> list:
        return [self.instance_id, self.url, self.role, self.model, self.cluster_id, self.epoch, self.state,
                self.ts, self.expires, self.nonce]

    def signed(self, secret: str | None) -> EngineRecord:
        """This record signed with the fleet secret (unchanged without one)."""
        if not secret:
            return self
        record = dataclasses.replace(self, expires=round(self.ts + SIGNED_FOR_S, 3))
        return dataclasses.replace(record, signature=sign(secret, "registry", record.signed_fields()))

    def refusal(self, secret: str | None, now: float) -> str | None:
        """Why a router holding `secret` (or none) must not believe this record on its own, at unix
        time `now` (None: it may); whether it is the newest is router/fleet/registry_trust.py's."""
        if secret:
            if self.signature is None:
                return "unsigned"
            if not verify(secret, "registry", self.signed_fields(), self.signature):
                return "bad_signature"
            if self.expires < now:
                return "expired"
        if self.ts > now + MAX_CLOCK_SKEW_S:
            return "future"
        return None

    def valid_at(self, now: float) -> bool:
        """A signed record has not expired at unix time `now` (an unsigned one never does)."""
        return not self.expires or self.expires >= now

    @classmethod
    def from_json(cls, raw: bytes | str) -> EngineRecord:
        try:
            d = orjson.loads(raw)
            url = str(d["url"])
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"url must be http(s), got {url!r}")
            signature, nonce = d.get("signature"), str(d.get("nonce", ""))
            if len(nonce) > MAX_NONCE_CHARS:
                raise ValueError(f"nonce longer than {MAX_NONCE_CHARS} characters")
            return cls(instance_id=str(d["instance_id"]), url=url.rstrip("/"), role=str(d.get("role", "both")),
                       model=str(d.get("model", "")), cluster_id=str(d.get("cluster_id", "")),
                       epoch=int(d.get("epoch", 0)), state=str(d.get("state", "ready")), ts=float(d.get("ts", 0.0)),
                       expires=float(d.get("expires", 0.0)), nonce=nonce,
                       signature=None if signature is None else str(signature))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed registry record: {e}") from None


def announcement(kind: str, record: EngineRecord) -> bytes:
    return orjson.dumps({"type": kind, "record": dataclasses.asdict(record)})
