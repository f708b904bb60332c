"""The router application's shared objects, by key: what the handlers of app.py and admin.py read."""

from __future__ import annotations

from aiohttp import web

from kvroute.router.fleet.cluster import Cluster
from kvroute.router.kvevents.follower import ZmqFollower
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.disagg import Disaggregation
from kvroute.router.service.entry import Entry
from kvroute.router.service.fleet_admission import SharedAdmission
from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.open_routes import OpenRoutes
from kvroute.router.service.picker import Picker
from kvroute.router.service.proxy import Proxy
from kvroute.router.service.request_path import RequestPath
from kvroute.router.service.routing import Router
from kvroute.router.service.tenant_book import TenantBook

CONFIG = web.AppKey("config", RouterConfig)
CLUSTER = web.AppKey("cluster", Cluster)
ROUTER = web.AppKey("router", Router)
PROXY = web.AppKey("proxy", Proxy)
DISAGG = web.AppKey("disagg", Disaggregation)
ENTRY = web.AppKey("entry", Entry)
PATH = web.AppKey("path", RequestPath)
PICKER = web.AppKey("picker", Picker)
ROUTES = web.AppKey("routes", OpenRoutes)
EXT_PROC_PORT = web.AppKey("ext_proc_port", int)  # the endpoint picker's gRPC port, as bound (--ext-proc-port)
METRICS = web.AppKey("metrics", RouterMetrics)
ZMQ = web.AppKey("zmq", ZmqFollower)
GATE = web.AppKey("gate", AdmissionGate)
TENANTS = web.AppKey("tenants", TenantBook)
# None without --redis (admission per process)
SHARED: web.AppKey[SharedAdmission | None] = web.AppKey("shared_admission")
