#!/usr/bin/env python3
"""An independent capwire peer, written from WIRE.md alone.

Usage: peer.py ADDR NODE_ID INVITE

ADDR is where a `capwire node` listens (`IP:PORT` or `tcp://IP:PORT`),
NODE_ID its key (64 lowercase hex digits) and INVITE its invite with a bind
code (`capwire://NODE_ID@ADDR#CODE`), as `capwire node --json` prints them.

The Noise XX handshake and the transport messages are `noiseprotocol`'s,
CBOR is `cbor2`'s; everything in between (length prefixes, the record layer,
frames, the manifest, the bind) follows WIRE.md. Each check prints one
`ok ...` line; the first mismatch prints `FAIL ...` with what differed and
exits with status 1. Section numbers below are WIRE.md's.
"""

import hashlib
import os
import re
import secrets
import socket
import struct
import sys
import time
import warnings

import cbor2
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from noise.connection import Keypair, NoiseConnection

PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_BLAKE2s"
PROLOGUE = b"capwire/1"
# 1.3: h = HASH(protocol name), then MixHash(prologue).
H_NAME = "1ceedd81c5f458b225923dc2507787bf156f9251fc17c45af63263a929fc1ed2"
H_PROLOGUE = "8e1b992776f0fb3617f96095ab137dc61428d28a6848c85f927923ba0595a5cb"
P25519 = 2**255 - 19
MAX_PLAINTEXT = 65519  # 1.4: 65535 minus the 16-byte tag
MAX_RECORD_CHUNK = 65516  # 1.5: a RECORD chunk's body, after its 3-byte header
OUR_MAX_RECORD = 16 * 1024 * 1024
TIMEOUT = 10.0  # seconds for any one answer from the node
CODE_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"


class Mismatch(Exception):
    pass


class AuthFailed(Mismatch):
    pass


class PeerClosed(Exception):
    def __init__(self, how):
        super().__init__(how)
        self.how = how


def ok(line):
    print("ok   " + line, flush=True)


def check(cond, what, got=None, want=None):
    if not cond:
        detail = "" if got is None and want is None else f": got {got!r}, want {want!r}"
        raise Mismatch(what + detail)


def equal(got, want, what):
    check(got == want, what, got, want)


def canonical_key(key):
    """1.1: clear bit 255, then subtract p if the value is at least p."""
    n = int.from_bytes(key, "little") & ((1 << 255) - 1)
    if n >= P25519:
        n -= P25519
    return n.to_bytes(32, "little")


# ---------------------------------------------------------------- CBOR (2.1)

def is_uint(v, bits=64):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << bits)


def refuse_tag(_decoder, tag):
    raise Mismatch(f"tag {tag.tag}: no tags in the strict profile (2.1 rule 2)")


def walk_profile(item, depth, where):
    """Types allowed by the strict profile (no tags, no undefined) and nesting
    (rule 11: 32 levels per embedded item, which sits at most two levels
    down in a frame, as `detail` in `err`)."""
    if isinstance(item, (dict, list)):
        check(depth < 32 + 2, f"{where}: nested deeper than 2.1 rule 11 allows")
        children = item.items() if isinstance(item, dict) else enumerate(item)
        for k, v in children:
            if isinstance(item, dict):
                check(type(k) in (str, bytes, int), f"{where}: map key of type {type(k).__name__}")
            walk_profile(v, depth + 1, where)
    else:
        check(item is None or type(item) in (bool, int, str, bytes, float),
              f"{where}: CBOR item outside the strict profile (tag or simple value)", type(item).__name__)
        if type(item) is int:
            check(-(1 << 64) <= item < (1 << 64), f"{where}: integer beyond 64 bits")


def decode_strict(data, where):
    """Decode one record and hold it to 2.1: definite lengths, no duplicate
    keys, no tags, and shortest forms (it must encode back to the same bytes,
    keys in the order they came)."""
    try:
        item = cbor2.loads(data, allow_indefinite=False, allow_duplicate_keys=False, max_depth=64,
                           tag_hook=refuse_tag)
    except Exception as e:  # noqa: BLE001 - any decode failure is a mismatch
        raise Mismatch(f"{where}: not one CBOR item in the strict profile ({e}): {data[:64].hex()}")
    walk_profile(item, 0, where)
    again = cbor2.dumps(item)
    check(again == data, f"{where}: not in shortest form or trailing bytes (2.1 rules 1, 4)",
          data.hex()[:200], again.hex()[:200])
    return item


def check_map(m, spec, where):
    """spec: [(key, checker, required)] in WIRE.md's table order. Keys must be
    exactly the listed ones, required ones present, in table order (encoders
    write that order, 2.1 and 3.1)."""
    check(isinstance(m, dict), f"{where}: not a map", type(m).__name__)
    names = [k for k, _, _ in spec]
    for k in m:
        check(k in names, f"{where}: unknown key {k!r}", list(m), names)
    for k, checker, required in spec:
        if k not in m:
            check(not required, f"{where}: missing key {k!r}", list(m), names)
            continue
        check(checker(m[k]), f"{where}: {k!r} has the wrong type or value", m[k])
    equal(list(m), [k for k in names if k in m], f"{where}: key order")


def text(limit=None):
    return lambda v: isinstance(v, str) and (limit is None or len(v.encode()) <= limit)


def text_or_null(limit=None):
    return lambda v: v is None or text(limit)(v)


def any_item(_v):
    return True


def bytes32(v):
    return isinstance(v, bytes) and len(v) == 32


def uint(bits=64):
    return lambda v: is_uint(v, bits)


def one_of(*values):
    return lambda v: v in values


# ------------------------------------------------------- transport (1.2-1.7)

class Transport:
    """Length prefixes (1.2), transport messages (1.4) and chunks (1.5)."""

    def __init__(self, sock, noise):
        self.sock = sock
        self.noise = noise
        self.records = []
        self.split = None  # (total_len, bytearray) while a split record is incomplete
        self.closed = None  # (code, reason) once a CLOSE chunk arrived
        self.keepalives = 0

    def read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                part = self.sock.recv(n - len(buf))
            except socket.timeout:
                raise Mismatch(f"no bytes from the node within {TIMEOUT} s")
            except OSError as e:
                raise Mismatch(f"the stream failed: {e}")
            if not part:
                raise PeerClosed("end of stream" if not buf else "end of stream inside a message")
            buf += part
        return bytes(buf)

    def send_plaintext(self, plaintext):
        check(len(plaintext) <= MAX_PLAINTEXT, "our plaintext fits one message")
        sealed = self.noise.encrypt(bytes(plaintext))
        self.sock.sendall(struct.pack(">H", len(sealed)) + sealed)

    def send_records(self, records, close=None):
        """Pack records as chunks (1.5), a CLOSE chunk (code, reason) last. A
        record too large for one message starts as FIRST and goes on in NEXT."""
        plaintext = bytearray()

        def room():
            return MAX_PLAINTEXT - len(plaintext) - 3

        def flush():
            nonlocal plaintext
            self.send_plaintext(plaintext)
            plaintext = bytearray()

        for rec in records:
            if len(rec) <= MAX_RECORD_CHUNK:
                if len(rec) > room():
                    flush()
                plaintext += struct.pack(">BH", 1, len(rec)) + rec
                continue
            if room() < 5:
                flush()
            part = room() - 4
            plaintext += struct.pack(">BHI", 2, 4 + part, len(rec)) + rec[:part]
            at = part
            while at < len(rec):
                flush()
                part = min(room(), len(rec) - at)
                plaintext += struct.pack(">BH", 3, part) + rec[at:at + part]
                at += part
        if close is not None:
            body = bytes([close[0]]) + close[1].encode()
            if len(body) > room():
                flush()
            plaintext += struct.pack(">BH", 4, len(body)) + body
        flush()

    def read_message(self):
        (length,) = struct.unpack(">H", self.read_exact(2))
        check(length >= 16, "transport length prefix is at least 16 (1.2)", length)
        sealed = self.read_exact(length)
        try:
            plaintext = self.noise.decrypt(sealed)
        except Exception as e:  # noqa: BLE001
            raise Mismatch(f"a transport message failed authentication ({e})")
        if not plaintext:
            self.keepalives += 1
            return
        self.parse_chunks(bytes(plaintext))

    def parse_chunks(self, pt):
        at = 0
        while at < len(pt):
            check(self.closed is None, "nothing follows a CLOSE chunk (1.5)")
            check(len(pt) - at >= 3, "chunk header runs past the plaintext (1.5)")
            kind, blen = struct.unpack(">BH", pt[at:at + 3])
            body = pt[at + 3:at + 3 + blen]
            check(len(body) == blen, "chunk body runs past the plaintext (1.5)", len(body), blen)
            at += 3 + blen
            last = at == len(pt)
            if kind == 1:
                check(self.split is None, "RECORD while a split record is incomplete (1.5)")
                self.records.append(body)
            elif kind == 2:
                check(self.split is None and blen >= 5, "FIRST chunk layout (1.5)")
                (total,) = struct.unpack(">I", body[:4])
                check(1 <= blen - 4 < total <= OUR_MAX_RECORD, "FIRST: 1 <= part < total_len <= max (1.5)",
                      (blen - 4, total))
                self.split = (total, bytearray(body[4:]))
            elif kind == 3:
                check(self.split is not None and blen >= 1, "NEXT only inside a split record (1.5)")
                total, buf = self.split
                buf += body
                check(len(buf) <= total, "NEXT runs past total_len (1.5)", len(buf), total)
                if len(buf) == total:
                    self.records.append(bytes(buf))
                    self.split = None
            elif kind == 4:
                check(self.split is None and last and blen >= 1, "CLOSE chunk layout (1.5)")
                self.closed = (body[0], body[1:].decode())
            elif kind == 5:
                check(last and blen == 0, "REKEY is empty and last (1.5)")
                self.noise.rekey_inbound_cipher()  # 1.7: after opening this message
            else:
                raise Mismatch(f"unknown chunk type {kind:#04x} (1.5)")

    def read_record(self):
        while not self.records:
            if self.closed is not None:
                raise PeerClosed(f"transport CLOSE code {self.closed[0]} reason {self.closed[1]!r}")
            self.read_message()
        return self.records.pop(0)


def parse_addr(addr):
    addr = addr[len("tcp://"):] if addr.startswith("tcp://") else addr
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def handshake(addr, secret, prologue=PROLOGUE):
    """1.3, as the initiator. Returns (transport, remote static key, h)."""
    noise = NoiseConnection.from_name(PROTOCOL_NAME)
    noise.set_as_initiator()
    noise.set_keypair_from_private_bytes(Keypair.STATIC, secret)
    noise.set_prologue(prologue)
    noise.start_handshake()
    sock = socket.create_connection(parse_addr(addr), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = Transport(sock, noise)
    m1 = noise.write_message()
    check(len(m1) == 32, "message 1 is e alone (32 bytes)", len(m1))
    sock.sendall(struct.pack(">H", len(m1)) + m1)
    (len2,) = struct.unpack(">H", t.read_exact(2))
    check(len2 != 0, "the node answered with the busy refusal `00 00` (1.3): retry later")
    equal(len2, 0x60, "message 2 length prefix (1.3)")
    m2 = t.read_exact(len2)
    remote = noise.noise_protocol.handshake_state  # noiseprotocol drops it once finished
    try:
        payload = noise.read_message(m2)
    except InvalidTag:
        sock.close()
        raise AuthFailed("message 2 failed authentication")
    equal(bytes(payload), b"", "message 2 payload (empty in version 1)")
    rs = remote.rs.public_bytes
    m3 = noise.write_message()
    check(len(m3) == 0x40, "message 3 is 64 bytes", len(m3))
    sock.sendall(struct.pack(">H", len(m3)) + m3)
    check(noise.handshake_finished, "handshake finished after message 3")
    return t, rs, noise.get_handshake_hash()


# ------------------------------------------------------------ frames (2, 4)

ERR_SPEC = [("code", text(64), True), ("message", text(1024), True), ("detail", any_item, False)]
LIMITS_SPEC = [("max_record", uint(32), True), ("max_inflight", uint(32), True), ("keepalive_ms", uint(32), True)]
CAP_RE = re.compile(r"^(core|app)(\.[a-z][a-z0-9_]*)+$")
SEG_RE = re.compile(r"^[a-z][a-z0-9_]*$")
SEMVER_RE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                       r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")
# The verbs WIRE.md gives each core capability of a capwire node (3.3, 5.1-5.3).
CORE = {
    "core.monitoring": ("1.1.0", {"bind": ("request", "bootstrap"), "copy": ("notification", "bootstrap"),
                                  "disable": ("request", "controller"), "status": ("request", "bootstrap")}),
    "core.configuration": ("1.0.0", {"get_config": ("request", "controller"),
                                     "set_config": ("request", "controller")}),
    "core.connect": ("1.0.0", {"introduce": ("request", "controller")}),
    "core.cluster": ("1.1.0", {**{v: ("request", "controller") for v in (
        "contact", "create", "create_placed", "introduce", "list", "remove", "set_bio", "set_monitoring",
        "set_persona", "states")},
        "roster": ("notification", "bootstrap")}),
}


def check_manifest(m, node_id, where, kinds=("request", "notification")):
    """3.1, every rule, plus the core capabilities' verbs (3.3, section 5).
    `kinds`: the verb kinds the hello may carry (a protocol-2 hello adds
    `stream`, 3.1)."""
    check_map(m, [("node_id", bytes32, True), ("app_id", text(64), True), ("name", text(128), True),
                  ("description", text(1024), True), ("epoch", uint(), True),
                  ("monitoring", one_of("off", "pending", "on"), True),
                  ("capabilities", lambda v: isinstance(v, list) and 1 <= len(v) <= 128, True)], where)
    equal(m["node_id"].hex(), node_id.hex(), f"{where}: node_id is the handshake's static key")
    caps = {}
    for cap in m["capabilities"]:
        check_map(cap, [("id", lambda v: text(64)(v) and CAP_RE.match(v), True),
                        ("version", lambda v: isinstance(v, str) and SEMVER_RE.match(v), True),
                        ("params", text_or_null(4096), True),
                        ("verbs", lambda v: isinstance(v, list) and 1 <= len(v) <= 128, True)],
                  f"{where}: capability")
        verbs = {}
        for verb in cap["verbs"]:
            check_map(verb, [("name", lambda v: text(64)(v) and SEG_RE.match(v), True),
                             ("kind", one_of(*kinds), True),
                             ("class", one_of("bootstrap", "controller"), True),
                             ("args_schema", text_or_null(16384), True),
                             ("result_schema", text_or_null(16384), True)], f"{where}: {cap['id']} verb")
            if verb["kind"] == "notification":
                equal(verb["result_schema"], None, f"{where}: {cap['id']}/{verb['name']} result_schema")
            verbs[verb["name"]] = verb
        names = [v["name"].encode() for v in cap["verbs"]]
        check(all(a < b for a, b in zip(names, names[1:])), f"{where}: {cap['id']} verbs strictly sorted")
        caps[cap["id"]] = (cap, verbs)
    ids = [c["id"].encode() for c in m["capabilities"]]
    check(all(a < b for a, b in zip(ids, ids[1:])), f"{where}: capabilities strictly sorted by id", ids)
    for cap_id, (version, want) in CORE.items():
        check(cap_id in caps, f"{where}: lists {cap_id}", sorted(caps))
        cap, verbs = caps[cap_id]
        equal(cap["version"], version, f"{where}: {cap_id} version")
        got = {n: (v["kind"], v["class"]) for n, v in verbs.items()}
        equal(got, want, f"{where}: {cap_id} verbs (kind, class)")
    return caps


class Peer:
    def __init__(self, transport, node_id):
        self.t = transport
        self.node_id = node_id
        self.manifest = None  # the newest manifest from the node's hellos
        self.hellos = 0
        self.next_req = secrets.randbelow(1 << 63)  # 4.4: counters from a random point

    def send(self, frame, close=None):
        self.t.send_records([cbor2.dumps(frame)], close=close)

    def read_frame(self):
        """The next frame other than a keepalive frame; hellos are checked here."""
        while True:
            frame = decode_strict(self.t.read_record(), "record from the node")
            check(isinstance(frame, dict) and frame.get("type") in
                  ("hello", "control", "response", "cancel", "close", "keepalive"), "frame type (2.2)", frame)
            if frame["type"] == "keepalive":
                check_map(frame, [("type", text(), True)], "keepalive frame")
                continue
            if frame["type"] == "close":
                check_map(frame, [("type", text(), True), ("code", text(), True), ("reason", text(256), True)],
                          "close frame")
                raise PeerClosed(f"close frame code {frame['code']!r} reason {frame['reason']!r}")
            if frame["type"] == "hello":
                self.take_hello(frame)
            return frame

    def take_hello(self, frame):
        where = "hello" if self.manifest is None else "later hello"
        check_map(frame, [("type", text(), True), ("protocol", uint(32), True),
                          ("limits", lambda v: isinstance(v, dict), True), ("manifest", any_item, True)], where)
        equal(frame["protocol"], 1, f"{where}: protocol")
        check_map(frame["limits"], LIMITS_SPEC, f"{where} limits")
        check(frame["limits"]["max_record"] >= 65536, f"{where}: max_record >= 65536 (4.1)")
        check(frame["limits"]["max_inflight"] >= 1, f"{where}: max_inflight >= 1 (4.1)")
        check(len(cbor2.dumps(frame["manifest"])) <= 1 << 20, f"{where}: manifest at most 1 MiB (3.1)")
        check_manifest(frame["manifest"], self.node_id, f"{where} manifest")
        if self.manifest is not None:
            check(frame["manifest"]["epoch"] > self.manifest["epoch"], f"{where}: epoch grows (4.2)",
                  frame["manifest"]["epoch"], f"> {self.manifest['epoch']}")
        self.manifest = frame["manifest"]
        self.limits = frame["limits"]
        self.hellos += 1

    def call(self, cap, verb, args, budget_ms=10_000):
        """4.3: one request; returns the response frame, hellos in between taken."""
        req_id = str(self.next_req)
        self.next_req += 1
        self.send({"type": "control", "cap": cap, "verb": verb, "req_id": req_id,
                   "budget_ms": budget_ms, "args": args})
        while True:
            frame = self.read_frame()
            if frame["type"] == "hello":
                continue
            check(frame["type"] == "response", f"{cap}/{verb}: only a response comes back", frame)
            check_map(frame, [("type", text(), True), ("req_id", text(64), True), ("ok", one_of(True, False), True),
                              ("result", any_item, False), ("err", lambda v: isinstance(v, dict), False)],
                      f"{cap}/{verb} response")
            equal(frame["req_id"], req_id, f"{cap}/{verb}: response req_id")
            check(("result" in frame) == frame["ok"] and ("err" in frame) != frame["ok"],
                  f"{cap}/{verb}: `result` iff ok, `err` iff not (2.2)", frame)
            if not frame["ok"]:
                check_map(frame["err"], ERR_SPEC, f"{cap}/{verb} err")
            return frame

    def expect_ok(self, cap, verb, args):
        frame = self.call(cap, verb, args)
        check(frame["ok"], f"{cap}/{verb} succeeds", frame.get("err"), "ok: true")
        return frame["result"]

    def expect_err(self, cap, verb, args, code):
        frame = self.call(cap, verb, args)
        check(not frame["ok"], f"{cap}/{verb} fails", frame.get("result"), "ok: false")
        equal(frame["err"]["code"], code, f"{cap}/{verb} error code")
        return frame["err"]


# ------------------------------------------------------------------- checks

def check_vectors():
    """1.3's constants and 1.8's worked example, with noiseprotocol in both roles."""
    equal(hashlib.blake2s(PROTOCOL_NAME).hexdigest(), H_NAME, "h = BLAKE2s(protocol name) (1.3)")
    equal(hashlib.blake2s(bytes.fromhex(H_NAME) + PROLOGUE).hexdigest(), H_PROLOGUE, "h after MixHash(prologue)")
    sides = []
    for initiator, static, ephemeral, identity in (
            (True, "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1",
             "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a",
             "6bc3822a2aa7f4e6981d6538692b3cdf3e6df9eea6ed269eb41d93c22757b75a"),
            (False, "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893",
             "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b",
             "31e0303fd6418d2f8c0e78b91f22e8caed0fbe48656dcf4767e4834f701b8f62")):
        n = NoiseConnection.from_name(PROTOCOL_NAME)
        n.set_as_initiator() if initiator else n.set_as_responder()
        n.set_keypair_from_private_bytes(Keypair.STATIC, bytes.fromhex(static))
        n.set_keypair_from_private_bytes(Keypair.EPHEMERAL, bytes.fromhex(ephemeral))
        equal(n.noise_protocol.keypairs["s"].public_bytes.hex(), identity, "1.8 identity (1.1 hex)")
        n.set_prologue(PROLOGUE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a preset ephemeral key is what we want here
            n.start_handshake()
        equal(n.noise_protocol.handshake_state.symmetric_state.h.hex(), H_PROLOGUE, "noiseprotocol's h after prologue")
        sides.append(n)
    ini, res = sides
    wire = b""
    for writer, reader in ((ini, res), (res, ini), (ini, res)):
        msg = bytes(writer.write_message())
        reader.read_message(msg)
        wire += struct.pack(">H", len(msg)) + msg
    want = ("0020ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c7944"
            "006095ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f1448088"
            "437c365eb362a1c991b0557fe8a7fb187d99346765d93ec63db6c1b01504ebeec5"
            "f9b7e02400dced2825c0aac663bcd935d907d7847a0b34d9f2caa2fbf1539e07"
            "004046c3307de83b014258717d97781c1f50936d8b7d50c0722a1739654d10392d"
            "4182c3d79b70bd2dd6b28434a5d3ca6934628ccfa9f43269723f5f810d74cfc332")
    equal(wire.hex(), want, "1.8 handshake bytes")
    equal(ini.get_handshake_hash().hex(), "23e49e9171ed4db79d788acca43a9253e4d15373f33f58a2cf42e4c8b7e9663b",
          "1.8 handshake hash")
    m = ini.encrypt(bytes.fromhex("01000568656c6c6f010000"))
    equal((struct.pack(">H", len(m)) + m).hex(), "001b9a67ad04d33158d8fd9c120c13912ed8fb44b436ac1095a74615db",
          "1.8 first transport message")
    m = res.encrypt(bytes.fromhex("04000400627965"))
    equal((struct.pack(">H", len(m)) + m).hex(), "001792894cb3e8f1dc72ab9bd614888d0fe01b53d83d1d3c1b",
          "1.8 CLOSE message")
    request = {"type": "control", "cap": "app.echo", "verb": "say", "req_id": "42", "budget_ms": 1500,
               "args": {"text": "hello"}}
    equal(cbor2.dumps(request).hex(), "a6647479706567636f6e74726f6c63636170686170702e6563686f647665726263736179"
          "667265715f6964623432696275646765745f6d731905dc6461726773a164746578746568656c6c6f", "2.6 request bytes")
    response = {"type": "response", "req_id": "42", "ok": False,
                "err": {"code": "unknown_verb", "message": "no such verb"}}
    equal(cbor2.dumps(response).hex(), "a4647479706568726573706f6e7365667265715f6964623432626f6bf463657272a2"
          "64636f64656c756e6b6e6f776e5f76657262676d6573736167656c6e6f20737563682076657262", "2.6 response bytes")
    equal(cbor2.dumps({"type": "keepalive"}).hex(), "a16474797065696b656570616c697665", "2.2 keepalive bytes")
    ok("vectors: 1.3's h values, 1.8's identities, handshake, h and transport bytes, 2.6's and 2.2's CBOR")


def our_hello(public):
    """4.1: our first record. A minimal manifest (3.1): core.monitoring only."""
    verbs = [{"name": "bind", "kind": "request", "class": "bootstrap", "args_schema": None, "result_schema": None},
             {"name": "disable", "kind": "request", "class": "controller", "args_schema": None,
              "result_schema": None}]
    manifest = {"node_id": public, "app_id": "pypeer", "name": "pypeer",
                "description": "independent interoperability peer", "epoch": 1, "monitoring": "off",
                "capabilities": [{"id": "core.monitoring", "version": "1.1.0", "params": None, "verbs": verbs}]}
    return {"type": "hello", "protocol": 1,
            "limits": {"max_record": OUR_MAX_RECORD, "max_inflight": 16, "keepalive_ms": 15_000},
            "manifest": manifest}


def parse_invite(invite):
    """3.4: capwire://NODE_ID@ADDR[,ADDR...][#CODE]"""
    invite = invite.strip()
    check(invite.startswith("capwire://"), "invite starts with capwire://", invite)
    rest, _, code = invite[len("capwire://"):].partition("#")
    node_hex, _, addrs = rest.partition("@")
    check(re.fullmatch(r"[0-9a-f]{64}", node_hex) is not None, "invite NODE_ID is 64 lowercase hex", node_hex)
    check(len(code) == 10 and all(c in CODE_ALPHABET for c in code), "invite code: 10 of the alphabet (3.3)", code)
    return node_hex, [a for a in addrs.split(",") if a], code


def run(addr, node_hex, invite):
    check_vectors()
    inv_node, inv_addrs, code = parse_invite(invite)
    equal(inv_node, node_hex, "invite NODE_ID is the node id")
    check(addr in inv_addrs or addr.removeprefix("tcp://") in inv_addrs, "invite lists the address", inv_addrs, addr)
    ok(f"invite: node {inv_node[:16]}..., addresses {inv_addrs}, a bind code")

    # A peer with another prologue fails at the first authenticated message (1.3).
    try:
        handshake(addr, os.urandom(32), prologue=b"capwire/2")
        raise Mismatch("a handshake with prologue capwire/2 finished")
    except AuthFailed:
        pass
    ok("handshake with prologue capwire/2 fails at message 2")

    # 4.1, 4.6: a first record that is not a hello: the node's close frame, then CLOSE 0.
    t, _, _ = handshake(addr, os.urandom(32))
    rude = Peer(t, bytes.fromhex(node_hex))
    t.send_records([cbor2.dumps(None)])
    try:
        while True:  # the node's hello may or may not come first (4.1)
            frame = rude.read_frame()
            check(frame["type"] == "hello", "only a hello comes before the close", frame)
    except PeerClosed as e:
        check(e.how.startswith("close frame code 'protocol_error'"), "the node closes with protocol_error", e.how)
    try:
        while True:
            t.read_record()
    except PeerClosed:
        check(t.closed is not None and t.closed[0] == 0, "a transport CLOSE code 0 after the close frame (4.6)",
              t.closed, "(0, reason)")
    t.sock.close()
    ok("a first record that is not a hello -> close frame protocol_error, then CLOSE 0")

    secret = os.urandom(32)
    t, rs, h = handshake(addr, secret)
    public = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()
    equal(rs.hex(), node_hex, "responder's static key is the node id")
    equal(canonical_key(rs), rs, "the node's key is canonical (1.1)")
    ok(f"handshake: {PROTOCOL_NAME.decode()}, prologue {PROLOGUE.decode()}, prefixes 0020/0060/0040, "
       f"empty payloads, h {h.hex()[:16]}...")

    peer = Peer(t, rs)
    peer.send(our_hello(public))
    first = peer.read_frame()
    equal(first["type"], "hello", "first record from the node is a hello (4.1)")
    caps = check_manifest(peer.manifest, rs, "hello manifest")
    equal(peer.manifest["monitoring"], "pending", "manifest monitoring while a bind code is open")
    ok(f"hello: protocol 1, limits {peer.limits}, manifest of {len(caps)} capabilities, "
       f"epoch {peer.manifest['epoch']}, node_id = handshake key")

    check("app.agent" in caps, "manifest lists app.agent", sorted(caps))
    echo = caps["app.agent"][1].get("echo")
    check(echo is not None and (echo["kind"], echo["class"]) == ("request", "bootstrap"),
          "app.agent/echo is a bootstrap request", echo)
    result = peer.expect_ok("app.agent", "echo", "hello from python")
    equal(result, f"{peer.manifest['name']}: hello from python", "app.agent/echo result")
    ok(f"app.agent/echo -> {result!r}")

    big = "x" * 200_000  # over one message both ways: FIRST and NEXT chunks (1.5)
    result = peer.expect_ok("app.agent", "echo", big)
    equal(result, f"{peer.manifest['name']}: {big}", "app.agent/echo result for a 200000-byte text")
    ok("app.agent/echo of 200000 bytes: split records (FIRST/NEXT) both ways")

    # Keepalives (1.5, 2.2): an empty transport message and a keepalive frame; the session goes on.
    t.send_plaintext(b"")
    peer.send({"type": "keepalive"})
    err = peer.expect_err("app.agent", "nope", None, "unknown_verb")
    check("detail" not in err, "unknown_verb has no detail (3.2)", err)
    ok(f"keepalives taken; app.agent/nope -> unknown_verb ({err['message']!r})")
    err = peer.expect_err("core.configuration", "get_config", {}, "unauthorized")
    ok(f"core.configuration/get_config before bind -> unauthorized ({err['message']!r})")

    status = peer.expect_ok("core.monitoring", "status", {})
    check_map(status, [("monitoring", text(), True), ("you_are_controller", one_of(True, False), True),
                       ("copy_seq", uint(), True)], "status result")
    equal((status["monitoring"], status["you_are_controller"]), ("pending", False), "status before bind")
    ok(f"core.monitoring/status -> {status}")

    wrong = next(c for c in ("22222" "22222", "33333" "33333") if c != code)
    err = peer.expect_err("core.monitoring", "bind", {"code": wrong}, "bind_failed")
    equal(err.get("detail"), {"reason": "wrong_code", "attempts_left": 2}, "bind_failed detail (3.3)")
    ok(f"core.monitoring/bind with a wrong code -> bind_failed {err['detail']}")

    epoch_before, hellos_before = peer.manifest["epoch"], peer.hellos
    bound = peer.expect_ok("core.monitoring", "bind", {"code": code})
    check_map(bound, [("manifest", lambda v: isinstance(v, dict), True), ("members", one_of([]), True),
                      ("config", lambda v: isinstance(v, dict), True), ("version", uint(), True)], "bind result")
    check_manifest(bound["manifest"], rs, "bind result manifest")
    equal(bound["manifest"]["monitoring"], "on", "bind result manifest monitoring")
    check(bound["manifest"]["epoch"] > epoch_before, "bind result manifest has a new epoch (4.2)",
          bound["manifest"]["epoch"], f"> {epoch_before}")
    equal(bound["config"], {"value": None, "version": 0}, "bind result config (never set)")
    equal(bound["version"], 0, "bind result roster version (no child ever)")
    ok(f"core.monitoring/bind with the invite's code -> bound, epoch {bound['manifest']['epoch']}")

    order = "before" if peer.hellos > hellos_before else "after"
    deadline = time.monotonic() + TIMEOUT
    while peer.manifest["monitoring"] != "on":
        check(time.monotonic() < deadline, "a hello with monitoring \"on\" follows the bind (4.2)")
        frame = peer.read_frame()
        check(frame["type"] == "hello", "only a hello comes unasked", frame)
    ok(f"later hello: monitoring \"on\", epoch {peer.manifest['epoch']} (was {epoch_before}), "
       f"{order} the bind's response")

    config = peer.expect_ok("core.configuration", "get_config", {})
    equal(config, {"value": None, "version": 0}, "get_config result (never set)")
    ok(f"core.configuration/get_config as the control plane -> {config}")

    # A notification gets nothing back (4.3): the next frame answers the next request.
    peer.send({"type": "control", "cap": "core.cluster", "verb": "roster", "req_id": "",
               "args": {"members": [], "version": 0}})
    status = peer.expect_ok("core.monitoring", "status", {})
    equal((status["monitoring"], status["you_are_controller"]), ("on", True), "status after bind")
    ok(f"core.cluster/roster notification: nothing came back; status -> {status}")

    # 4.6: a close frame, then the transport's CLOSE (code 0) in the same message.
    peer.send({"type": "close", "code": "normal", "reason": "done"}, close=(0, "done"))
    t.sock.shutdown(socket.SHUT_WR)
    seen = []
    try:
        while True:
            frame = peer.read_frame()
            check(frame["type"] == "hello", "after our close only a hello or a close may come", frame)
    except PeerClosed as e:
        seen.append(e.how)
    if t.closed is None and "end of stream" not in seen[-1]:
        try:
            while True:
                t.read_message()
        except PeerClosed as e:
            seen.append(e.how)
    t.sock.close()
    check(all("inside a message" not in s for s in seen), "the node ends the stream cleanly", seen)
    ok(f"close: sent close frame + CLOSE 0; the node ended with: {'; '.join(seen)}")


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        run(*sys.argv[1:])
    except Mismatch as e:
        print(f"FAIL {e}", flush=True)
        return 1
    except PeerClosed as e:
        print(f"FAIL the node ended the session early: {e.how}", flush=True)
        return 1
    print("pypeer: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
