"""Who may steer an engine's K/V: signed grants and handles, or configured peers.

Disaggregation moves K/V between engines on the word of `kv_transfer_params`. Clients
never get to say it (the router strips the field, router/service/steering.py), and an engine
acts on it only when it can verify where it came from (docs/architecture.md#trust-rules):

  grant    router -> prefill engine: "pin this prompt's K/V for a pull, and name yourself
           `address` in the handle". Signed by the router over
           ("grant", instance, address, expires, nonce); used once (nonce), for its instance.
  handle   prefill engine -> decode engine (through the router, unchanged): "pull these
           blocks from `address`". Signed by the prefill engine over
           ("handle", cluster_id, address, request_id, block_hashes, num_tokens,
           first_token, cached_tokens, expires).
  pull     decode -> prefill `POST /kv/transfer`: carries the handle's signature, which
           the prefill engine compares with the one it issued for that request.

Signatures are HMAC-SHA256 (hex) with the fleet's shared secret (`--kv-secret`, or the
environment variable KVROUTE_KV_SECRET), over the JSON array of the purpose and fields
(orjson: no spaces, integers as decimal). Without a secret an engine accepts only
peers named in `--kv-peers` (host names or IP addresses, matched literally): a handle
whose address's host is a peer, a grant or pull from a peer's IP address. Anything else
is refused with 403 (router/contract/errors.py `Forbidden`) before the engine pins, connects or
writes anything.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

import orjson

SECRET_ENV = "KVROUTE_KV_SECRET"
GRANT_TTL_S = 60.0
_MAX_NONCES = 100_000


def secret_from(value: str | None) -> str | None:
    """The configured secret: the flag's value, else the environment's, else None."""
    return value or os.environ.get(SECRET_ENV) or None


def sign(secret: str, purpose: str, fields: Sequence) -> str:
    message = orjson.dumps([purpose, *fields])
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(secret: str | None, purpose: str, fields: Sequence, signature: object) -> bool:
    if not secret or not isinstance(signature, str):
        return False
    try:
        expected = sign(secret, purpose, fields)
    except TypeError:  # a field no signer could have written (an integer past 64 bits): forged
        return False
    return hmac.compare_digest(expected, signature)


def url_host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def make_grant(secret: str | None, instance: str, address: str, ttl_s: float = GRANT_TTL_S) -> dict:
    """The router's do_remote_decode params for `instance` at `address` (unsigned without a secret)."""
    grant = {"instance": instance, "address": address, "expires": round(time.time() + ttl_s, 3),
             "nonce": secrets.token_hex(12)}
    if secret:
        grant["signature"] = sign(secret, "grant", _grant_fields(grant))
    return {"do_remote_decode": True, "grant": grant}


def _grant_fields(grant: dict) -> list:
    return [grant.get("instance"), grant.get("address"), grant.get("expires"), grant.get("nonce")]


class KVAuth:
    """An engine's checks of grants, handles and pulls (see the module docstring)."""

    def __init__(self, secret: str | None, peers: Iterable[str], instance: str) -> None:
        self.secret = secret
        self.peers = frozenset(p for p in peers if p)
        self.instance = instance
        self._nonces: collections.OrderedDict[str, float] = collections.OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.peers)

    def check_grant(self, grant: object, remote: str | None) -> str | None:
        """The address to put in the handle if this grant may be acted on; else a reason (raise)."""
        if not isinstance(grant, dict):
            grant = {}
        if self.secret:
            if not verify(self.secret, "grant", _grant_fields(grant), grant.get("signature")):
                raise PermissionError("kv_transfer_params.do_remote_decode needs a grant signed with the "
                                      "fleet's --kv-secret; clients may not set kv_transfer_params")
            if grant.get("instance") != self.instance:
                raise PermissionError(f"the grant is for instance {grant.get('instance')!r}, not this one")
            self._check_fresh(grant)
            return str(grant.get("address") or "")
        if remote in self.peers:
            return str(grant.get("address") or "")
        raise PermissionError("kv_transfer_params.do_remote_decode is accepted only from a configured "
                              "--kv-peers address or with a grant signed with --kv-secret")

    def _check_fresh(self, grant: dict) -> None:
        expires, nonce, now = grant.get("expires"), str(grant.get("nonce")), time.time()
        if not isinstance(expires, (int, float)) or expires < now:
            raise PermissionError("the grant has expired")
        if nonce in self._nonces:
            raise PermissionError("the grant was already used")
        self._nonces[nonce] = expires
        while self._nonces and (len(self._nonces) > _MAX_NONCES or next(iter(self._nonces.values())) < now):
            self._nonces.popitem(last=False)

    def sign_handle(self, fields: Sequence) -> str | None:
        return sign(self.secret, "handle", fields) if self.secret else None

    def check_handle(self, fields: Sequence, address: str, expires: float, signature: str | None) -> None:
        """Raise PermissionError unless a decode engine may pull from this handle's address."""
        if self.secret and verify(self.secret, "handle", fields, signature):
            if expires < time.time():
                raise PermissionError("the transfer handle has expired")
            return
        if url_host(address) in self.peers:
            return
        raise PermissionError("the transfer handle is neither signed with this fleet's --kv-secret nor from "
                              "a configured --kv-peers host; clients may not set kv_transfer_params")

    def check_pull(self, issued: str | None, presented: object, remote: str | None) -> None:
        """A pull of pinned K/V: the handle's signature as issued, or a peer's address."""
        if issued and isinstance(presented, str) and hmac.compare_digest(issued, presented):
            return
        if remote in self.peers:
            return
        raise PermissionError("POST /kv/transfer needs the transfer handle's signature "
                              "(or a configured --kv-peers address)")
