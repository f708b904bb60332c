"""Body fields that steer engine internals: only the router's own code may set them.

`kv_transfer_params` tells an engine to pin K/V for a pull, or to connect to a peer and
write what it receives into its cache (docs/architecture.md#transfer-grant-and-handle,
#trust-rules). A client that could set it could make an engine open connections of its
choosing (SSRF) or poison a cache other tenants read, so the router drops these fields
from every client body before anything else looks at it; its disaggregation path adds
signed ones itself.
`kvroute_prompt_token_ids` is the router's own tokenization of a chat, forwarded to
kvroute engines with the same tokenizer (`with_token_ids`) so they do not tokenize again.

The router writes a body again on its way (token ids, a grant or a handle added), so a body it
could not write is refused before anything is charged for it: orjson reads JSON nested up to
1024 levels but writes at most 254, and an unused field nested in between would otherwise fail
after the request was routed (`forwardable`).
"""

from __future__ import annotations

import orjson

from kvroute.router.contract.errors import BadRequest
from kvroute.router.contract.openai_request import FORWARDED_IDS

ENGINE_ONLY_FIELDS = ("kv_transfer_params", FORWARDED_IDS)
SHALLOW = 200  # a body with fewer brackets than this cannot be nested too deep to write: not tried


def forwardable(body: dict, raw: bytes) -> tuple[dict, bytes]:
    """`body` without engine-only fields, and the bytes to forward (the original when unchanged);
    BadRequest for a body the router could not write again (one level to spare, for what it adds)."""
    if raw.count(b"[") + raw.count(b"{") >= SHALLOW:
        try:
            orjson.dumps([body])
        except orjson.JSONEncodeError as e:
            raise BadRequest(f"request body cannot be forwarded: {e} (nested too deep)") from None
    return strip_engine_fields(body, raw)


def strip_engine_fields(body: dict, raw: bytes) -> tuple[dict, bytes]:
    """`body` without engine-only fields, and the bytes to forward (the original when unchanged)."""
    if body.keys().isdisjoint(ENGINE_ONLY_FIELDS):
        return body, raw
    clean = {k: v for k, v in body.items() if k not in ENGINE_ONLY_FIELDS}
    return clean, orjson.dumps(clean)


def with_token_ids(body: dict, kind: str, ids) -> bytes:
    """The body to forward to an engine that tokenizes exactly as the router: the prompt as token
    ids (completions), or the messages with `kvroute_prompt_token_ids` (chat)."""
    if kind == "chat":
        return orjson.dumps({**body, FORWARDED_IDS: ids})
    return orjson.dumps({**body, "prompt": ids})
