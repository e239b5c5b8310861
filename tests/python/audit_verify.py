#!/usr/bin/env python3
"""Independent verifier of a capwire node's audit log (WIRE.md 5.6 `core.audit`).

Written from WIRE.md alone, not from the Rust source: 5.6 (entries, the tree,
checkpoints, what a control plane checks), 1.1 (node ids, canonical keys), 2.1
(the strict CBOR profile), 2.4 (error codes), 4.10 (task states), 5.5
(revocation ids). Needs `cryptography` (pinned via noiseprotocol in
requirements.txt); the self-test also uses `cbor2` to cross-check its encoder.

    audit_verify.py DUMP.json    one `ok`/`FAIL` line per check, then a summary; exit 0
                                 when all pass, 1 when one fails, 2 on unusable input
    audit_verify.py --self-test  builds a log in memory, checks that it passes and
                                 that each tampering of it fails
"""
import base64, contextlib, copy, hashlib, io, json, os, re, sys, tempfile

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HEX = re.compile(r"(?:[0-9a-f]{2})*\Z")
HASH_HEX = re.compile(r"[0-9a-f]{64}\Z")


class InputError(Exception):
    """The dump is unusable (exit 2), as opposed to a check that fails (exit 1)."""


# ---------------------------------------------------------------- 2.1 the strict CBOR profile

class CborError(Exception):
    pass


class CMap(list):
    """A decoded map: its (key, value) pairs in the order they were written."""


def cbor_decode(data):
    item, pos = _item(data, 0, 0)
    if pos != len(data):
        raise CborError("bytes follow the item (rule 1)")
    return item


def _item(data, pos, depth):
    if pos >= len(data):
        raise CborError("truncated")
    major, ai, pos = data[pos] >> 5, data[pos] & 31, pos + 1
    why = ("a tag (rule 2)" if major == 6 else "indefinite length or break (rule 3)" if ai == 31
           else "reserved additional information (rule 5)" if ai in (28, 29, 30) else None)
    if major == 7 and not why:
        if ai in (20, 21, 22):
            return (False, True, None)[ai - 20], pos
        why = "a float: no entry field is one (rule 7)" if ai in (25, 26, 27) else \
            "a simple value other than false, true, null (rule 6)"
    if why:
        raise CborError(why)
    val = ai
    if ai >= 24:
        n = 1 << (ai - 24)
        if pos + n > len(data):
            raise CborError("truncated")
        val, pos = int.from_bytes(data[pos:pos + n], "big"), pos + n
        if val < (24, 256, 65536, 1 << 32)[ai - 24]:
            raise CborError("an integer or length not in shortest form (rule 4)")
    if major in (0, 1):
        return (val if major == 0 else -1 - val), pos
    left = len(data) - pos
    if val > (left // 2 if major == 5 else left):
        raise CborError("a length or count beyond the input (rule 12)")
    if major == 2:
        return bytes(data[pos:pos + val]), pos + val
    if major == 3:
        try:
            return bytes(data[pos:pos + val]).decode("utf-8"), pos + val
        except UnicodeDecodeError:
            raise CborError("text that is not UTF-8 (rule 8)") from None
    if depth >= 32:
        raise CborError("nested deeper than 32 (rule 11)")
    if major == 4:
        out = []
        for _ in range(val):
            x, pos = _item(data, pos, depth + 1)
            out.append(x)
        return out, pos
    pairs, seen = CMap(), set()  # major 5
    for _ in range(val):
        start = pos
        if pos < len(data) and data[pos] >> 5 > 3:
            raise CborError("a map key that is not an integer or string (rule 9)")
        k, pos = _item(data, pos, depth + 1)
        if data[start:pos] in seen:
            raise CborError(f"duplicate key {k!r} (rule 10)")
        seen.add(data[start:pos])
        v, pos = _item(data, pos, depth + 1)
        pairs.append((k, v))
    return pairs, pos


# ---------------------------------------------------------------- 5.6 entries

UINT, TEXT, B32, ITEM = "an unsigned integer", "text", "a 32-byte byte string", "any data item"
KEYS = "an array of 32-byte byte strings"
# 5.6's table, in its order, which is also length-then-byte order (the self-test checks).
ENTRY_KEYS = {"i": UINT, "k": TEXT, "t": UINT, "by": TEXT, "arg": B32, "cap": TEXT,
              "req": TEXT, "args": ITEM, "peer": B32, "verb": TEXT, "class": TEXT, "epoch": UINT,
              "grant": TEXT, "detail": TEXT, "holders": KEYS, "outcome": TEXT}
KEY_ORDER = list(ENTRY_KEYS)
# 5.6's bullet list: per kind, the keys it must have and those it may have, besides i, k, t.
KINDS = {
    "call": ({"peer", "cap", "verb", "arg", "class", "outcome"}, {"req", "args", "by", "epoch", "grant"}),
    "bind": ({"peer", "epoch", "detail"}, set()),
    "grant": ({"detail", "epoch", "grant"}, {"peer", "holders"}),
    "task": ({"peer", "cap", "verb", "detail", "outcome"}, set()),
    "prune": ({"detail"}, set()),
    "open": ({"detail"}, set()),
}
# Values a field takes, per (kind, key): a tuple of words, or a pattern.
VALUES = {
    ("call", "class"): ("bootstrap", "controller", "deny"),
    ("call", "by"): ("bootstrap", "control_plane", "grant"),
    ("call", "outcome"): r"[a-z][a-z0-9_]{0,63}",  # `ok`, `replayed`, `dropped` or a code (2.4)
    ("bind", "detail"): ("bound", "unbound", "undone"),
    ("grant", "detail"): ("presented", "revoked"),
    ("task", "outcome"): ("submitted", "working", "input_required", "completed", "failed",
                          "canceled", "rejected"),  # 4.10
    ("task", "detail"): r"[0-9a-f]{32}",  # a task id (4.10)
}
for _kind in KINDS:
    VALUES[(_kind, "grant")] = r"[0-9a-f]{2,128}"  # a revocation id (5.5)


def check_entry(data, index):
    """Why the entry at `index` breaks 5.6, or None."""
    try:
        m = cbor_decode(data)
    except CborError as e:
        return f"not one item of the strict profile: {e}"
    if not isinstance(m, CMap):
        return "not a map"
    keys = [k for k, _ in m]
    unknown = [k for k in keys if k not in ENTRY_KEYS]
    if unknown:
        return f"unknown key {unknown[0]!r}"
    if keys != sorted(keys, key=KEY_ORDER.index):
        return f"keys not in the table's order: {keys}"
    e = dict(m)
    for k, v in e.items():
        want = ENTRY_KEYS[k]
        if not {UINT: type(v) is int and v >= 0, TEXT: type(v) is str,
                B32: type(v) is bytes and len(v) == 32, ITEM: True,
                KEYS: isinstance(v, list) and len(v) > 0
                and all(type(k) is bytes and len(k) == 32 for k in v)}[want]:
            return f"`{k}` is not {want}: {v.hex() if isinstance(v, bytes) else repr(v)}"
    for k in ("i", "k", "t"):
        if k not in e:
            return f"no `{k}`"
    if e["i"] != index:
        return f"`i` is {e['i']} at index {index}"
    kind = e["k"]
    if kind not in KINDS:
        return f"unknown kind {kind!r}"
    need, may = KINDS[kind]
    if need - set(e):
        return f"a {kind} entry without {sorted(need - set(e))}"
    if set(e) - need - may - {"i", "k", "t"}:
        return f"a {kind} entry with {sorted(set(e) - need - may - {'i', 'k', 't'})}"
    for k, v in e.items():
        want = VALUES.get((kind, k))
        if isinstance(want, tuple) and v not in want or isinstance(want, str) and not re.fullmatch(want, v):
            return f"{kind} `{k}` {v!r} is not " + (" or ".join(want) if isinstance(want, tuple) else want)
    if "peer" in e and int.from_bytes(e["peer"], "little") >= 2**255 - 19:
        return "`peer` is not a key in canonical form (1.1)"
    by = e.get("by")
    # "An admitted call also has `by` (and `epoch` under the control plane or a grant,
    # `grant` under a grant). A denied call has no `by`."
    if kind == "call" and ("epoch" in e) != (by in ("control_plane", "grant")):
        return f"`epoch` on a call with `by` {by}" if "epoch" in e else f"no `epoch` on a call with `by` {by}"
    if kind == "call" and ("grant" in e) != (by == "grant"):
        return f"`grant` on a call with `by` {by}" if "grant" in e else "no `grant` on a call with `by` grant"
    if kind == "grant" and e["detail"] == "presented" and e.get("holders", [None])[-1] != e.get("peer"):
        return "a presented grant's last holder is not its presenter (5.6)"
    if kind == "grant" and ("peer" in e) != (e["detail"] == "presented"):
        return "a presented grant has `peer` (the holder), a revoked one none"
    return None


def entry_kind(hx):
    try:
        return str(dict(cbor_decode(bytes.fromhex(hx))).get("k", "?"))
    except (CborError, TypeError, ValueError):
        return "?"


# ---------------------------------------------------------------- 5.6 the tree (RFC 6962 2.1, RFC 9162 2.1)

def sha256(b):
    return hashlib.sha256(b).digest()


def leaf_hash(entry):
    return sha256(b"\x00" + entry)


def node_hash(left, right):
    return sha256(b"\x01" + left + right)


def split(n):
    """RFC 6962's k: the largest power of two below n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def verify_inclusion(index, size, leaf, proof, root):
    """RFC 9162 2.1.3.2."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(first, second, proof, first_root, second_root):
    """RFC 9162 2.1.4.2, which needs 0 < first < second; the other cases are ours."""
    if first >= second or first == 0:
        return not proof and first <= second and first_root == (second_root if first else sha256(b""))
    if not proof:
        return False
    if first & (first - 1) == 0:
        proof = [first_root] + proof
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root


def path_ranges(m, n):
    """The leaf ranges [lo, hi) of the siblings in leaf m's inclusion path, bottom-up."""
    out, lo, hi = [], 0, n
    while hi - lo > 1:
        k = split(hi - lo)
        out.append((lo + k, hi) if m < lo + k else (lo, lo + k))
        lo, hi = (lo, lo + k) if m < lo + k else (lo + k, hi)
    return out[::-1]


def kept_root(leaves, pruned, n, known):
    """The root of n leaves, leaves[j] being leaf pruned+j; the complete subtrees below
    `pruned` (which a pruned log keeps, 5.6 "Bounds") come from `known`; None if one lacks."""
    def mth(lo, hi):
        if hi <= pruned:
            return known.get((lo, hi))
        if hi - lo == 1:
            return leaves[lo - pruned]
        left, right = mth(lo, lo + split(hi - lo)), mth(lo + split(hi - lo), hi)
        return None if left is None or right is None else node_hash(left, right)
    return sha256(b"") if n == 0 else mth(0, n)


# ---------------------------------------------------------------- 5.6 checkpoints (C2SP signed-note)

def b64_strict(s, length=None):
    """Standard base64 with padding, in its one canonical spelling."""
    if not re.fullmatch(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", s):
        raise ValueError(f"not standard padded base64: {s[:60]!r}")
    raw = base64.b64decode(s, validate=True)
    if base64.b64encode(raw).decode() != s:
        raise ValueError(f"non-canonical base64: {s[:60]!r}")
    if length is not None and len(raw) != length:
        raise ValueError(f"{len(raw)} bytes of base64, not {length}")
    return raw


def parse_vkey(text, node_id):
    """`<name>+<key id, 8 hex digits>+<base64(01 || public key)>`."""
    name, _, rest = text.partition("+")
    kid_hex, _, key64 = rest.partition("+")
    if name != f"capwire.audit/{node_id}":
        raise ValueError(f"name {name!r} is not capwire.audit/<node_id>")
    if not re.fullmatch(r"[0-9a-f]{8}", kid_hex):
        raise ValueError(f"key id {kid_hex!r} is not 8 hex digits")
    key = b64_strict(key64, 33)
    if key[0] != 0x01:
        raise ValueError(f"key type {key[0]:#04x} is not 01 (Ed25519)")
    kid = sha256(name.encode() + b"\n\x01" + key[1:])[:4]
    if kid.hex() != kid_hex:
        raise ValueError(f"key id {kid_hex} is not SHA-256(name || 0a || 01 || key)[:4] = {kid.hex()}")
    return name, kid, Ed25519PublicKey.from_public_bytes(key[1:])


def verify_note(text, name, kid, pub):
    """(size, root, why): `why` None when the note is a checkpoint signed by our key;
    size and root are None when the note's body does not even parse."""
    body, blank, sigs = text.partition("\n\n")
    lines = body.split("\n")
    if not blank or len(lines) != 3:
        return None, None, "format: not origin, size, root, a blank line, then signatures"
    if lines[0] != name:
        return None, None, f"format: origin {lines[0]!r} is not the key's name"
    if not re.fullmatch(r"0|[1-9][0-9]{0,18}", lines[1]):
        return None, None, f"format: size {lines[1]!r} is not decimal without leading zeros"
    try:
        size, root = int(lines[1]), b64_strict(lines[2], 32)
    except ValueError as e:
        return None, None, f"format: root: {e}"
    if not sigs.endswith("\n"):
        return size, root, "format: no newline after the last signature line"
    ours = []
    for line in sigs[:-1].split("\n"):
        sname, space, b64 = line[2:].partition(" ")
        if not line.startswith("\u2014 ") or not space or not sname or " " in b64:
            return size, root, f"format: not a signature line `\u2014 <name> <base64>`: {line[:80]!r}"
        try:
            blob = b64_strict(b64)
        except ValueError as e:
            return size, root, f"format: signature: {e}"
        if len(blob) < 5:
            return size, root, "format: a signature shorter than a key id"
        if sname == name and blob[:4] == kid:  # others' lines (a witness's) are ignored
            ours.append(blob[4:])
    if not ours:
        return size, root, "no signature line by the node's audit key"
    for sig in ours:
        try:
            pub.verify(sig, (body + "\n").encode())  # the first three lines with their newlines
        except InvalidSignature:
            return size, root, "Ed25519 signature does not verify"
    return size, root, None


# ---------------------------------------------------------------- the checks

def load(dump):
    """The dump's fields, checked for shape; InputError when it has none usable."""
    def field(obj, key, typ, what):
        v = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(v, typ) or isinstance(v, bool) or (typ is int and v < 0):
            raise InputError(f"{what}: `{key}` missing or not {typ.__name__}")
        return v
    if not isinstance(dump, dict):
        raise InputError("not a JSON object")
    if not re.fullmatch(r"[0-9a-f]{64}", field(dump, "node_id", str, "dump")):
        raise InputError("node_id is not 64 lowercase hex digits (1.1)")
    notes = field(dump, "checkpoints", list, "dump")
    if not notes or not all(isinstance(n, str) for n in notes):
        raise InputError("no checkpoints, or one that is not text")
    field(dump, "vkey", str, "dump"), field(dump, "pruned", int, "dump")
    for e in field(dump, "entries", list, "dump"):
        field(e, "index", int, "entry"), field(e, "entry", str, "entry")
    for what, first in (("inclusion", "index"), ("consistency", "from")):
        for p in field(dump, what, list, "dump"):
            field(p, first, int, what), field(p, "size", int, what), field(p, "proof", list, what)
    return dump


class Report:
    def __init__(self):
        self.failed = False

    def ok(self, what):
        print(f"ok   {what}")

    def fail(self, what, why):
        print(f"FAIL {what}: {why}")
        self.failed = True

    def group(self, fails, passed):
        """A FAIL line per failure (the first 8), or one `ok` line."""
        for what, why in fails[:8]:
            self.fail(what, why)
        if len(fails) > 8:
            self.fail("...", f"{len(fails) - 8} more like these")
        if not fails:
            self.ok(passed)


def verify(dump, rep):
    node_id, notes, pruned = dump["node_id"], dump["checkpoints"], dump["pruned"]
    entries, incl, cons = dump["entries"], dump["inclusion"], dump["consistency"]

    # 1. The verifier key (5.6 "Checkpoints").
    try:
        name, kid, pub = parse_vkey(dump["vkey"], node_id)
        rep.ok(f"vkey {name}+{kid.hex()}")
    except ValueError as e:
        rep.fail("vkey", e)
        return

    # 2. Every note: its format and our key's signature. 3. Never shrinking, never forking,
    # and (5.6 "What a control plane checks") each growth with a consistency proof.
    roots, bad_sizes, kept, grown = {}, set(), None, []
    for j, text in enumerate(notes):
        size, root, why = verify_note(text, name, kid, pub)
        last = (size, None if why else root)
        if why:
            rep.fail(f"checkpoint {j}", why)
            bad_sizes.add(size)
            continue
        rep.ok(f"checkpoint {j}: size {size}, signed by the node's audit key")
        roots.setdefault(size, root)
        if kept is None or size > kept[0]:
            if kept is not None and 0 < kept[0] and kept[0] >= pruned:
                grown.append((kept[0], size))
            kept = (size, root, j)
        elif size < kept[0]:
            rep.fail(f"checkpoint {j}",
                     f"rolled back or truncated: size {size} after {kept[0]} (checkpoint {kept[2]})")
        elif root != kept[1]:
            rep.fail(f"checkpoint {j}", f"forked: size {size} with another root than checkpoint {kept[2]}")
    have = {(c["from"], c["size"]) for c in cons}
    rep.group([(f"growth {a} -> {b}", "no consistency proof in the dump")
               for a, b in grown if (a, b) not in have],
              f"each growth between checkpoints has a consistency proof ({len(grown)})")

    def root_of(size, what):
        """The root of the verified checkpoint of `size`; None when it did not verify."""
        if size in roots or bad_sizes:
            return roots.get(size)
        raise InputError(f"{what}: size {size} matches no checkpoint")

    def hashes(proof):
        ok = all(isinstance(h, str) and HASH_HEX.match(h) for h in proof)
        return [bytes.fromhex(h) for h in proof] if ok else None

    # 4. Consistency proofs (RFC 9162 2.1.4.2) between the checkpoints' roots.
    fails = []
    for c in cons:
        what, proof = f"consistency {c['from']} -> {c['size']}", hashes(c["proof"])
        ra, rb = root_of(c["from"], what), root_of(c["size"], what)
        if ra is None or rb is None:
            fails.append((what, "no verified checkpoint of its sizes"))
        elif proof is None:
            fails.append((what, "a proof hash is not 64 lowercase hex digits"))
        elif not verify_consistency(c["from"], c["size"], proof, ra, rb):
            fails.append((what, "does not verify between the two checkpoints' roots"))
    rep.group(fails, f"{len(cons)} consistency proofs verify")

    # 5. Entries: the profile, the table, the kinds; indices pruned..size-1 of the last checkpoint.
    size, root = last
    data, fails = {}, []
    for e in entries:
        if not HEX.match(e["entry"]):
            fails.append((f"entry {e['index']}", "not lowercase hex"))
            continue
        data.setdefault(e["index"], bytes.fromhex(e["entry"]))
        why = check_entry(bytes.fromhex(e["entry"]), e["index"])
        if why:
            fails.append((f"entry {e['index']}", why))
    indices = [e["index"] for e in entries]
    covered = size is not None and pruned <= size and indices == list(range(pruned, size)) \
        and len(data) == len(entries)  # every entry hex
    if not covered:
        fails.append(("entries", f"indices {indices[:3]}...{indices[-3:]} are not {pruned}..{size}-1 in order"
                      if size is not None else "the last checkpoint's size is unknown"))
    rep.group(fails, f"{len(entries)} entries decode per 5.6, indices {pruned}..{size}-1")

    # 6. Inclusion proofs (RFC 9162 2.1.3.2), then the root of the kept entries.
    fails, confirmed, known = [], set(), {}
    for p in incl:
        idx, n, proof = p["index"], p["size"], hashes(p["proof"])
        what = f"inclusion {idx} in {n}"
        r = root_of(n, what)
        if r is None:
            fails.append((what, "no verified checkpoint of its size"))
        elif idx not in data:
            fails.append((what, "no entry of that index in the dump"))
        elif proof is None:
            fails.append((what, "a proof hash is not 64 lowercase hex digits"))
        elif not verify_inclusion(idx, n, leaf_hash(data[idx]), proof, r):
            fails.append((what, "does not verify against the checkpoint's root"))
        else:
            confirmed.add(idx)
            if n == size:  # its hashes of subtrees left of `pruned` let us compute the root
                known.update((rg, h) for rg, h in zip(path_ranges(idx, n), proof) if rg[1] <= pruned)
    rep.group(fails, f"{len(incl)} inclusion proofs verify")
    if covered and root is None:
        rep.fail("root", "the last checkpoint did not verify")
    elif covered:
        got = kept_root([leaf_hash(data[i]) for i in range(pruned, size)], pruned, size, known)
        if got is None:
            rep.ok(f"root: the subtrees below {pruned} are unknown; each entry needs an inclusion proof")
        elif got == root:
            rep.ok(f"root of entries {pruned}..{size}-1 equals the last checkpoint's")
            confirmed.update(range(pruned, size))
        else:
            rep.fail("root", f"entries {pruned}..{size}-1 do not hash to the last checkpoint's root")
    rep.group([(f"entry {i}", "confirmed by no checkpoint's root nor inclusion proof")
               for i in sorted(data) if i not in confirmed], "every entry hashes to a signed root")


def summary(dump):
    kinds = {}
    for e in dump["entries"]:
        kinds[entry_kind(e["entry"])] = kinds.get(entry_kind(e["entry"]), 0) + 1
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
    print(f"summary: {len(dump['checkpoints'])} checkpoints, {len(dump['entries'])} entries, "
          f"{len(dump['inclusion'])} inclusion proofs, {len(dump['consistency'])} consistency proofs, "
          f"{len(kinds)} kinds seen {{{seen}}}")


def run(path):
    try:
        with open(path, encoding="utf-8") as f:
            dump = load(json.load(f))
        rep = Report()
        verify(dump, rep)
    except (OSError, ValueError, InputError) as e:  # json's errors are ValueErrors
        print(f"FAIL input: {e}")
        return 2
    summary(dump)
    return 1 if rep.failed else 0


# ---------------------------------------------------------------- self-test

def _cbor(x):
    """Hand encoder for entries: uint, text, bytes, arrays, and maps in the order given."""
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        ai, w = next((ai, w) for ai, w in ((24, 1), (25, 2), (26, 4), (27, 8)) if n < 1 << 8 * w)
        return bytes([major << 5 | ai]) + n.to_bytes(w, "big")
    if isinstance(x, int):
        return head(0, x)
    if isinstance(x, str):
        return head(3, len(x.encode())) + x.encode()
    if isinstance(x, bytes):
        return head(2, len(x)) + x
    if isinstance(x, list):
        return head(4, len(x)) + b"".join(_cbor(v) for v in x)
    return head(5, len(x)) + b"".join(_cbor(k) + _cbor(v) for k, v in x.items())


def _mth(leaves):  # RFC 6962 2.1, naively, over leaf hashes
    if len(leaves) <= 1:
        return leaves[0] if leaves else sha256(b"")
    k = split(len(leaves))
    return node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


def _path(m, leaves):  # RFC 6962 2.1.1
    if len(leaves) <= 1:
        return []
    k = split(len(leaves))
    if m < k:
        return _path(m, leaves[:k]) + [_mth(leaves[k:])]
    return _path(m - k, leaves[k:]) + [_mth(leaves[:k])]


def _subproof(m, leaves, whole):  # RFC 6962 2.1.2
    if m == len(leaves):
        return [] if whole else [_mth(leaves)]
    k = split(len(leaves))
    if m <= k:
        return _subproof(m, leaves[:k], whole) + [_mth(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [_mth(leaves[:k])]


def _entries():
    """A small log per the table and bullet list of 5.6 (keys in the table's order)."""
    a, b, arg = bytes(range(32)), bytes([9]) * 31 + b"\x7f", hashlib.blake2s(b"\xa0").digest()
    g, task, t = "ab" * 64, "0123456789abcdef" * 2, 1700000000000
    call = {"cap": "core.configuration", "req": "r1", "peer": a, "verb": "get_config", "class": "controller"}
    rows = [
        {"k": "open", "detail": "capwire 0.1.0"},
        {"k": "call", "by": "bootstrap", "arg": arg, "cap": "core.monitoring", "req": "r0", "peer": a,
         "verb": "bind", "class": "bootstrap", "outcome": "ok"},
        {"k": "bind", "peer": a, "epoch": 1, "detail": "bound"},
        {"k": "call", "by": "control_plane", "arg": arg, **call, "epoch": 1, "outcome": "ok"},
        {"k": "call", "arg": arg, **dict(call, peer=b), "outcome": "unauthorized"},
        {"k": "grant", "peer": b, "epoch": 1, "grant": g, "detail": "presented", "holders": [a, b]},
        {"k": "call", "by": "grant", "arg": arg, **dict(call, peer=b), "epoch": 1, "grant": g, "outcome": "ok"},
        {"k": "task", "cap": "app.jobs", "peer": b, "verb": "run", "detail": task, "outcome": "submitted"},
        {"k": "task", "cap": "app.jobs", "peer": b, "verb": "run", "detail": task, "outcome": "working"},
        {"k": "call", "arg": arg, "cap": "app.x", "peer": b, "verb": "ping", "class": "deny",
         "outcome": "unknown_verb"},
        {"k": "grant", "epoch": 1, "grant": g, "detail": "revoked"},
        {"k": "task", "cap": "app.jobs", "peer": b, "verb": "run", "detail": task, "outcome": "completed"},
        {"k": "prune", "detail": "below 0"},
    ]
    return [{"i": i, "k": r.pop("k"), "t": t + i, **r} for i, r in enumerate(rows)]


def self_test():
    import cbor2
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    def b64(b):
        return base64.b64encode(b).decode()

    # The node's keys as 5.6 derives them: the audit seed from the X25519 secret.
    x = X25519PrivateKey.generate()
    node_id = x.public_key().public_bytes_raw().hex()
    sk = Ed25519PrivateKey.from_private_bytes(
        hashlib.blake2s(b"capwire audit key v1", key=x.private_bytes_raw()).digest())
    name, pub = "capwire.audit/" + node_id, sk.public_key().public_bytes_raw()
    kid = sha256(name.encode() + b"\n\x01" + pub)[:4]
    vkey = f"{name}+{kid.hex()}+{b64(bytes([1]) + pub)}"
    assert KEY_ORDER == sorted(KEY_ORDER, key=lambda k: (len(k), k)), "5.6's table is not length-then-byte"

    def note(size, root, key=sk, size_text=None, key_name=name, key_id=kid):
        body = f"{name}\n{size_text or size}\n{b64(root)}\n"
        return f"{body}\n\u2014 {key_name} {b64(key_id + key.sign(body.encode()))}\n"

    def dump(rows, cps=(4, 9, 9, 13), pruned=0, incl=((0, 13), (4, 13), (5, 9), (12, 13)),
             cons=((4, 9), (9, 13)), raw=None):
        data = raw or [_cbor(r) for r in rows]
        leaves = [leaf_hash(d) for d in data]
        return {"node_id": node_id, "vkey": vkey, "pruned": pruned,
                "checkpoints": [note(n, _mth(leaves[:n])) for n in cps],
                "entries": [{"index": i, "entry": d.hex()} for i, d in enumerate(data) if i >= pruned],
                "inclusion": [{"index": i, "size": n, "proof": [h.hex() for h in _path(i, leaves[:n])]}
                              for i, n in incl],
                "consistency": [{"from": a, "size": n, "proof": [h.hex() for h in _subproof(a, leaves[:n], True)]}
                                for a, n in cons]}

    rows = _entries()
    for r in rows:
        assert _cbor(r) == cbor2.dumps(r), f"hand encoding differs from cbor2's for {r}"
    good = dump(rows)
    leaves = [leaf_hash(_cbor(r)) for r in rows]
    other = Ed25519PrivateKey.generate()

    def edit(f):
        d = copy.deepcopy(good)
        f(d)
        return d

    def flip(d, i, at):
        h = bytearray(bytes.fromhex(d["entries"][i]["entry"]))
        h[at] ^= 1
        d["entries"][i]["entry"] = h.hex()

    def bad_entry(change, raw=None):
        r = copy.deepcopy(rows)
        change(r[3])
        return dump(r, raw=raw and raw(r))

    def hexflip(h):
        return ("1" if h[0] == "0" else "0") + h[1:]

    forked = copy.deepcopy(rows)
    forked[2]["epoch"] = 2
    fork_dump = dump(forked)
    scenarios = [
        ("the log as built", 0, "", good),
        ("a witness's cosignature is ignored", 0, "", edit(lambda d: d["checkpoints"].__setitem__(
            1, d["checkpoints"][1] + f"\u2014 witness.example {b64(bytes(4) + bytes(64))}\n"))),
        ("pruned below 4: root from an inclusion proof's left hashes", 0, "",
         dump(rows, pruned=4, incl=((4, 13), (5, 9), (12, 13)))),
        ("pruned, no left hashes, entries unproved", 1, "confirmed by no", dump(rows, pruned=5, incl=((6, 13),))),
        ("a flipped byte in an entry's text", 1, "root", edit(lambda d: flip(d, 6, -1))),
        ("a flipped byte in an entry's arg", 1, "root", edit(lambda d: flip(d, 1, 50))),
        ("a flipped map header", 1, "entry 2", edit(lambda d: flip(d, 2, 0))),
        ("a removed entry", 1, "indices", edit(lambda d: d["entries"].pop(7))),
        ("the last entry removed", 1, "indices", edit(lambda d: d["entries"].pop())),
        ("two entries swapped", 1, "indices", edit(lambda d: d["entries"].insert(3, d["entries"].pop(4)))),
        ("two entries' bytes swapped", 1, "`i` is 4", edit(lambda d: (d["entries"][3].update(
            entry=d["entries"][4]["entry"]), d["entries"][4].update(entry=good["entries"][3]["entry"])))),
        ("a changed inclusion proof hash", 1, "inclusion 4 in 13", edit(
            lambda d: d["inclusion"][1]["proof"].__setitem__(1, hexflip(d["inclusion"][1]["proof"][1])))),
        ("a changed consistency proof hash", 1, "consistency 9 -> 13", edit(
            lambda d: d["consistency"][1]["proof"].__setitem__(0, hexflip(d["consistency"][1]["proof"][0])))),
        ("a consistency proof left out", 1, "growth 4 -> 9", edit(lambda d: d["consistency"].pop(0))),
        ("a note's root altered", 1, "signature does not verify", edit(lambda d: d["checkpoints"].__setitem__(
            3, d["checkpoints"][3].replace(b64(_mth(leaves)), b64(_mth(leaves[:12])))))),
        ("a note's size altered", 1, "signature does not verify", edit(lambda d: d["checkpoints"].__setitem__(
            0, d["checkpoints"][0].replace("\n4\n", "\n5\n")))),
        ("a note signed by another key", 1, "signature does not verify", edit(
            lambda d: d["checkpoints"].__setitem__(2, note(9, _mth(leaves[:9]), key=other)))),
        ("a note with only a stranger's signature", 1, "no signature line", edit(
            lambda d: d["checkpoints"].__setitem__(2, note(9, _mth(leaves[:9]), other, key_name="x")))),
        ("a size with a leading zero", 1, "leading zeros", edit(
            lambda d: d["checkpoints"].__setitem__(0, note(4, _mth(leaves[:4]), size_text="04")))),
        ("a vkey with another key id", 1, "key id", edit(
            lambda d: d.__setitem__("vkey", vkey.replace(kid.hex(), (b"\0" * 4).hex())))),
        ("a fork at the same size", 1, "forked", edit(
            lambda d: d["checkpoints"].insert(3, note(9, _mth(leaves[:8]))))),
        ("a rollback", 1, "rolled back", edit(lambda d: d["checkpoints"].append(note(9, _mth(leaves[:9]))))),
        ("a fork at a larger size", 1, "consistency 4 -> 9", dict(fork_dump, checkpoints=good["checkpoints"][:1]
                                                                  + fork_dump["checkpoints"][1:])),
        ("keys out of order", 1, "order", bad_entry(lambda e: e.update(by=e.pop("by")))),
        ("an unknown key", 1, "unknown key", bad_entry(lambda e: e.update(zz=1))),
        ("a 31-byte arg", 1, "`arg` is not", bad_entry(lambda e: e.update(arg=bytes(31)))),
        ("`by` not an authority", 1, "`by`", bad_entry(lambda e: e.update(by="root"))),
        ("by grant without `grant`", 1, "no `grant`", bad_entry(lambda e: e.update(by="grant"))),
        ("`i` not its index", 1, "`i` is 4", bad_entry(lambda e: e.update(i=4))),
        ("a non-shortest integer", 1, "rule 4", bad_entry(lambda e: None, lambda r: [
            _cbor(x) if j != 3 else _cbor(x).replace(b"\x61i\x03", b"\x61i\x18\x03") for j, x in enumerate(r)])),
        ("a tagged entry", 1, "rule 2", bad_entry(lambda e: None, lambda r: [
            _cbor(x) if j != 3 else b"\xd8\x18" + _cbor(x) for j, x in enumerate(r)])),
        ("a proof's size that is no checkpoint", 2, "matches no checkpoint", edit(
            lambda d: d["consistency"].append({"from": 5, "size": 13, "proof": []}))),
        ("an entry without its index", 2, "`index`", edit(lambda d: d["entries"][0].pop("index"))),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump.json")
        for what, code, needle, d in scenarios:
            with open(path, "w") as f:
                json.dump(d, f)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                got = run(path)
            lines = out.getvalue().splitlines()
            fails = [ln for ln in lines if ln.startswith("FAIL")]
            good_run = got == code and needle in "\n".join(fails) and (code == 0) == (not fails) \
                and (code == 2 or lines[-1].startswith("summary:"))
            failures += not good_run
            print(f"{'ok  ' if good_run else 'FAIL'} self-test {what}: exit {got}"
                  + (f", {fails[0]}" if fails else ""))
            if not good_run or what == "the log as built":
                print("     " + "\n     ".join(lines))
    print(f"self-test: {len(scenarios) - failures} of {len(scenarios)} scenarios as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(run(sys.argv[1]))
