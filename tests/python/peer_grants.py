#!/usr/bin/env python3
"""The independent capwire peer's run of grants (WIRE.md 5.5), written from
WIRE.md alone.

Usage: peer_grants.py ADDR NODE_ID SECRET TOKEN GRANT_KEY

ADDR and NODE_ID are a `capwire node`'s, as for peer.py. SECRET is this
peer's X25519 static secret (64 hex digits); TOKEN a grant that `capwire
ctl grant` minted for the node id of SECRET, letting it call
core.configuration/get_config; GRANT_KEY the grant key the control plane
named for it, which this peer derives from SECRET itself (5.5, Grant keys)
and checks. The session is peer_v2.py's, opened with SECRET. Each check
prints one `ok ...` line; the first mismatch prints `FAIL ...` and exits
with status 1.
"""

import hashlib
import re
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import peer as v1
import peer_v2 as v2
from peer import Mismatch, PeerClosed, check, equal, ok

KEY_RE = re.compile(r"ed25519/[0-9a-f]{64}")
HEX128 = re.compile(r"[0-9a-f]{128}")


def grant_key(secret):
    """5.5: the Ed25519 seed is BLAKE2s-256 keyed with the X25519 secret over
    `capwire grant key v1`; the key is written ed25519/ and 64 hex digits."""
    seed = hashlib.blake2s(b"capwire grant key v1", key=secret, digest_size=32).digest()
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return "ed25519/" + public.hex()


def session(addr, node_hex, secret, speak_2=True):
    t, rs, _ = v1.handshake(addr, secret)
    equal(rs.hex(), node_hex, "responder's static key is the node id")
    public = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()
    hello = v2.our_hello_v2(public) if speak_2 else v1.our_hello(public)
    peer = v2.Peer2(t, rs, we_speak_2=speak_2)
    peer.send(hello)
    peer.open()
    return peer


def reason(err):
    detail = err.get("detail")
    return detail.get("reason") if isinstance(detail, dict) else None


def run(addr, node_hex, secret_hex, token, key):
    secret = bytes.fromhex(secret_hex)
    mine = grant_key(secret)
    equal(mine, key, "our grant key, derived from our secret, is the one the control plane named (5.5)")
    ok(f"grant key derived from the X25519 secret: {mine[:24]}...")

    peer = session(addr, node_hex, secret)
    equal(peer.version, 2, "a version-2 session (4.1)")
    caps = {c["id"]: c for c in peer.whole["capabilities"]}
    grants = caps.get("core.grants")
    check(grants is not None, "the whole manifest lists core.grants (5.5)", sorted(caps))
    equal(grants["version"], "1.0.0", "core.grants version")
    check(isinstance(grants["params"], str) and KEY_RE.fullmatch(grants["params"]) is not None,
          "core.grants params: the node's grant key, ed25519/ and 64 hex digits", grants["params"])
    got = {v["name"]: (v["kind"], v["class"]) for v in grants["verbs"]}
    equal(got, {"present": ("request", "bootstrap"), "info": ("request", "controller"),
                "revoke": ("request", "controller")}, "core.grants verbs (kind, class)")
    check(all(c["id"] != "core.grants" for c in peer.first["capabilities"]),
          "core.grants is not in the version-1 view of the first hello (4.1)")
    ok(f"manifest: core.grants 1.0.0 ({grants['params'][:20]}...): present bootstrap, info and revoke controller; "
       "not in the version-1 view")

    err = peer.expect_err("core.configuration", "get_config", {}, "unauthorized")
    ok(f"before presenting: core.configuration/get_config -> unauthorized ({err['message']!r})")

    for junk, why in (("not a token", "bad_token"), ("A" * 8193, "bad_token")):
        err = peer.expect_err("core.grants", "present", {"token": junk}, "unauthorized")
        equal(reason(err), why, f"present {junk[:12]!r}...: detail reason")
    ok("present of garbage and of 8193 characters -> unauthorized, detail {reason: bad_token}")

    reply = peer.expect_ok("core.grants", "present", {"token": token})
    check(isinstance(reply, dict) and list(reply) == ["grant", "revocation_ids", "expires_ms"],
          "present's result: {grant, revocation_ids, expires_ms} in this order (5.5)", reply)
    check(HEX128.fullmatch(reply["grant"]) is not None, "grant: 128 hex digits", reply["grant"])
    equal(reply["revocation_ids"][:1], [reply["grant"]], "grant is the first revocation id")
    check(v1.is_uint(reply["expires_ms"]), "expires_ms: an unsigned integer", reply["expires_ms"])
    ok(f"present -> grant {reply['grant'][:16]}..., {len(reply['revocation_ids'])} block(s), "
       f"expires_ms {reply['expires_ms']}")

    value = peer.expect_ok("core.configuration", "get_config", {})
    check(isinstance(value, dict) and "version" in value, "get_config's result", value)
    err = peer.expect_err("core.configuration", "set_config", {"value": 1, "if_version": None}, "unauthorized")
    ok(f"with the grant: get_config -> version {value['version']}; set_config (not granted) -> unauthorized "
       f"({err['message']!r})")
    err = peer.expect_err("core.grants", "revoke", {"id": reply["grant"]}, "unauthorized")
    err2 = peer.expect_err("core.monitoring", "disable", {}, "unauthorized")
    ok("core.grants/revoke and core.monitoring/disable are never granted -> unauthorized")

    # Another key presenting the same token: not its holder.
    other = session(addr, node_hex, bytes(range(32)))
    err = other.expect_err("core.grants", "present", {"token": token}, "unauthorized")
    equal(reason(err), "wrong_holder", "another key presenting the token: detail reason")
    other.expect_err("core.configuration", "get_config", {}, "unauthorized")
    ok("another key presenting the token -> unauthorized, detail {reason: wrong_holder}; get_config still refused")

    # A version-1 session of the holder: no core.grants there (4.1).
    old = session(addr, node_hex, secret, speak_2=False)
    equal(old.version, 1, "a version-1 session")
    old.expect_err("core.grants", "present", {"token": token}, "unknown_verb")
    ok("version-1 session: core.grants/present -> unknown_verb")
    _ = err2


def main():
    args = sys.argv[1:]
    if len(args) != 5:
        print("\n".join(__doc__.strip().splitlines()[2:3]), file=sys.stderr)
        return 2
    try:
        run(*args)
    except Mismatch as e:
        print(f"FAIL {e}", flush=True)
        return 1
    except PeerClosed as e:
        print(f"FAIL the node ended the session early: {e.how}", flush=True)
        return 1
    print("pypeer grants: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
