"""router/contract/kv_auth.py on its own: signatures, grants (fresh, for this instance, used once),
handles (signed and unexpired, or from a peer) and pulls; and an engine refusing an expired handle
before it connects anywhere."""

from __future__ import annotations

import hashlib
import hmac
import time

import orjson
import pytest

from kvroute.router.contract import kv_auth
from kvroute.router.contract.kv_auth import KVAuth, make_grant, secret_from, sign, url_host, verify
from tests.support.kv_transfer_fakes import SECRET, Listener, forged_handle, ids, post, sign_handle

FIELDS = ["c", "http://10.0.0.1:8001", "r1", [1, 2, 3], 48, 7, 0, 4e9]


def handle_fields(expires: float) -> list:
    return [*FIELDS[:-1], expires]


def test_signatures_verify_only_with_the_same_secret_purpose_and_fields():
    sig = sign(SECRET, "handle", FIELDS)
    assert len(sig) == 64 and int(sig, 16) >= 0
    assert verify(SECRET, "handle", FIELDS, sig)
    assert not verify("other", "handle", FIELDS, sig)
    assert not verify(SECRET, "grant", FIELDS, sig)
    assert not verify(SECRET, "handle", [*FIELDS[:-1], 4e9 + 1], sig)
    assert not verify(None, "handle", FIELDS, sig) and not verify("", "handle", FIELDS, sig)
    assert not verify(SECRET, "handle", FIELDS, None) and not verify(SECRET, "handle", FIELDS, 12)
    assert not verify(SECRET, "handle", [1 << 70], "0" * 64)  # no signer can write that field


def test_secret_comes_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.delenv(kv_auth.SECRET_ENV, raising=False)
    assert secret_from(None) is None and secret_from("") is None
    monkeypatch.setenv(kv_auth.SECRET_ENV, "env-secret")
    assert secret_from(None) == "env-secret"
    assert secret_from("flag") == "flag"
    monkeypatch.setenv(kv_auth.SECRET_ENV, "")
    assert secret_from(None) is None


def test_url_host():
    assert url_host("http://10.0.0.1:8001/x") == "10.0.0.1"
    assert url_host("no scheme") == ""
    assert url_host("http://[::1") == ""  # unparsable


def test_grant_is_signed_for_an_instance_fresh_and_used_once():
    before = time.time()
    params = make_grant(SECRET, "p0", "http://p0:8001")
    grant = params["grant"]
    assert params["do_remote_decode"] is True
    assert before + kv_auth.GRANT_TTL_S - 1 <= grant["expires"] <= time.time() + kv_auth.GRANT_TTL_S + 1
    assert len(grant["nonce"]) == 24
    auth = KVAuth(SECRET, (), "p0")
    assert auth.enabled
    assert auth.check_grant(grant, None) == "http://p0:8001"
    with pytest.raises(PermissionError, match="already used"):
        auth.check_grant(grant, None)
    with pytest.raises(PermissionError, match="not this one"):
        KVAuth(SECRET, (), "p1").check_grant(make_grant(SECRET, "p0", "http://p0:8001")["grant"], None)
    with pytest.raises(PermissionError, match="signed"):
        auth.check_grant({**make_grant(SECRET, "p0", "a")["grant"], "address": "b"}, None)
    with pytest.raises(PermissionError, match="signed"):
        auth.check_grant("not a dict", None)
    with pytest.raises(PermissionError, match="expired"):
        auth.check_grant(make_grant(SECRET, "p0", "a", ttl_s=-5.0)["grant"], None)
    assert make_grant(SECRET, "p0", "a")["grant"]["nonce"] != make_grant(SECRET, "p0", "a")["grant"]["nonce"]


def test_grant_without_a_secret_is_unsigned_and_taken_from_peers_only():
    grant = make_grant(None, "p0", "http://p0:8001")["grant"]
    assert "signature" not in grant
    auth = KVAuth(None, ("10.0.0.9", ""), "p0")
    assert auth.enabled and auth.peers == frozenset({"10.0.0.9"})
    assert auth.check_grant(grant, "10.0.0.9") == "http://p0:8001"
    assert auth.check_grant({}, "10.0.0.9") == ""
    with pytest.raises(PermissionError, match="--kv-peers"):
        auth.check_grant(grant, "10.0.0.8")
    assert not KVAuth(None, (), "p0").enabled


def test_a_signed_grant_is_not_waived_for_a_peer():
    auth = KVAuth(SECRET, ("10.0.0.9",), "p0")
    with pytest.raises(PermissionError):
        auth.check_grant(make_grant("wrong", "p0", "a")["grant"], "10.0.0.9")


def test_used_nonces_are_forgotten_once_expired(monkeypatch):
    auth = KVAuth(SECRET, (), "p0")
    old = make_grant(SECRET, "p0", "a", ttl_s=0.5)["grant"]
    auth.check_grant(old, None)
    assert list(auth._nonces) == [old["nonce"]]
    now = time.time()
    monkeypatch.setattr(kv_auth.time, "time", lambda: now + 10.0)
    auth.check_grant(make_grant(SECRET, "p0", "a")["grant"], None)
    assert old["nonce"] not in auth._nonces and len(auth._nonces) == 1


def test_nonces_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(kv_auth, "_MAX_NONCES", 3)
    auth = KVAuth(SECRET, (), "p0")
    grants = [make_grant(SECRET, "p0", "a")["grant"] for _ in range(5)]
    for g in grants:
        auth.check_grant(g, None)
    assert list(auth._nonces) == [g["nonce"] for g in grants[-3:]]


def test_handle_is_signed_and_expires():
    auth = KVAuth(SECRET, (), "d0")
    fresh = handle_fields(time.time() + 30)
    auth.check_handle(fresh, "http://10.0.0.1:8001", fresh[-1], auth.sign_handle(fresh))
    stale = handle_fields(time.time() - 1)
    with pytest.raises(PermissionError, match="expired"):
        auth.check_handle(stale, "http://10.0.0.1:8001", stale[-1], auth.sign_handle(stale))
    with pytest.raises(PermissionError, match="neither signed"):
        auth.check_handle(fresh, "http://10.0.0.1:8001", fresh[-1], sign("other", "handle", fresh))
    assert KVAuth(None, (), "d0").sign_handle(fresh) is None


def test_handle_from_a_peer_needs_no_signature():
    auth = KVAuth(None, ("10.0.0.1",), "d0")
    fields = handle_fields(time.time() + 30)
    auth.check_handle(fields, "http://10.0.0.1:8001", fields[-1], None)
    with pytest.raises(PermissionError):
        auth.check_handle(fields, "http://10.0.0.2:8001", fields[-1], None)


def test_pull_needs_the_issued_signature_or_a_peer():
    auth = KVAuth(SECRET, ("10.0.0.5",), "p0")
    issued = sign(SECRET, "handle", FIELDS)
    auth.check_pull(issued, issued, "10.0.0.7")
    auth.check_pull(None, None, "10.0.0.5")
    for presented in ("0" * 64, None, 5):
        with pytest.raises(PermissionError, match="signature"):
            auth.check_pull(issued, presented, "10.0.0.7")
    with pytest.raises(PermissionError):
        auth.check_pull(None, issued, "10.0.0.7")


async def test_engine_refuses_an_expired_signed_handle_before_connecting(start_engine, http):
    listener = Listener()
    address = await listener.start()
    try:
        url, _ = await start_engine(time_scale=0.01, role="decode", kv_secret=SECRET)
        prompt = ids(21, 64)
        params = forged_handle(address, prompt)
        handle = params["handle"]
        handle["expires"] = round(time.time() - 60, 3)
        handle["signature"] = sign_handle(handle)
        status, out = await post(http, url, {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
        assert status == 403 and out["error"]["code"] == "kv_transfer_refused"
        assert "expired" in out["error"]["message"]
        assert listener.connections == 0
    finally:
        await listener.close()


def test_every_signed_grant_field_is_covered_by_the_signature():
    grant = make_grant(SECRET, "p0", "http://p0:8001")["grant"]
    message = orjson.dumps(["grant", grant["instance"], grant["address"], grant["expires"], grant["nonce"]])
    assert grant["signature"] == hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()
    for field, other in (("instance", "p1"), ("address", "http://evil:1"), ("expires", grant["expires"] + 100),
                         ("nonce", "0" * 24)):
        tampered = {**grant, field: other}
        with pytest.raises(PermissionError, match="signed"):  # checked as p1 too: only the signature can refuse it
            KVAuth(SECRET, (), tampered["instance"]).check_grant(tampered, None)


def test_grant_expiry_is_kept_to_the_millisecond(monkeypatch):
    monkeypatch.setattr(kv_auth.time, "time", lambda: 1000.1234567)
    assert make_grant(SECRET, "p0", "a", ttl_s=60.0)["grant"]["expires"] == 1060.123
    assert make_grant(None, "p0", "a", ttl_s=0.5)["grant"]["expires"] == 1000.623


def test_signed_grant_without_an_address_names_none():
    assert KVAuth(SECRET, (), "p0").check_grant(make_grant(SECRET, "p0", "")["grant"], None) == ""
