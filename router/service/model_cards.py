"""The router's own answers to GET /v1/models and GET /v1/models/{id}: the fleet's models, not one
engine's. The proxy (router/service/app.py) and the endpoint picker (router/service/ext_proc/) both
answer them from here."""

from __future__ import annotations

import time

from kvroute.router.fleet.cluster import Cluster
from kvroute.router.service.routing import Router

MODELS_PATH = "/v1/models"


def model_card(model: str) -> dict:
    return {"id": model, "object": "model", "created": int(time.time()), "owned_by": "kvroute"}


def models_list(cluster: Cluster) -> dict:
    return {"object": "list", "data": [model_card(m) for m in cluster.models()]}


def one_model(router: Router, requested: str) -> dict:
    """The model's card, or NotFound (404 model_not_found) naming the served models."""
    return model_card(router.resolve_model(requested))
