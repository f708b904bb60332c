"""Where each engine publishes its KV events: `--kv-event-source URL=ENDPOINT[,ENDPOINT...]`.

The spelling is vllm-router's: `URL` is the engine's base URL as given to `--engine`,
`ENDPOINT` the ZeroMQ address of its PUB socket (several for data-parallel ranks that
share one URL, each its own publisher with its own sequence numbers).
`--kv-event-replay-source URL=ENDPOINT[,...]` names the replay sockets, in the same order.
The router always connects (the engine binds), so an endpoint is an address to reach,
never a wildcard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from kvroute.router.contract.kv_wire import SCHEMES


@dataclasses.dataclass(frozen=True, slots=True)
class EventSource:
    endpoint: str
    replay_endpoint: str | None = None


def _split(items: Iterable[str], flag: str, engines: Iterable[str]) -> dict[str, tuple[str, ...]]:
    known = {e.rstrip("/") for e in engines}
    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        url, sep, endpoints = item.rpartition("=")
        url = url.rstrip("/")
        if not sep or not url or not endpoints:
            raise ValueError(f"{flag} takes URL=ENDPOINT[,ENDPOINT...], got {item!r}")
        if url not in known:
            raise ValueError(f"{flag} {item!r}: {url} is not one of the --engine URLs")
        if url in out:
            raise ValueError(f"{flag} is given twice for {url}")
        out[url] = tuple(_endpoint(e.strip(), flag) for e in endpoints.split(","))
    return out


def _endpoint(endpoint: str, flag: str) -> str:
    if not endpoint.startswith(SCHEMES):
        raise ValueError(f"{flag}: {endpoint!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH)")
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: {endpoint!r} needs a host and a port, e.g. tcp://10.0.0.5:5557")
        if host in ("*", "0.0.0.0", "[::]"):
            raise ValueError(f"{flag}: the router connects to the engine's publisher, so {endpoint!r} must name "
                             f"the engine's address (e.g. tcp://10.0.0.5:{port}), not a wildcard")
    return endpoint


def parse_sources(sources: Iterable[str], replays: Iterable[str],
                  engines: Iterable[str]) -> Mapping[str, tuple[EventSource, ...]]:
    """Engine URL -> its event sources; raises ValueError with a sentence on bad flags."""
    engines = tuple(engines)
    events = _split(sources, "--kv-event-source", engines)
    replay = _split(replays, "--kv-event-replay-source", engines)
    for url, endpoints in replay.items():
        if url not in events:
            raise ValueError(f"--kv-event-replay-source for {url} needs a --kv-event-source for it too")
        if len(endpoints) != len(events[url]):
            raise ValueError(f"{url} has {len(events[url])} event endpoint(s) but {len(endpoints)} replay endpoint(s)")
    return {url: tuple(EventSource(e, r) for e, r in zip(eps, replay.get(url, (None,) * len(eps))))
            for url, eps in events.items()}
