"""A router's fleet without engines: instances known and healthy, probed and polled by nobody."""

from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.index import MemoryIndex
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.metrics import RouterMetrics


def fleet(n: int = 2, roles: tuple[str, ...] = ("both",), **config) -> Cluster:
    """`n` instances e0..e(n-1) of model "m", roles taken in turn from `roles`; `config`: RouterConfig fields."""
    cluster = Cluster(RouterConfig(engines=tuple(f"http://127.0.0.1:{9000 + i}" for i in range(n)), **config),
                      MemoryIndex(), "fp", RouterMetrics())
    for i, inst in enumerate(cluster.instances):
        inst.info = EngineInfo(f"e{i}", "m", 16, 0, "fp", role=roles[i % len(roles)])
        inst.healthy = inst.reachable = True
    return cluster
