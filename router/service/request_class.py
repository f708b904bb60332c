"""A request's class for admission: its priority and its own SLO, from the body or headers.

`priority` is vLLM's field (an integer, lower is more urgent, default 0); the body's wins
over the `x-kvroute-priority` header. A tenant's requests are no more urgent than its
`min_priority` (tenant file, 0 by default): a more urgent priority is lowered to it, in the
forwarded body too, so engines that schedule by priority (vLLM `--scheduling-policy priority`)
see the value admission used; the header is the router's alone. `x-kvroute-slo-ttft-s` asks for
a tighter TTFT SLO than the tenant's, where the tenant file allows it (router/decision/tenants.py `TenantSpec.slo_for`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import orjson

from kvroute.router.contract.errors import BadRequest

PRIORITY_HEADER = "x-kvroute-priority"
SLO_HEADER = "x-kvroute-slo-ttft-s"
PRIORITY_LIMIT = 1 << 31
SLO_LIMIT_S = 3600.0


def priority_of(body: dict, headers: Mapping[str, str]) -> int:
    value = body.get("priority")
    if value is None:
        text = headers.get(PRIORITY_HEADER)
        if text is None:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise BadRequest(f"{PRIORITY_HEADER} must be an integer, got {text[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not -PRIORITY_LIMIT < value < PRIORITY_LIMIT:
        raise BadRequest(f"'priority' must be an integer (lower is more urgent), got {str(value)[:40]}",
                         param="priority")
    return value


def within_priority(body: dict, raw: bytes, floor: int) -> tuple[dict, bytes]:
    """The body to forward with its `priority` no more urgent than `floor` (the tenant's `min_priority`),
    so that engines scheduling by priority see the priority admission used; the original bytes when
    it already is."""
    value = body.get("priority")
    if not isinstance(value, int) or value >= floor:
        return body, raw
    clean = {**body, "priority": floor}
    return clean, orjson.dumps(clean)


def slo_of(headers: Mapping[str, str]) -> float | None:
    text = headers.get(SLO_HEADER)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= SLO_LIMIT_S:
        raise BadRequest(f"{SLO_HEADER} must be seconds in (0, {SLO_LIMIT_S:g}], got {text[:40]!r}")
    return value
