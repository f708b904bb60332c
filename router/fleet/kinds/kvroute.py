"""kvroute engines: GET /kv/info describes them, GET /load gives their load."""

from __future__ import annotations

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.fleet.kinds.http import EngineHTTP
from kvroute.router.fleet.upstream_errors import Incompatible


class KvrouteKind:
    name = "kvroute"
    has_kv_feed = True  # /kv/events, /kv/snapshot (and the Redis stream)
    key_rule = "seeded"  # adapter and salt in the chain's seed; no images (router/contract/block_keys.py)

    async def discover(self, http: EngineHTTP, inst, config) -> EngineInfo:
        try:
            return EngineInfo.from_dict(await http.json(inst.url + "/kv/info"))
        except ValueError as e:
            raise Incompatible(str(e)) from None

    async def load(self, http: EngineHTTP, inst) -> LoadRecord:
        return LoadRecord.from_dict(await http.json(inst.url + "/load"))
