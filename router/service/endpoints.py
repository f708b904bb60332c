"""Instances as a data plane names them: `ip:port` (Envoy's ORIGINAL_DST cluster connects to it as
given), and back.

An engine URL whose host is an IP address gives it as is; a host name is resolved once, to its first
address, and cached (a data plane connects to an address, not a name). In Kubernetes the engines
are the InferencePool's pods, registered by their pod IPs, so nothing is resolved there.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable


class Endpoints:
    """engine URL -> `ip:port`, cached; and the instances a data plane's list of endpoints names."""

    def __init__(self) -> None:
        self._by_url: dict[str, str] = {}

    def of(self, url: str) -> str:
        endpoint = self._by_url.get(url)
        if endpoint is None:
            endpoint = self._by_url[url] = _endpoint(url)
        return endpoint

    def among(self, instances: Iterable, allowed: Iterable[str]) -> set[str]:
        """The ids of `instances` whose endpoint is in `allowed` (a host alone allows all its ports)."""
        allowed = {a.strip() for a in allowed if a.strip()}
        ids = set()
        for inst in instances:
            endpoint = self.of(inst.url)
            if endpoint in allowed or endpoint.rpartition(":")[0].strip("[]") in allowed:
                ids.add(inst.id)
        return ids


def _endpoint(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
        except (OSError, IndexError):
            return f"{host}:{port}"  # unresolvable now: the name, which a data plane cannot use either
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def split_endpoints(value: str | Iterable[str]) -> list[str]:
    """A subset hint's endpoints: a comma-separated string or a list of them (both occur)."""
    items = [value] if isinstance(value, str) else list(value)
    return [e.strip() for item in items if isinstance(item, str) for e in item.split(",") if e.strip()]
