"""Body fields that steer engine internals: only the router's own code may set them.

`kv_transfer_params` tells an engine to pin K/V for a pull, or to connect to a peer and
write what it receives into its cache (DESIGN.md sections 5 and 10). A client that could
set it could make an engine open connections of its choosing (SSRF) or poison a cache
other tenants read, so the router drops these fields from every client body before
anything else looks at it; its disaggregation path adds signed ones itself.
"""

from __future__ import annotations

import orjson

ENGINE_ONLY_FIELDS = ("kv_transfer_params",)


def strip_engine_fields(body: dict, raw: bytes) -> tuple[dict, bytes]:
    """`body` without engine-only fields, and the bytes to forward (the original when unchanged)."""
    if not any(name in body for name in ENGINE_ONLY_FIELDS):
        return body, raw
    clean = {k: v for k, v in body.items() if k not in ENGINE_ONLY_FIELDS}
    return clean, orjson.dumps(clean)
