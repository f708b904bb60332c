"""kvroute_router_zmq_* metrics, read from the feeds' own counters when Prometheus scrapes.

Counters are collected from each feed's `SourceStats` and `BlockMap.counts` (one place
counts; nothing is counted twice), labelled by instance. Unknown media are counted under
one label value; their names are listed in /router/instances, never used as labels (a
publisher could otherwise grow the label set without bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvroute.router.kvevents.subscriber import SourceStats
from kvroute.router.kvevents.translate import BlockMap

LAG_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 5.0)
SOURCE_COUNTERS = {
    "batches": "Event batches applied.",
    "events": "Events decoded.",
    "gaps": "Sequence gaps seen.",
    "replays": "Replay requests sent after a gap.",
    "replay_failures": "Gaps a replay could not cover.",
    "rebuilds": "Times an instance was cleared and rebuilt from new events (gap not covered, restart).",
    "malformed_frames": "Messages skipped: not [topic, seq, payload].",
    "malformed_payloads": "Batches skipped: payload not a KV event batch.",
    "skipped_events": "Malformed events skipped inside otherwise valid batches.",
    "failed_batches": "Decoded batches whose events could not be applied (skipped; the feed goes on).",
}


class CountedFeed(Protocol):
    """One instance's feed, as its counters are read (router/kvevents/follower.py)."""

    block_map: BlockMap
    restarts: int  # times its supervisor restarted it
    stale: str | None  # why it is down, or None

    @property
    def instance_id(self) -> str: ...

    def source_stats(self) -> list[SourceStats]: ...


class ZmqMetrics:
    def __init__(self, registry: CollectorRegistry, feeds: Sequence[CountedFeed]) -> None:
        """`feeds`: the live list of feeds (it grows and shrinks as instances join and leave)."""
        self.feeds = feeds
        self.lag = Histogram("kvroute_router_zmq_event_lag_seconds",
                             "From a batch's publish timestamp to its events applied to the index.",
                             buckets=LAG_BUCKETS, registry=registry)
        registry.register(self)

    def describe(self) -> Iterable:
        return []  # collected lazily: the feeds appear after startup

    def collect(self) -> Iterable:
        families = {name: CounterMetricFamily(f"kvroute_router_zmq_{name}", doc, labels=["instance"])
                    for name, doc in SOURCE_COUNTERS.items()}
        blocks = CounterMetricFamily("kvroute_router_zmq_blocks", "Engine blocks seen in events, by outcome.",
                                     labels=["instance", "outcome"])
        mapped = GaugeMetricFamily("kvroute_router_zmq_engine_blocks", "Engine blocks in the hash map.",
                                   labels=["instance"])
        restarts = CounterMetricFamily("kvroute_router_zmq_feed_restarts",
                                       "Feeds restarted by their supervisor after dying or stalling.",
                                       labels=["instance"])
        stale = GaugeMetricFamily("kvroute_router_zmq_feed_stale",
                                  "1 while the instance's feed is down (routed on load alone).", labels=["instance"])
        for feed in self.feeds:
            inst = feed.instance_id
            stats = feed.source_stats()
            for name, family in families.items():
                family.add_metric([inst], sum(getattr(s, name) for s in stats))
            for outcome, count in feed.block_map.counts.items():
                blocks.add_metric([inst, outcome], count)
            mapped.add_metric([inst], len(feed.block_map))
            restarts.add_metric([inst], feed.restarts)
            stale.add_metric([inst], 1 if feed.stale else 0)
        yield from families.values()
        yield from (blocks, mapped, restarts, stale)
