"""Who a request is: its tenant, from its API key, a trusted gateway's header, or the default.

The tenant file (`--tenants FILE`, JSON or TOML, format in docs/admission.md) names tenants
with their weight, SLO, limits and API keys; `--api-key NAME=KEY` adds keys on the command
line (a plain `--api-key KEY` is the default tenant's). `reload()` rereads the file (SIGHUP,
POST /admin/tenants/reload); a file that does not parse leaves the book as it was.
"""

from __future__ import annotations

import hmac
import json
import logging
import pathlib
import tomllib
from typing import Mapping

from aiohttp import web

from router.decision.tenants import DEFAULT_TENANT, NAME, TenantSpec

log = logging.getLogger(__name__)

TENANT_KEY = web.RequestKey("tenant", str)  # the request's tenant by API key, as the auth middleware found it
FIELDS = {"weight", "slo_ttft_s", "rate", "burst", "max_concurrency", "keys"}


def split_keys(values: list[str] | tuple[str, ...]) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """`--api-key` values: (the first plain key, every (tenant, key)). NAME=KEY names a tenant when
    NAME is a tenant name and KEY does not start with '=' (a key ending in base64 padding is plain)."""
    plain, named = None, []
    for value in values:
        name, sep, key = value.partition("=")
        if sep and key and not key.startswith("=") and NAME.match(name):
            named.append((name, key))
        else:
            plain = plain or value
            named.append((DEFAULT_TENANT, value))
    return plain, tuple(named)


def parse_tenants(text: str, suffix: str) -> dict[str, TenantSpec]:
    """The tenants of a file's text (TOML when `suffix` is .toml, else JSON); ValueError says why not."""
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"the tenant file does not parse: {e}") from None
    tenants = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(tenants, dict):
        raise ValueError('the tenant file needs a "tenants" table: {"tenants": {"NAME": {"weight": 1}}}')
    out = {}
    for name, fields in tenants.items():
        if not isinstance(fields, dict) or set(fields) - FIELDS:
            extra = sorted(set(fields) - FIELDS) if isinstance(fields, dict) else fields
            raise ValueError(f"tenant {name!r}: unknown fields {extra}; known: {', '.join(sorted(FIELDS))}")
        try:
            out[name] = TenantSpec(name=name, **{**fields, "keys": tuple(fields.get("keys", ()))})
        except TypeError as e:
            raise ValueError(f"tenant {name!r}: {e}") from None
    return out


class TenantBook:
    def __init__(self, path: str | None, cli_keys: tuple[tuple[str, str], ...] = (),
                 header: str | None = None) -> None:
        self.path = pathlib.Path(path) if path else None
        self.cli_keys = cli_keys
        self.header = header
        self.tenants: dict[str, TenantSpec] = {}
        self.keys: dict[bytes, str] = {}
        self.reload()

    def reload(self) -> dict[str, TenantSpec]:
        """Reread the file (ValueError: the book is unchanged)."""
        try:
            text = self.path.read_text() if self.path else None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the tenant file {self.path}: {getattr(e, 'strerror', None) or e}") from None
        tenants = parse_tenants(text, self.path.suffix) if text is not None else {}
        keys = {f"Bearer {key}".encode(): name for name, key in self.cli_keys}
        for spec in tenants.values():
            keys.update({f"Bearer {key}".encode(): spec.name for key in spec.keys})
        self.tenants, self.keys = tenants, keys
        return tenants

    @property
    def has_keys(self) -> bool:
        return bool(self.keys)

    def tenant_of_key(self, authorization: str) -> str | None:
        """The tenant whose key this Authorization header carries (compared in constant time per key)."""
        given, found = authorization.encode(), None
        for key, name in self.keys.items():
            if hmac.compare_digest(given, key):
                found = name
        return found

    def tenant_of(self, headers: Mapping[str, str], key_tenant: str | None) -> str:
        """The request's tenant: the gateway's header when configured and given, else its key's."""
        if self.header:
            value = headers.get(self.header)
            if value:
                return value if NAME.match(value) else DEFAULT_TENANT
        return key_tenant or DEFAULT_TENANT
