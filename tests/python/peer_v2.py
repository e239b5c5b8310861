#!/usr/bin/env python3
"""The independent capwire peer's protocol-2 run, written from WIRE.md alone.

Usage: peer_v2.py ADDR NODE_ID WIRE_MD

ADDR and NODE_ID are a `capwire node`'s, as for peer.py; WIRE_MD is the
path of WIRE.md, whose worked example of 4.9 is checked against cbor2's
encoding of the same frames.

The transport, the strict CBOR profile and the version-1 rules are
peer.py's; this file adds what protocol 2 changes: version agreement in the
first hellos (4.1, 3.5), the `item` and `credit` frames (2.2) and streams
with credit (4.9). Each check prints one `ok ...` line; the first mismatch
prints `FAIL ...` and exits with status 1. Section numbers are WIRE.md's.
"""

import json
import os
import re
import select
import sys
import time

import cbor2
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import peer as v1
from peer import Mismatch, PeerClosed, any_item, check, check_map, equal, ok, one_of, text, uint

U32 = (1 << 32) - 1
QUIET = 0.5  # seconds to wait when checking that nothing more comes
V1_KINDS = ("request", "notification")
V2_KINDS = ("request", "notification", "stream", "task")
V2_ONLY_KINDS = ("stream", "task")
# 3.1, 4.1: the protocol-2 capabilities (tasks, 4.10; grants, 5.5)
V2_ONLY_CAPS = ("core.tasks", "core.grants")
FRAME_TYPES = ("hello", "control", "response", "cancel", "close", "keepalive", "item", "credit")
PROTOCOL_CAP = {"versions": ("request", "bootstrap")}  # 3.5
V1_VIEW = "version-1 view"


def req_id_ok(v):
    """2.2: 1..=64 bytes, each printable ASCII without space."""
    return isinstance(v, str) and 1 <= len(v) <= 64 and all(0x21 <= ord(c) <= 0x7E for c in v)


ITEM_SPEC = [("type", text(), True), ("req_id", req_id_ok, True), ("item", any_item, True)]
RESPONSE_SPEC = [("type", text(), True), ("req_id", req_id_ok, True), ("ok", one_of(True, False), True),
                 ("result", any_item, False), ("err", lambda v: isinstance(v, dict), False)]
HELLO_SPEC = [("type", text(), True), ("protocol", uint(32), True),
              ("limits", lambda v: isinstance(v, dict), True), ("manifest", any_item, True)]


def enc(item):
    return cbor2.dumps(item)


def check_response(frame, where):
    """2.2: a response's keys, `result` iff ok, `err` (2.4) iff not."""
    check_map(frame, RESPONSE_SPEC, where)
    check(("result" in frame) == frame["ok"] and ("err" in frame) != frame["ok"],
          f"{where}: `result` iff ok, `err` iff not (2.2)", frame)
    if not frame["ok"]:
        check_map(frame["err"], v1.ERR_SPEC, f"{where} err")


def protocol_cap(manifest):
    return next((c for c in manifest["capabilities"] if c["id"] == "core.protocol"), None)


def speaks_2(manifest):
    """3.5: core.protocol with a major version of 2 or more."""
    cap = protocol_cap(manifest)
    return cap is not None and int(cap["version"].split(".")[0]) >= 2


def version_1_view(whole):
    """4.1: the whole manifest without its stream and task verbs and
    without the protocol-2 capabilities (core.tasks, core.grants), a
    capability left with no verb left out,
    core.protocol's params "version-1 view" when anything was left out;
    the same epoch."""
    caps, dropped = [], False
    for cap in whole["capabilities"]:
        if cap["id"] in V2_ONLY_CAPS:
            dropped = True
            continue
        verbs = [v for v in cap["verbs"] if v["kind"] not in V2_ONLY_KINDS]
        dropped |= len(verbs) != len(cap["verbs"])
        if verbs:
            caps.append({**cap, "verbs": verbs})
    if dropped:
        caps = [{**c, "params": V1_VIEW} if c["id"] == "core.protocol" else c for c in caps]
    return {**whole, "capabilities": caps}


def stream_verbs(manifest):
    return sorted(f"{c['id']}/{v['name']}" for c in manifest["capabilities"] for v in c["verbs"]
                  if v["kind"] in V2_ONLY_KINDS)


# ----------------------------------------------------------------- 4.9 bytes

def check_worked_example(wire_md):
    """4.9's example: cbor2's encoding of each frame is the hex WIRE.md
    prints, of the length it states; the credit arithmetic below it holds."""
    doc = open(wire_md, encoding="utf-8").read()
    at = doc.find("**Example.** A caller opens `app.llm/generate`")
    check(at >= 0, "WIRE.md has 4.9's worked example")
    block = doc[doc.index("```", at) + 3:]
    block = block[:block.index("```")]
    printed = []  # (name, stated length, hex)
    for line in block.splitlines():
        head = re.match(r"^(caller|callee) → (caller|callee)\s+(\w+) \((\d+) bytes\)$", line.strip())
        if head:
            printed.append([head.group(3), int(head.group(4)), ""])
        elif line.strip():
            check(printed, "4.9 example: hex only after a frame's heading", line)
            printed[-1][2] += line.split('"')[0].replace(" ", "")
    frames = [("control", {"type": "control", "cap": "app.llm", "verb": "generate", "req_id": "9", "args": "hi"}),
              ("credit", {"type": "credit", "req_id": "9", "items": 16, "bytes": 65536}),
              ("item", {"type": "item", "req_id": "9", "item": "Hello"}),
              ("response", {"type": "response", "req_id": "9", "ok": True, "result": None})]
    equal([p[0] for p in printed], [n for n, _ in frames], "4.9 example: the frames shown")
    for (name, length, hexed), (_, frame) in zip(printed, frames):
        got = enc(frame)
        equal(got.hex(), hexed, f"4.9 example: the {name} frame's bytes")
        equal(len(got), length, f"4.9 example: the {name} frame's stated length")
        equal(v1.decode_strict(bytes.fromhex(hexed), f"4.9 {name}"), frame, f"4.9 example: {name} decodes back")
    hello = enc("Hello")
    equal(hello.hex(), "6548656c6c6f", "4.9: the item \"Hello\" is `65 48656c6c6f`")
    held = (16 - 1, 65536 - len(hello))
    after = " ".join(doc[at:].split("\n#", 1)[0].split())  # the example's section, white space folded
    check(f"the callee holds {held[0]} items and {held[1]} bytes" in after,
          "4.9 example: the credit left it states", held)
    ok(f"4.9 worked example: control, credit, item, response bytes as printed (57, 40, 31, 36); "
       f"\"Hello\" costs 6 bytes, leaving {held[0]} items and {held[1]} bytes")


# ----------------------------------------------------------------- sessions

class Stream:
    """One stream this peer opened (4.9): what it granted and what came."""

    def __init__(self, req_id, cap, verb, args):
        self.req_id, self.cap, self.verb, self.args = req_id, cap, verb, args
        self.held_items = 0  # credit the node holds (our grants less what it used)
        self.held_bytes = 0
        self.items = []
        self.bytes = 0  # encoded item bytes received
        self.response = None
        self.repeats = 0  # repeats of the control frame sent and not yet answered
        self.repeat_answers = []

    def __repr__(self):
        return f"stream {self.cap}/{self.verb} {self.req_id}"


class Peer2(v1.Peer):
    """A session with a node that may speak protocol 2 (4.1)."""

    def __init__(self, transport, node_id, we_speak_2=True):
        super().__init__(transport, node_id)
        self.we_speak_2 = we_speak_2
        self.version = None  # known once the node's first hello is in (4.1)
        self.first = None  # the node's first manifest
        self.whole = None  # its protocol-2 manifest (None while only the first is in)
        self.awaiting_whole = False
        self.streams = {}

    # ---- reading

    def read_frame(self):
        """The next frame other than a keepalive frame; hellos, items and
        stream responses are checked and accounted here."""
        while True:
            frame = v1.decode_strict(self.t.read_record(), "record from the node")
            check(isinstance(frame, dict) and frame.get("type") in FRAME_TYPES, "frame type (2.2)", frame)
            kind = frame["type"]
            if kind == "keepalive":
                check_map(frame, [("type", text(), True)], "keepalive frame")
                continue
            if kind == "close":
                check_map(frame, [("type", text(), True), ("code", text(), True), ("reason", text(256), True)],
                          "close frame")
                raise PeerClosed(f"close frame code {frame['code']!r} reason {frame['reason']!r}")
            check(not self.awaiting_whole or kind == "hello",
                  "the protocol-2 hello comes before any other frame (4.1)", frame)
            if kind in ("item", "credit"):
                check(self.version == 2, f"no {kind} frame on a version-1 session (2.2)", frame)
            check(kind != "credit", "the node sends credit only for streams it opened; we opened none to it", frame)
            if kind == "hello":
                self.take_hello(frame)
            elif kind == "item":
                self.take_item(frame)
            elif kind == "response" and frame.get("req_id") in self.streams:
                self.take_stream_response(frame)
            return frame

    def take_hello(self, frame):
        first = self.manifest is None
        where = "first hello" if first else "protocol-2 hello" if self.awaiting_whole else "later hello"
        check_map(frame, HELLO_SPEC, where)
        check_map(frame["limits"], v1.LIMITS_SPEC, f"{where} limits")
        check(frame["limits"]["max_record"] >= 65536, f"{where}: max_record >= 65536 (4.1)")
        check(frame["limits"]["max_inflight"] >= 1, f"{where}: max_inflight >= 1 (4.1)")
        m = frame["manifest"]
        check(len(enc(m)) <= 1 << 20, f"{where}: manifest at most 1 MiB (3.1)")
        if first:
            equal(frame["protocol"], 1, f"{where}: protocol (1 in every first hello, 4.1)")
        else:
            equal(frame["protocol"], self.version, f"{where}: protocol (the session's, 4.1)")
        # 3.1: no stream verb in a hello whose protocol is 1.
        v1.check_manifest(m, self.node_id, f"{where} manifest", V2_KINDS if frame["protocol"] == 2 else V1_KINDS)
        cap = protocol_cap(m)
        if first:
            self.version = 2 if self.we_speak_2 and speaks_2(m) else 1
            self.first = m
            self.awaiting_whole = self.version == 2 and cap is not None and cap["params"] == V1_VIEW
        elif self.awaiting_whole:
            equal(m["epoch"], self.manifest["epoch"], f"{where}: at the first hello's epoch (4.1)")
            self.awaiting_whole = False
        else:
            check(m["epoch"] > self.manifest["epoch"], f"{where}: epoch grows (4.2)", m["epoch"],
                  f"> {self.manifest['epoch']}")
        if cap is not None:  # 3.5
            check(re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", cap["version"]) is not None,
                  f"{where}: core.protocol version", cap["version"])
            got = {v["name"]: (v["kind"], v["class"]) for v in cap["verbs"]}
            equal(got, PROTOCOL_CAP, f"{where}: core.protocol verbs (kind, class) (3.5)")
            want = V1_VIEW if frame["protocol"] == 1 and cap["params"] == V1_VIEW else None
            equal(cap["params"], want, f"{where}: core.protocol params (3.5)")
        if frame["protocol"] == 2:
            self.whole = m
        self.manifest = m
        self.limits = frame["limits"]
        self.hellos += 1

    def take_item(self, frame):
        check_map(frame, ITEM_SPEC, "item frame")
        s = self.streams.get(frame["req_id"])
        check(s is not None, "an item only for a stream we opened (4.9)", frame["req_id"])
        check(s.response is None, f"{s}: every item before the stream's response (4.9)", frame)
        size = len(enc(frame["item"]))
        check(s.held_items >= 1 and s.held_bytes >= size, f"{s}: an item only within the credit granted (4.9)",
              f"item {len(s.items)} of {size} bytes", f"credit of {s.held_items} items, {s.held_bytes} bytes")
        s.held_items -= 1
        s.held_bytes -= size
        s.items.append(frame["item"])
        s.bytes += size

    def take_stream_response(self, frame):
        s = self.streams[frame["req_id"]]
        check_response(frame, f"{s} response")
        if s.repeats:  # 4.4: a repeat of the control frame is answered on the same req_id
            s.repeats -= 1
            s.repeat_answers.append(frame)
            return
        check(s.response is None, f"{s}: exactly one response ends a stream (4.9)", frame)
        s.response = frame

    def open(self):
        """4.1: the node's first hello, and on a version-2 session whose
        first hello was a partial view, the protocol-2 hello after it."""
        frame = self.read_frame()
        equal(frame["type"], "hello", "first record from the node is a hello (4.1)")
        while self.awaiting_whole:
            self.read_frame()

    def quiet(self, seconds=QUIET):
        """The frames that arrive within `seconds` (each checked as it is
        read); keepalive messages don't count."""
        got = []
        end = time.monotonic() + seconds
        while True:
            if self.t.records:
                got.append(self.read_frame())
                continue
            if self.t.closed is not None:
                self.t.read_record()  # raises PeerClosed
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.t.sock], [], [], left)[0]:
                return got
            self.t.read_message()

    # ---- streams

    def new_req_id(self):
        req_id = str(self.next_req)
        self.next_req += 1
        return req_id

    def control(self, cap, verb, req_id, args, budget_ms=None):
        frame = {"type": "control", "cap": cap, "verb": verb, "req_id": req_id}
        if budget_ms is not None:
            frame["budget_ms"] = budget_ms
        frame["args"] = args
        return frame

    def open_stream(self, cap, verb, args, credit=None, budget_ms=60_000):
        """4.9: the control frame, then (when given) the first credit, the
        stream's window, in one transport message."""
        s = Stream(self.new_req_id(), cap, verb, args)
        self.streams[s.req_id] = s
        records = [enc(self.control(cap, verb, s.req_id, args, budget_ms))]
        if credit is not None:
            records.append(enc(self.credit_frame(s, *credit)))
        self.t.send_records(records)
        return s

    def credit_frame(self, s, items, nbytes):
        # 4.9: credit held beyond 2^32-1 is not counted.
        s.held_items = min(s.held_items + items, U32)
        s.held_bytes = min(s.held_bytes + nbytes, U32)
        return {"type": "credit", "req_id": s.req_id, "items": items, "bytes": nbytes}

    def grant(self, s, items, nbytes):
        self.send(self.credit_frame(s, items, nbytes))

    def event(self, s):
        """The next frame of stream `s`: ("item", value), ("response", frame)
        or ("repeat", frame), the answer to a repeat of its control frame."""
        while True:
            seen = len(s.items)
            frame = self.read_frame()
            if frame["type"] == "hello":
                continue
            check(frame.get("req_id") == s.req_id and frame["type"] in ("item", "response"),
                  f"{s}: only its items and response come", frame)
            if frame["type"] == "item":
                equal(len(s.items), seen + 1, f"{s}: item counted")
                return "item", frame["item"]
            return ("response" if s.response is frame else "repeat"), frame

    def take(self, s, n):
        """Exactly `n` more items of `s`, before any response."""
        got = []
        while len(got) < n:
            try:
                kind, value = self.event(s)
            except Mismatch as e:
                raise Mismatch(f"{s}: {len(got)} of the {n} items expected came, the node holding credit for "
                               f"{s.held_items} items and {s.held_bytes} bytes ({e})")
            check(kind == "item", f"{s}: {n} items before any response", value, "an item")
            got.append(value)
        return got

    def end(self, s):
        """Items until the stream's response; returns (items, response)."""
        got = []
        while True:
            kind, value = self.event(s)
            check(kind != "repeat", f"{s}: no answer to a repeat we did not send", value)
            if kind == "response":
                return got, value
            got.append(value)

    def nothing_more(self, s, what):
        extra = self.quiet()
        equal(extra, [], f"{s}: nothing more comes {what}")


def our_hello_v2(public):
    """4.1, 3.5: peer.py's minimal hello, listing core.protocol 2.0.0 too.
    Our manifest has no stream verb, so this is our whole manifest and no
    protocol-2 hello of ours follows."""
    hello = v1.our_hello(public)
    hello["manifest"]["capabilities"].append(
        {"id": "core.protocol", "version": "2.0.0", "params": None,
         "verbs": [{"name": "versions", "kind": "request", "class": "bootstrap", "args_schema": None,
                    "result_schema": None}]})
    return hello


def connect(addr, node_hex, hello):
    secret = os.urandom(32)
    t, rs, _ = v1.handshake(addr, secret)
    equal(rs.hex(), node_hex, "responder's static key is the node id")
    public = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()
    return t, rs, hello(public)


def expect_close(peer, code, what):
    """4.6: only hellos before the node's close frame, then CLOSE 0."""
    try:
        while True:
            frame = peer.read_frame()
            check(frame["type"] == "hello", f"{what}: only a hello comes before the close", frame)
    except PeerClosed as e:
        check(e.how.startswith(f"close frame code {code!r}"), f"{what}: the node closes with {code}", e.how)
    try:
        while True:
            peer.t.read_record()
    except PeerClosed:
        check(peer.t.closed is not None and peer.t.closed[0] == 0, f"{what}: a transport CLOSE code 0 after the "
              "close frame (4.6)", peer.t.closed, "(0, reason)")
    peer.t.sock.close()


def long_text():
    """About 2000 words of several scripts, separated by runs of white space,
    one of them over a transport message's room (so its item is a split
    record, 1.5)."""
    base = ["stream", "credit", "würfel", "日本語", "🦀", "a", "bytes-and-items", "ñ", "Ωmega"]
    words = [f"{base[i % len(base)]}{i}" for i in range(2000)]
    words[5] = "L" * 70_000
    seps = [" ", "  ", "\n", "\t", " \n "]
    return "".join(w + seps[i % len(seps)] for i, w in enumerate(words))


# ------------------------------------------------------------------- checks

def session_v2(addr, node_hex):
    t, rs, hello = connect(addr, node_hex, our_hello_v2)
    peer = Peer2(t, rs)
    peer.send(hello)
    peer.open()
    equal(peer.version, 2, "the session is version 2: both first hellos list core.protocol 2.0.0 (4.1)")
    first, whole = peer.first, peer.whole
    check(whole is not None, "a protocol-2 hello followed the version-1 view (4.1)")
    major = int(str(protocol_cap(first)["version"]).split(".")[0])
    check(major >= 2, "core.protocol's major version is 2 or more on a node that speaks protocol 2 (3.5)",
          protocol_cap(first)["version"])
    equal(protocol_cap(first)["params"], V1_VIEW, "first hello: core.protocol params (3.5)")
    equal(stream_verbs(first), [], "first hello: no stream verb (3.1, 4.1)")
    equal(enc(version_1_view(whole)), enc(first), "the first hello is the version-1 view of the whole manifest (4.1)")
    caps = {c["id"]: c for c in whole["capabilities"]}
    tell = next((v for v in caps.get("app.agent", {"verbs": []})["verbs"] if v["name"] == "tell"), None)
    check(tell is not None, "the whole manifest lists app.agent/tell", stream_verbs(whole))
    equal((tell["kind"], tell["class"]), ("stream", "bootstrap"), "app.agent/tell kind and class")
    check(tell["result_schema"] is not None, "app.agent/tell has an item schema (3.1)")
    try:
        schema = json.loads(tell["result_schema"])
    except ValueError as e:
        raise Mismatch(f"app.agent/tell's item schema is JSON text (3.1): {e}")
    check(isinstance(schema, dict) and schema.get("type") == "string", "app.agent/tell's item schema: a text",
          schema)
    ok(f"hellos: protocol 1 with the version-1 view (no stream verb, core.protocol major >= 2, params {V1_VIEW!r}), "
       f"then protocol 2 at the same epoch {whole['epoch']} with the whole manifest (streams {stream_verbs(whole)}), "
       "before any other frame")
    return peer


def check_versions(peer):
    result = peer.expect_ok("core.protocol", "versions", {})
    check_map(result, [("versions", lambda v: v[:2] == [1, 2] and v == sorted(set(v)), True)],
              "core.protocol/versions result (3.5): 1 and 2, lowest first")
    ok(f"core.protocol/versions -> {result}")


def check_flow_control(peer):
    name = peer.manifest["name"]
    txt = long_text()
    words = f"{name}: {txt}".split()
    sizes = [len(enc(w)) for w in words]
    # The window: exactly what the first 8 items and all but one byte of the 9th cost.
    window = sum(sizes[:8]) + sizes[8] - 1
    check(max(sizes) <= window and len(words) > 120, "test setup: every item fits the window")
    s = peer.open_stream("app.agent", "tell", txt, credit=(5, window))
    got = peer.take(s, 5)
    peer.nothing_more(s, "once 5 items used the 5 items granted")
    peer.grant(s, 0, 0)
    peer.nothing_more(s, "after a grant of 0 items and 0 bytes")
    ok(f"stream app.agent/tell of {len(txt.encode())} bytes: control + credit (5 items, {window} bytes): "
       "5 items, then nothing (also after a grant of 0 and 0)")
    peer.grant(s, 100, 0)
    got += peer.take(s, 3)
    peer.nothing_more(s, "when the bytes left are one short of the next item")
    peer.grant(s, 0, 1)
    got += peer.take(s, 1)
    peer.nothing_more(s, "once the bytes granted are used to the last byte")
    equal(s.held_bytes, 0, f"{s}: the bytes granted are used exactly")
    ok(f"byte credit: 100 more items but bytes for 3 items and all but one byte of the 4th: 3 items "
       f"(one of {sizes[6]} bytes, a split record); 1 byte more: exactly the 4th; then nothing")
    peer.grant(s, 0, 1 << 20)
    got += peer.take(s, 96)
    peer.nothing_more(s, "once the 100 items granted are used")
    ok(f"item credit: bytes to spare, items left 96: 96 items, then nothing ({len(got)} items so far)")
    peer.grant(s, U32, U32)
    peer.grant(s, U32, U32)  # credit held beyond 2^32-1 is not counted, and no error (4.9)
    rest, response = peer.end(s)
    got += rest
    equal(response, {"type": "response", "req_id": s.req_id, "ok": True, "result": None},
          f"{s}: the response after the last item")
    check(all(isinstance(w, str) for w in got), f"{s}: every item is a text")
    equal(got, words, f"{s}: the items are the words of NAME: TEXT, in order")
    equal(s.bytes, sum(sizes), f"{s}: encoded item bytes")
    peer.nothing_more(s, "after its response")
    ok(f"two grants of 2^32-1 items and bytes: the other {len(rest)} items, then ok, result null; "
       f"{len(got)} items, {s.bytes} item bytes, never beyond the credit; the words re-form the text")
    return s


def check_stream_errors(peer):
    name = peer.manifest["name"]
    s = peer.open_stream("app.agent", "tell", 5, credit=(10, 1000))
    items, response = peer.end(s)
    equal((items, response["ok"], response.get("err", {}).get("code")), ([], False, "bad_args"),
          "a stream with args that are not a text: bad_args, no item (4.9)")
    s = peer.open_stream("app.agent", "tell", "x" * 200, credit=(10, 100))
    items, response = peer.end(s)
    equal((items, response.get("err", {}).get("code")), ([f"{name}:"], "too_large"),
          "a window of 100 bytes and an item of 202: the item before it, then too_large (4.9)")
    s = peer.open_stream("app.agent", "tell", "no credit at all", budget_ms=300)
    items, response = peer.end(s)
    equal((items, response.get("err", {}).get("code")), ([], "timeout"),
          "a stream with no credit and a budget of 300 ms: timeout, no item (4.9)")
    ok("streams refused or ended by the node: bad_args (no item), too_large (an item over the window of the "
       "first grant, after the one that fit), timeout (no credit, at the budget)")


def check_notification(peer):
    # 4.3: a notification-shaped frame for a stream verb is dropped.
    peer.send(peer.control("app.agent", "tell", "", "dropped words", None))
    result = peer.expect_ok("core.protocol", "versions", {})
    extra = peer.quiet()
    equal(extra, [], "nothing comes for a stream verb sent as a notification")
    ok(f"app.agent/tell as a notification: dropped, nothing came back (versions -> {result})")


def check_cancel(peer):
    txt = " ".join(f"w{i}" for i in range(50))
    s = peer.open_stream("app.agent", "tell", txt, credit=(3, 1 << 20))
    got = peer.take(s, 3)
    cancel = {"type": "cancel", "req_id": s.req_id}
    peer.t.send_records([enc(peer.credit_frame(s, 10, 1 << 20)), enc(cancel)])
    more, response = peer.end(s)
    equal(response.get("err", {}).get("code"), "cancelled", f"{s}: cancelled (4.5, 4.9)")
    check(len(more) <= 10, f"{s}: no item beyond the credit", len(more))
    equal(got + more, f"{peer.manifest['name']}: {txt}".split()[:3 + len(more)], f"{s}: the items before it")
    peer.nothing_more(s, "after it was cancelled")
    ok(f"cancel mid-way (3 items taken, credit for 10 more and the cancel in one message): {len(more)} items, "
       "then cancelled; nothing after")


def check_duplicates(peer, ended):
    txt = " ".join(f"d{i}" for i in range(10))
    s = peer.open_stream("app.agent", "tell", txt, credit=(2, 1 << 20))
    got = peer.take(s, 2)
    s.repeats += 1
    peer.send(peer.control("app.agent", "tell", s.req_id, txt, 60_000))
    kind, answer = peer.event(s)
    equal(kind, "repeat", f"{s}: the repeat is answered while the stream waits for credit")
    s.repeat_answers.pop()
    equal((answer["ok"], answer.get("err", {}).get("code")), (False, "duplicate"),
          "a repeated req_id of an open stream (4.4)")
    peer.grant(s, 100, 1 << 20)
    rest, response = peer.end(s)
    equal(got + rest, f"{peer.manifest['name']}: {txt}".split(), f"{s}: the stream goes on after the repeat")
    check(response["ok"], f"{s}: ends ok", response)
    ok(f"a repeated req_id of an open stream -> duplicate ({answer['err']['message']!r}); the stream went on "
       f"to its {len(got + rest)} items and ok")
    for s in (s, ended):
        s.repeats += 1
        peer.send(peer.control("app.agent", "tell", s.req_id, s.args, 60_000))
        frame = peer.read_frame()
        check(frame["type"] == "response" and s.repeat_answers, f"{s}: the repeat is answered", frame)
        answer = s.repeat_answers.pop()
        equal(answer.get("err", {}).get("code"), "duplicate", "a repeated req_id of an ended stream (4.4)")
    # The same req_id on another verb is answered duplicate, never with another verb's answer (4.4).
    s.repeats += 1
    peer.send(peer.control("app.agent", "echo", s.req_id, "x", 60_000))
    frame = peer.read_frame()
    check(frame["type"] == "response" and s.repeat_answers, f"{s}: the repeat on echo is answered", frame)
    equal(s.repeat_answers.pop().get("err", {}).get("code"), "duplicate", "a stream's req_id on another verb (4.4)")
    ok(f"a repeated req_id of an ended stream -> duplicate ({answer['err']['message']!r}), also that of the "
       "long stream and on app.agent/echo")


def check_ignored(peer, ended):
    # 4.9: credit with no open stream, and an item for no call of the node's, are ignored.
    peer.send({"type": "credit", "req_id": "no-such-stream", "items": 5, "bytes": 100})
    peer.send({"type": "credit", "req_id": ended.req_id, "items": 5, "bytes": 100})
    peer.send({"type": "item", "req_id": "no-such-call", "item": "stray"})
    result = peer.expect_ok("app.agent", "echo", "still here")
    equal(result, f"{peer.manifest['name']}: still here", "app.agent/echo after ignored frames")
    ok("credit for an unknown req_id and for an ended stream, an item for no call: ignored; the session goes on")


def check_v1_sessions(addr, node_hex, v2peer):
    # A version-1 peer (no core.protocol) on the same node: the version-1 view, and no protocol-2 hello.
    t, rs, hello = connect(addr, node_hex, v1.our_hello)
    peer = Peer2(t, rs, we_speak_2=False)
    peer.send(hello)
    peer.open()
    equal(peer.version, 1, "a peer without core.protocol gets a version-1 session (4.1)")
    equal(enc(peer.manifest), enc(version_1_view(v2peer.whole)), "a version-1 peer's hello: the version-1 view (4.1)")
    err = peer.expect_err("app.agent", "tell", "hello", "unknown_verb")
    peer.send(peer.control("app.agent", "tell", "", "dropped", None))
    result = peer.expect_ok("app.agent", "echo", "v1")
    equal(peer.hellos, 1, "no second hello on a version-1 session")
    ok(f"version-1 session: the version-1 view, no protocol-2 hello; app.agent/tell -> unknown_verb "
       f"({err['message']!r}); as a notification: nothing; echo -> {result!r}")
    peer.send({"type": "credit", "req_id": "1", "items": 1, "bytes": 1})
    expect_close(peer, "protocol_error", "credit on a version-1 session")
    ok("a credit frame on a version-1 session -> close protocol_error, then CLOSE 0")

    t, rs, hello = connect(addr, node_hex, v1.our_hello)
    peer = Peer2(t, rs, we_speak_2=False)
    peer.send(hello)
    peer.open()
    peer.send({"type": "item", "req_id": "1", "item": "x"})
    expect_close(peer, "protocol_error", "item on a version-1 session")
    ok("an item frame on a version-1 session -> close protocol_error, then CLOSE 0")

    # 4.1: a first hello must name protocol 1, whatever the sender speaks.
    t, rs, hello = connect(addr, node_hex, our_hello_v2)
    hello["protocol"] = 2
    peer = Peer2(t, rs)
    peer.send(hello)
    expect_close(peer, "unsupported_protocol", "a first hello naming protocol 2")
    ok("a first hello naming protocol 2 -> close unsupported_protocol, then CLOSE 0")


def close(peer):
    peer.send({"type": "close", "code": "normal", "reason": "done"}, close=(0, "done"))
    try:
        while True:
            frame = peer.read_frame()
            check(frame["type"] == "hello", "after our close only a hello may come", frame)
    except PeerClosed as e:
        check("inside a message" not in e.how, "the node ends the stream cleanly", e.how)
    peer.t.sock.close()
    ok("close: sent close frame + CLOSE 0")


def run(addr, node_hex, wire_md):
    check_worked_example(wire_md)
    peer = session_v2(addr, node_hex)
    check_versions(peer)
    long = check_flow_control(peer)
    check_stream_errors(peer)
    check_notification(peer)
    check_cancel(peer)
    check_duplicates(peer, long)
    check_ignored(peer, long)
    check_v1_sessions(addr, node_hex, peer)
    check_versions(peer)  # the version-2 session outlived the others
    close(peer)


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
    print("pypeer v2: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
