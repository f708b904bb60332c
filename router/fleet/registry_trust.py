"""Which fleet registry records a router believes (router/contract/registry_record.py).

A record must stand on its own first (`EngineRecord.refusal`): with the fleet secret, signed with
it and not expired; with or without, not dated more than MAX_CLOCK_SKEW_S ahead of this router's
clock. Then against what came before it: the router keeps, per instance, the newest record it
believed by (epoch, ts) (the engine's epoch is new at each start, its ts grows with each refresh)
and refuses an older one, so a record replayed from an engine's earlier life (the "leave" it
announced before it restarted, or its old "join") changes nothing. An announcement is also
refused when it repeats that instance's last believed announcement (same nonce), and, with the
secret, when its type disagrees with its signed record: a "leave" needs a record that says
"left" (the type is not signed, so the live record copied into a "leave" would otherwise drop
the engine).

An instance's newest record is kept while it can matter: any record older than one believed
SIGNED_FOR_S + MAX_CLOCK_SKEW_S ago has expired by now, so an instance not heard of for that long
is forgotten (`forget_old`), and what is kept is bounded by the instances that really registered.
"""

from __future__ import annotations

from kvroute.router.contract.registry_record import LEFT, MAX_CLOCK_SKEW_S, SIGNED_FOR_S, EngineRecord


class RegistryTrust:
    def __init__(self, secret: str | None) -> None:
        self.secret = secret
        self.newest: dict[str, tuple[int, float]] = {}  # instance id -> (epoch, ts) of the newest record believed
        self.announced: dict[str, str] = {}  # instance id -> nonce of its last announcement believed

    def refusal(self, record: EngineRecord, now: float, kind: str | None = None) -> str | None:
        """Why not to believe `record` at unix time `now` ("unsigned", "bad_signature", "expired",
        "future"; "stale", "replayed", "kind_mismatch"), or None: believed, and
        now the newest of its instance. `kind`: the announcement's type ("join", "leave", "role"),
        None for a record read from its key."""
        reason = record.refusal(self.secret, now) or self._order(record, kind)
        if reason is None:
            self.newest[record.instance_id] = (record.epoch, record.ts)
            if kind is not None:
                self.announced[record.instance_id] = record.nonce
        return reason

    def _order(self, record: EngineRecord, kind: str | None) -> str | None:
        if kind is not None and self.secret and (kind == "leave") != (record.state == LEFT):
            return "kind_mismatch"
        newest = self.newest.get(record.instance_id)
        if newest is not None and (record.epoch, record.ts) < newest:
            return "stale"
        if kind is not None and self.announced.get(record.instance_id) == record.nonce:
            return "replayed"
        return None

    def forget_old(self, now: float) -> None:
        """Drop what no record still valid could be compared with (module docstring)."""
        horizon = now - SIGNED_FOR_S - MAX_CLOCK_SKEW_S
        for instance_id in [i for i, (_, ts) in self.newest.items() if ts < horizon]:
            del self.newest[instance_id]
            self.announced.pop(instance_id, None)
