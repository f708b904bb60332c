"""Who a request is: its tenant, from its API key, a trusted gateway's header, or the default.

The tenant file (`--tenants FILE`, JSON or TOML, format in docs/admission.md) names tenants
with their weight, SLO, limits and API keys; `--api-key NAME=KEY` adds keys on the command
line (a plain `--api-key KEY` is the default tenant's). `reload()` rereads the file (SIGHUP,
POST /admin/tenants/reload); a file that does not parse leaves the book as it was.

With keys, the key decides the tenant: `--tenant-header` beside keys would let any key holder
name another tenant (and its limits), so the two together are refused unless
`--trust-tenant-header` says a gateway in front sets the header itself. The header only ever
selects among the tenants the file names; any other value is the `default` tenant, one bucket,
so header values cannot make new tenants (new fair-queue shares, new metric series).
"""

from __future__ import annotations

import hmac
import json
import logging
import pathlib
import tomllib
from collections.abc import Mapping

from aiohttp import web

from kvroute.router.decision.tenants import DEFAULT_TENANT, NAME, TenantSpec

log = logging.getLogger(__name__)

TENANT_KEY = web.RequestKey("tenant", str)  # the request's tenant by API key, as the auth middleware found it
FIELDS = {"weight", "slo_ttft_s", "rate", "burst", "max_concurrency", "keys", "allow_request_slo", "min_priority"}


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


def check_header(header: str | None, path: pathlib.Path | None, keyed: bool, trusted: bool) -> None:
    """ValueError unless `--tenant-header` can be believed: it selects among a file's tenants, and
    beside API keys only behind a gateway the operator trusts."""
    if header is None:
        return
    if path is None:
        raise ValueError("--tenant-header selects among the tenants of a tenant file: give --tenants FILE")
    if keyed and not trusted:
        raise ValueError("--tenant-header with API keys would let any key holder name another tenant (the key "
                         "decides the tenant); add --trust-tenant-header only if a gateway in front sets the "
                         "header and drops the clients' own")


class TenantBook:
    def __init__(self, path: str | None, cli_keys: tuple[tuple[str, str], ...] = (),
                 header: str | None = None, trust_header: bool = False) -> None:
        """ValueError when the file cannot be read or `header` cannot be believed (`check_header`)."""
        self.path = pathlib.Path(path) if path else None
        self.cli_keys = cli_keys
        self.header = header
        self.trust_header = trust_header
        self.tenants: dict[str, TenantSpec] = {}
        self.keys: dict[bytes, str] = {}
        self.reload()

    def reload(self) -> dict[str, TenantSpec]:
        """Reread the file (ValueError: the book is unchanged)."""
        try:
            text = self.path.read_text() if self.path else None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the tenant file {self.path}: {getattr(e, 'strerror', None) or e}") from None
        tenants = parse_tenants(text, self.path.suffix) if text is not None and self.path else {}
        keys = {f"Bearer {key}".encode(): name for name, key in self.cli_keys}
        for spec in tenants.values():
            keys.update({f"Bearer {key}".encode(): spec.name for key in spec.keys})
        check_header(self.header, self.path, bool(keys), self.trust_header)
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
        """The request's tenant: the gateway's header when configured and given (a tenant of the file,
        else `default`), else its key's, else `default`."""
        if self.header:
            value = headers.get(self.header)
            if value:
                return value if value in self.tenants else DEFAULT_TENANT
        return key_tenant or DEFAULT_TENANT
