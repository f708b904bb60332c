"""What the endpoint picker answers itself, as the proxy does: requests the proxy does not send to an
engine never reach one through the gateway either.

The proxy sends an engine only POST /v1/completions and POST /v1/chat/completions; it answers
GET /v1/models (the fleet's models) itself, and anything else with 404 (405 for a method a route
does not take). The picker answers the same as Envoy immediate responses.
"""

from __future__ import annotations

from urllib.parse import unquote

import orjson

from kvroute.router.contract.errors import KVRouteError, NotFound
from kvroute.router.service.entry import ROUTED
from kvroute.router.service.ext_proc import messages as msg
from kvroute.router.service.model_cards import MODELS_PATH, models_list, one_model
from kvroute.router.service.picker import Picker


def not_allowed(allow: str) -> msg.ProcessingResponse:
    """405 with Allow, as the proxy answers a method its route does not take."""
    return msg.refusal(KVRouteError("Method Not Allowed", code="method_not_allowed"), 405, (("allow", allow),))


def answer(method: str, path: str, picker: Picker) -> msg.ProcessingResponse:
    """The immediate answer to a request for `path` (not one of ROUTED); NotFound for a path the proxy
    does not serve, or an unknown model."""
    if path == MODELS_PATH or path.startswith(MODELS_PATH + "/"):
        if method not in ("GET", "HEAD"):
            return not_allowed("GET")
        model = unquote(path[len(MODELS_PATH) + 1:])
        body = one_model(picker.path.router, model) if model else models_list(picker.cluster)
        return msg.immediate(200, orjson.dumps(body), [], "kvroute_models")
    raise NotFound(f"no route {path[:200]!r} through the endpoint picker: it sends engines POST "
                   f"{' and '.join(ROUTED)} only, and answers GET {MODELS_PATH} itself")
