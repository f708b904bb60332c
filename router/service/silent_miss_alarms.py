"""Silent-miss alarms on live traffic (router/fleet/silent_miss.py), fed by the routing-loss samples.

Each whole request whose engine reported cached tokens is one piece of evidence for its instance
(router/service/routing_loss.py calls `observe`). An alarm raised or cleared is one log line, the
gauge below, and the instance's `silent_miss` in GET /router/instances (the alarm, its likely
cause, the share of tokens that disagreed, the samples). Instances the router already knows it
cannot reproduce (a mismatch at /kv/info, a stale feed) are credited nothing and not judged, and
neither is a request routed while the index was unavailable (it predicted nothing).

    kvroute_router_silent_miss{instance,cause}   1 while the alarm is raised
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge

from kvroute.router.decision.routing_loss import LossSample
from kvroute.router.fleet.instance import Instance
from kvroute.router.fleet.silent_miss import CAUSES, Evidence, SilentMiss

log = logging.getLogger(__name__)


class SilentMissAlarms:
    def __init__(self, instances: Callable[[], Iterable[Instance]], generation: Callable[[], int],
                 registry: CollectorRegistry | None = None, judge: SilentMiss | None = None) -> None:
        """`instances`: the fleet now; `generation`: its change counter (the id map is rebuilt on change)."""
        self.instances, self.generation = instances, generation
        self.judge = judge or SilentMiss()
        self._by_id: dict[str, Instance] = {}
        self._seen_generation = -1
        self._gauge = Gauge("kvroute_router_silent_miss", "1 while an instance's engine and the index disagree "
                            "about its cache (a silent miss), by likely cause.", ["instance", "cause"],
                            registry=registry or CollectorRegistry())

    def _instance(self, instance_id: str) -> Instance | None:
        if self._seen_generation != self.generation():
            self._by_id = {getattr(i, "id"): i for i in self.instances()}  # noqa: B009 (set through __dict__)
            self._seen_generation = self.generation()
        return self._by_id.get(instance_id)

    def observe(self, instance_id: str, sample: LossSample, trace) -> None:
        inst = self._instance(instance_id)
        if inst is None or inst.info is None or not inst.cache_ok or trace.index_blind:
            return  # a request routed without the index (unavailable) predicted nothing: no evidence of keys
        usage = trace.usage
        evidence = Evidence(served=sample.served, predicted=sample.predicted, prompt_tokens=sample.prompt_tokens,
                            engine_prompt_tokens=usage.prompt_tokens if usage is not None else None,
                            adapter=trace.model != inst.info.model)
        before = self.judge.alarms.get(instance_id)
        alarm, changed = self.judge.observe(instance_id, evidence, inst.info.block_size)
        inst.silent_miss = alarm.to_dict() if alarm is not None else None
        if before is not None and (alarm is None or alarm.cause != before.cause):
            self._gauge.labels(instance_id, before.cause).set(0)
        if alarm is not None:
            self._gauge.labels(instance_id, alarm.cause).set(1)
        if changed and alarm is not None:
            what = ("of the cached tokens its engine served were not predicted by the index"
                    if alarm.kind == "unpredicted" else "of the cached tokens the index predicted were not served")
            log.error("silent miss on %s: %.0f%% %s, over %d requests; likely cause: %s",
                      instance_id, alarm.share * 100, what, alarm.samples, CAUSES[alarm.cause])
        elif changed:
            log.warning("silent miss on %s cleared: the index and the engine agree again", instance_id)
