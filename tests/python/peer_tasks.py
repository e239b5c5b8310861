#!/usr/bin/env python3
"""The independent capwire peer's run of tasks (WIRE.md 4.10), written from
WIRE.md alone.

Usage: peer_tasks.py ADDR NODE_ID WIRE_MD INVITE
       peer_tasks.py ADDR NODE_ID --before-restart|--after-restart FILE

ADDR, NODE_ID and INVITE are a `capwire node`'s, as for peer.py; WIRE_MD is
the path of WIRE.md, whose worked examples of 4.10 are checked against
cbor2's encoding of the same frames. The second form is a run in two
parts around a restart of the node with the same state directory (4.10
Restart): the first leaves tasks for the node to keep and writes what it
saw to FILE; the second, against the restarted node, checks them.

The transport, the strict CBOR profile, the version-1 rules and the
protocol-2 session (first hellos, `item` and `credit` frames, streams with
credit) are peer.py's and peer_v2.py's; this file adds tasks: the task verb
`app.agent/work` and `core.tasks` (get, list, subscribe, cancel, respond,
changed). Each check prints one `ok ...` line; the first mismatch prints
`FAIL ...` and exits with status 1. Section numbers are WIRE.md's.
"""

import json
import os
import re
import sys
import time

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import peer as v1
import peer_v2 as v2
from peer import Mismatch, PeerClosed, any_item, check, check_map, equal, is_uint, ok, one_of, text, uint
from peer_v2 import enc

# 4.10: the states, and which are final.
FINAL = {"submitted": False, "working": False, "input_required": False, "completed": True, "failed": True,
         "canceled": True, "rejected": True}
# 4.10: each event kind and the states it may leave the task in (`state`: the new state, any).
KIND_STATES = {"state": tuple(FINAL), "progress": ("working",), "question": ("input_required",),
               "answer": ("working",), "result": ("completed",), "error": ("failed", "canceled")}
# 4.10: the bodies of `state` events.
STATE_BODIES = (None, "resumed", "no answer in time")
# 4.10: core.tasks's verbs, all bootstrap.
TASKS_VERBS = {"get": ("request", "bootstrap"), "list": ("request", "bootstrap"),
               "subscribe": ("stream", "bootstrap"), "cancel": ("request", "bootstrap"),
               "respond": ("request", "bootstrap"), "changed": ("notification", "bootstrap")}
NO_SUCH_TASK = "no such task"
BUILT_IN_CODES = ("unknown_verb", "unauthorized", "bad_args", "not_found", "duplicate", "not_bound", "conflict",
                  "bind_failed", "timeout", "cancelled", "too_large", "overloaded", "unavailable", "internal")
ID_RE = re.compile(r"[0-9a-f]{32}")
WINDOW = (2, 4096)  # the credit window of our subscriptions: 2 items, 4 KiB
MAX_TASK_BODY = 65536  # 4.8, 4.10: capwire's max_task_body (64 KiB)
MAX_TASKS_PER_SENDER = 1000  # 4.8, 4.10: capwire's max_tasks_per_sender


def task_id(v):
    """4.10: 32 lowercase hexadecimal digits, as text."""
    return isinstance(v, str) and ID_RE.fullmatch(v) is not None


def uint_or_null(v):
    return v is None or is_uint(v)


def err_map(v):
    if not isinstance(v, dict):
        return False
    check_map(v, v1.ERR_SPEC, "an error in a task (4.10, 2.2)")
    return True


EVENT_SPEC = [("seq", lambda v: is_uint(v) and v >= 1, True), ("at_ms", uint(), True),
              ("state", one_of(*FINAL), True), ("kind", one_of(*KIND_STATES), True), ("body", any_item, True)]
INFO_SPEC = [("task", task_id, True), ("cap", text(), True), ("verb", text(), True),
             ("state", one_of(*FINAL), True), ("created_ms", uint(), True), ("updated_ms", uint(), True),
             ("seq", lambda v: is_uint(v) and v >= 1, True), ("first_seq", lambda v: is_uint(v) and v >= 1, True),
             ("progress", any_item, True), ("question", any_item, True), ("question_seq", uint_or_null, True),
             ("result", any_item, True), ("error", lambda v: v is None or err_map(v), True)]
SUBMITTED_SPEC = [("task", task_id, True), ("state", one_of(*FINAL), True)]
CHANGED_SPEC = [("task", task_id, True), ("cap", text(), True), ("verb", text(), True),
                ("submitter", v1.bytes32, True), ("state", one_of(*FINAL), True),
                ("seq", lambda v: is_uint(v) and v >= 1, True), ("at_ms", uint(), True), ("dropped", uint(), True)]
COPY_SPEC = [("seq", uint(), True), ("dropped", uint(), True), ("dir", one_of("in", "out"), True),
             ("peer", v1.bytes32, True), ("at_ms", uint(), True), ("cap", text(128), True),
             ("verb", text(128), True), ("req_id", text(64), True), ("body", any_item, True),
             ("body_len", uint(), True), ("truncated", one_of(True, False), True)]
CONTROL_SPEC = [("type", text(), True), ("cap", text(128), True), ("verb", text(128), True),
                ("req_id", lambda v: v == "" or v2.req_id_ok(v), True), ("budget_ms", uint(), False),
                ("args", any_item, True)]


def check_event(e, where):
    """4.10: one event: exactly its five keys in table order; its state is
    one its kind may leave."""
    check_map(e, EVENT_SPEC, where)
    check(e["state"] in KIND_STATES[e["kind"]], f"{where}: a {e['kind']} event leaves the task "
          f"{' or '.join(KIND_STATES[e['kind']])} (4.10)", e["state"])
    if e["kind"] == "state":
        check(e["body"] in STATE_BODIES, f"{where}: the body of a state event (4.10)", e["body"])
    if e["kind"] == "error":
        err_map(e["body"])


def check_info(info, where):
    """4.10: a task's info: exactly its thirteen keys in table order, and the
    values its state implies."""
    check_map(info, INFO_SPEC, where)
    s = info["state"]
    check(info["first_seq"] <= info["seq"], f"{where}: first_seq <= seq", info)
    check(info["created_ms"] <= info["updated_ms"], f"{where}: created_ms <= updated_ms", info)
    waits = s == "input_required"
    check((info["question_seq"] is not None) == waits, f"{where}: question_seq while input_required only", info)
    if not waits:
        equal(info["question"], None, f"{where}: question null unless input_required")
    if s != "completed":
        equal(info["result"], None, f"{where}: result null unless completed")
    check((info["error"] is not None) == (s in ("failed", "canceled")), f"{where}: error iff failed or canceled",
          info)
    return info


class Events:
    """A task's events as a subscriber sees them: numbered from its first
    without gaps, each a transition the states of 4.10 allow."""

    def __init__(self, where):
        self.where = where
        self.events = []

    def add(self, e):
        where = f"{self.where} event {len(self.events) + 1}"
        check_event(e, where)
        if self.events:
            last = self.events[-1]
            equal(e["seq"], last["seq"] + 1, f"{where}: seq without gaps (4.10)")
            check(e["at_ms"] >= last["at_ms"], f"{where}: at_ms in the order events happened", e["at_ms"],
                  f">= {last['at_ms']}")
            check(not FINAL[last["state"]], f"{where}: nothing happens after a final state (4.10)", e)
            self.allowed(last, e, where)
        else:
            if e["seq"] == 1:
                equal((e["kind"], e["state"], e["body"]), ("state", "submitted", None),
                      f"{where}: the first event is state submitted, body null (4.10)")
        self.events.append(e)

    @staticmethod
    def allowed(last, e, where):
        """4.10's order: submitted, working once the handler starts, progress,
        question then answer (or state working "no answer in time"), and
        last a result or an error; canceled from any state not final, and
        (Restart) resumed or failed from any state not final."""
        before, kind, after = last["state"], e["kind"], e["state"]
        if kind == "error" and after == "canceled":
            return
        if kind == "state" and e["body"] == "resumed":  # 4.10 Restart
            equal(after, "working", f"{where}: a resumed task is working")
            return
        if before == "submitted":  # an error: `interrupted` by a restart before its handler started
            ok_ = (kind == "state" and after == "working" and e["body"] is None) or kind == "error"
        elif before == "working":
            ok_ = kind in ("progress", "question", "result", "error")
        elif before == "input_required":
            ok_ = kind == "answer" or (kind == "state" and after == "working" and e["body"] == "no answer in time") \
                or kind == "error"
        else:
            ok_ = False
        check(ok_, f"{where}: a {kind} event ({after}) may follow the state {before} (4.10)", e)

    @property
    def last(self):
        return self.events[-1]


class TaskPeer(v2.Peer2):
    """A version-2 session that submits and follows tasks."""

    def __init__(self, transport, node_id, name):
        super().__init__(transport, node_id)
        self.name = name
        self.bound = False  # the node's bound control plane: `changed` pushes come to it (4.10)
        self.pushes = []
        self.copies = []

    def pump(self):
        """Reads one frame: items and stream responses are accounted by
        Peer2, pushes here."""
        frame = self.read_frame()
        if frame["type"] == "control":
            self.take_push(frame)
        check(frame["type"] != "cancel", f"{self.name}: the node cancels none of our calls: we made none to it",
              frame)
        return frame

    def take_push(self, frame):
        check_map(frame, CONTROL_SPEC, f"{self.name}: control frame from the node")
        check(self.bound, f"{self.name}: a control frame from the node only as its control plane (changed, 4.10)",
              frame)
        equal(frame["req_id"], "", f"{self.name}: the node's control frames to its control plane are "
              "notifications (3.3, 4.10)")
        what = (frame["cap"], frame["verb"])
        if what == ("core.monitoring", "copy"):  # 3.3: copies of other peers' control frames
            check_map(frame["args"], COPY_SPEC, f"{self.name}: core.monitoring/copy args (3.3)")
            self.copies.append(frame["args"])
            return
        equal(what, ("core.tasks", "changed"), f"{self.name}: the node's control frame is core.monitoring/copy or "
              "core.tasks/changed (3.3, 4.10)")
        check_map(frame["args"], CHANGED_SPEC, f"{self.name}: core.tasks/changed args (4.10)")
        self.pushes.append(frame["args"])

    def call(self, cap, verb, args, budget_ms=10_000, req_id=None):
        """4.3: one request; returns its response frame. Items of our
        subscriptions, their ends, hellos and pushes that come meanwhile are
        taken as they come."""
        req_id = req_id or self.new_req_id()
        check(req_id not in self.streams, "test setup: a call's req_id is not a stream's")
        self.send(self.control(cap, verb, req_id, args, budget_ms))
        while True:
            frame = self.pump()
            if frame["type"] in ("hello", "item", "control"):
                continue
            if frame["type"] == "response" and frame["req_id"] in self.streams:
                continue
            check(frame["type"] == "response", f"{self.name}: {cap}/{verb}: only a response comes back", frame)
            v2.check_response(frame, f"{self.name}: {cap}/{verb} response")
            equal(frame["req_id"], req_id, f"{self.name}: {cap}/{verb}: response req_id")
            return frame

    def refused(self, cap, verb, args, code):
        frame = self.call(cap, verb, args)
        check(not frame["ok"], f"{self.name}: {cap}/{verb} {args!r:.80} fails with {code}", frame.get("result"),
              "ok: false")
        equal(frame["err"]["code"], code, f"{self.name}: {cap}/{verb} {args!r:.80}: error code")
        return frame["err"]

    # ---- tasks

    def submit(self, args, req_id=None):
        """4.10: a submit of app.agent/work; returns (req_id, response frame)."""
        req_id = req_id or self.new_req_id()
        return req_id, self.call("app.agent", "work", args, req_id=req_id)

    def submitted(self, args, req_id=None):
        req_id, frame = self.submit(args, req_id)
        check(frame["ok"], f"{self.name}: app.agent/work submitted", frame.get("err"), "ok: true")
        check_map(frame["result"], SUBMITTED_SPEC, f"{self.name}: the answer to a submit (4.10)")
        return req_id, frame

    def get(self, task):
        return check_info(self.expect_ok("core.tasks", "get", {"task": task}), f"{self.name}: get's info")

    def list(self, **args):
        result = self.expect_ok("core.tasks", "list", args)
        check_map(result, [("tasks", lambda v: isinstance(v, list), True),
                           ("next", lambda v: v is None or task_id(v), True)], f"{self.name}: list's result (4.10)")
        for info in result["tasks"]:
            check_info(info, f"{self.name}: list's info")
        check(len(result["tasks"]) <= min(args.get("limit", 50), 200), f"{self.name}: list: at most limit tasks",
              len(result["tasks"]))
        return result

    def list_all(self, limit, **args):
        """Every page of a list; returns the ids in the order given."""
        ids, pages, before = [], 0, None
        while True:
            page = self.list(**args, limit=limit, **({} if before is None else {"before": before}))
            pages += 1
            ids += [i["task"] for i in page["tasks"]]
            if page["next"] is None:
                return ids, pages
            check(page["tasks"] and page["next"] == page["tasks"][-1]["task"],
                  f"{self.name}: list: `next` is the last task of its page, to pass as `before` (4.10)", page)
            before = page["next"]
            check(pages < 1000, "list pages end")

    def subscribe(self, task, frm=None, window=WINDOW, budget_ms=60_000, events=None):
        """`events`: an Events to go on with (a subscription opened again)."""
        args = {"task": task} if frm is None else {"task": task, "from": frm}
        return Subscription(self, task, args, window, budget_ms, events)


class Subscription:
    """`core.tasks/subscribe`: a stream (4.9) whose items are events. We
    grant back what our application takes, one window of credit at most."""

    def __init__(self, peer, task, args, window, budget_ms, events):
        self.peer, self.task, self.window = peer, task, window
        self.s = peer.open_stream("core.tasks", "subscribe", args, credit=window, budget_ms=budget_ms)
        self.taken = 0
        self.events = events or Events(f"{peer.name}: subscription of {task[:8]}")

    def next(self):
        """The next event, checked; None once the stream has ended."""
        while self.taken == len(self.s.items):
            if self.s.response is not None:
                return None
            self.peer.pump()
        item = self.s.items[self.taken]
        self.taken += 1
        if self.s.response is None:  # 4.9: grant again as the application takes items
            self.peer.grant(self.s, 1, len(enc(item)))
        self.events.add(item)
        return item

    def until(self, cond):
        """Events up to the first that meets `cond`; returns it."""
        while True:
            e = self.next()
            check(e is not None, f"{self.peer.name}: the subscription of {self.task[:8]} goes on until an event "
                  "comes that the check waits for", self.s.response)
            if cond(e):
                return e

    def end(self):
        """The rest of the events, then the stream's response: ok, null (4.10)."""
        while self.next() is not None:
            pass
        return self.s.response

    def end_ok(self):
        response = self.end()
        equal(response, {"type": "response", "req_id": self.s.req_id, "ok": True, "result": None},
              f"{self.peer.name}: the subscription ends well after the final event (4.10)")
        check(self.events.events and FINAL[self.events.last["state"]],
              f"{self.peer.name}: the last event before the end is final", self.events.events[-1:])
        return self.events.events


# ----------------------------------------------------------------- 4.10 bytes

def hex_block(doc, at, where):
    """The hex of the code block after `at` in WIRE.md: per line, the tokens
    before the annotation (which is set off by two spaces or more), without
    the heading line."""
    block = doc[doc.index("```", at) + 3:]
    block = block[:block.index("```")]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    check(lines and re.fullmatch(r"callee → caller\s+\w+", lines[0].strip()), f"{where}: a heading", lines[:1])
    hexed = ""
    for line in lines[1:]:
        part = re.split(r"\s{2,}", line.strip())[0]
        check(re.fullmatch(r"[0-9a-f]+( [0-9a-f]+)*", part), f"{where}: hex before the annotation", line)
        hexed += part.replace(" ", "")
    return lines[0].split()[-1], hexed


def check_worked_examples(wire_md):
    doc = open(wire_md, encoding="utf-8").read()
    sect = doc.index("### 4.10 Tasks")
    sect_end = doc.index("\n## ", sect)
    at = doc.find("**Example.** A submit of a task verb", sect, sect_end)
    check(at >= 0, "WIRE.md has 4.10's worked example")
    tid = "5f0c" + "0" * 24 + "a1b2"
    frames = [("response", {"type": "response", "req_id": "7", "ok": True,
                            "result": {"task": tid, "state": "submitted"}}),
              ("item", {"type": "item", "req_id": "8",
                        "item": {"seq": 5, "at_ms": 1764547200000, "state": "working", "kind": "progress",
                                 "body": 3}})]
    stated = [int(n) for n in re.findall(r"\((\d+) bytes\):\n", doc[at:sect_end])]
    equal(len(stated), 2, "4.10 example: two frames with their lengths stated")
    shown, pos = [], at
    for name, frame in frames:
        pos = doc.index("```", pos)
        heading, hexed = hex_block(doc, pos, f"4.10 example {name}")
        pos = doc.index("```", pos + 3) + 3
        shown.append(heading)
        got = enc(frame)
        equal(got.hex(), hexed, f"4.10 example: the {name} frame's bytes")
        equal(v1.decode_strict(bytes.fromhex(hexed), f"4.10 {name}"), frame, f"4.10 example: the {name} decodes back")
    equal(shown, [n for n, _ in frames], "4.10 example: the frames shown")
    equal(stated, [len(enc(f)) for _, f in frames], "4.10 example: the lengths stated")
    check_map(frames[0][1]["result"], SUBMITTED_SPEC, "4.10 example: the answer to the submit")
    check_event(frames[1][1]["item"], "4.10 example: the event")
    equal(enc(1764547200000).hex(), "1b0000019ad7358400", "4.10 example: at_ms 1764547200000 in 9 bytes (2.1 rule 4)")
    ok(f"4.10 worked examples: the submit's answer and a progress event, bytes as printed ({stated[0]}, {stated[1]}); "
       "each decodes back in the strict profile and fits 4.10's tables")


# ----------------------------------------------------------------- checks

def session(addr, node_hex, name):
    t, rs, hello = v2.connect(addr, node_hex, v2.our_hello_v2)
    peer = TaskPeer(t, rs, name)
    peer.key = hello["manifest"]["node_id"]
    peer.send(hello)
    peer.open()
    equal(peer.version, 2, f"{name}: a version-2 session (4.1)")
    return peer


def check_manifests(peer):
    first, whole = peer.first, peer.whole
    check(whole is not None, "a protocol-2 hello follows the version-1 view: a capwire node always lists "
          "core.tasks (4.1)")
    caps = {c["id"]: c for c in whole["capabilities"]}
    check("core.tasks" in caps, "the whole manifest lists core.tasks (3.1, 4.10)", sorted(caps))
    tasks = caps["core.tasks"]
    equal(tasks["version"], "1.0.0", "core.tasks version (4.10)")
    equal([v["name"] for v in tasks["verbs"]], sorted(TASKS_VERBS), "core.tasks verbs, sorted by name (3.1)")
    equal({v["name"]: (v["kind"], v["class"]) for v in tasks["verbs"]}, TASKS_VERBS,
          "core.tasks verbs (kind, class) (4.10)")
    work = next((v for v in caps.get("app.agent", {"verbs": []})["verbs"] if v["name"] == "work"), None)
    check(work is not None, "the whole manifest lists app.agent/work", v2.stream_verbs(whole))
    equal((work["kind"], work["class"]), ("task", "bootstrap"), "app.agent/work kind and class")
    first_ids = [c["id"] for c in first["capabilities"]]
    check("core.tasks" not in first_ids, "the version-1 view lists no core.tasks (4.1)", first_ids)
    first_agent = next(c for c in first["capabilities"] if c["id"] == "app.agent")
    check("work" not in [v["name"] for v in first_agent["verbs"]], "the version-1 view lists no app.agent/work (4.1)")
    equal(enc(v2.version_1_view(whole)), enc(first), "the first hello is the version-1 view of the whole manifest")
    ok(f"manifest: core.tasks 1.0.0 with {', '.join(f'{n} ({k})' for n, (k, _) in TASKS_VERBS.items())}, all "
       "bootstrap; app.agent/work a bootstrap task; neither in the version-1 view of the first hello")


def check_ask_task(a):
    """Submit with a question, subscribe from 1, answer, follow it to its end."""
    name = a.manifest["name"]
    args = {"text": "ask first", "steps": 3, "step_ms": 20, "ask": True}
    req_id, frame = a.submitted(args)
    answer = frame["result"]
    tid = answer["task"]
    equal(answer["state"], "submitted", "the answer to a new submit: state submitted (4.10)")
    ok(f"submit app.agent/work (ask, 3 steps) -> {{task: {tid!r} (32 lowercase hex digits), state: 'submitted'}}")

    sub = a.subscribe(tid, frm=1)
    q = sub.until(lambda e: e["kind"] == "question")
    ev = sub.events.events
    equal([(e["seq"], e["kind"], e["state"], e["body"]) for e in ev[:2]],
          [(1, "state", "submitted", None), (2, "state", "working", None)],
          "the first events: state submitted, then state working once its handler starts (4.10)")
    equal((q["seq"], q["state"]), (3, "input_required"), "the question is event 3, input_required")
    equal(q["body"], f'{name}: go on with "ask first" (3 steps)?',
          "app.agent/work's question, as appendix A writes it")
    waiting = a.get(tid)
    equal({k: waiting[k] for k in ("task", "cap", "verb", "state", "seq", "first_seq", "progress", "question",
                                   "question_seq", "result", "error")},
          {"task": tid, "cap": "app.agent", "verb": "work", "state": "input_required", "seq": 3, "first_seq": 1,
           "progress": None, "question": q["body"], "question_seq": 3, "result": None, "error": None},
          "get while the task waits on its question (4.10)")
    equal(waiting["updated_ms"], q["at_ms"], "get: updated_ms is its last event's at_ms")
    ok(f"subscribe from 1 (credit {WINDOW[0]} items, {WINDOW[1]} bytes, granted back as taken): events 1 state "
       f"submitted, 2 state working, 3 question {q['body']!r} (input_required); get: question_seq 3")

    err = a.refused("core.tasks", "respond", {"task": tid, "answer": True, "question_seq": 2}, "conflict")
    after = a.refused("core.tasks", "respond", {"task": tid, "answer": "x" * 70_000, "question_seq": 3}, "too_large")
    equal(a.get(tid)["state"], "input_required", "a refused respond leaves the question waiting")
    ok(f"respond naming another question_seq -> conflict ({err['message']!r}); an answer over max_task_body -> "
       f"too_large ({after['message']!r}); the question still waits")

    responded = check_info(a.expect_ok("core.tasks", "respond", {"task": tid, "answer": True, "question_seq": 3}),
                           "respond's info")
    equal((responded["question"], responded["question_seq"]), (None, None), "respond: the question is answered")
    check(responded["seq"] >= 4, "respond's info is after the answer (event 4)", responded["seq"])
    events = sub.end_ok()
    a4 = events[3]
    equal((a4["seq"], a4["kind"], a4["state"], a4["body"]), (4, "answer", "working", True),
          "event 4: the answer given with respond (4.10)")
    progress = [e for e in events if e["kind"] == "progress"]
    equal([e["body"] for e in progress], [{"step": i, "of": 3} for i in (1, 2, 3)],
          "progress bodies {step, of}, in order")
    for e in progress:
        equal(list(e["body"]), ["step", "of"], "a progress body's keys in order")
    last = events[-1]
    equal((last["kind"], last["state"], last["body"]), ("result", "completed", f"{name}: ask first: done in 3 steps"),
          "the final event: result, completed, NAME: TEXT: done in N steps")
    equal(len(events), 8, "8 events: submitted, working, question, answer, 3 progress, result")
    at = events[responded["seq"] - 1]
    equal((responded["state"], responded["updated_ms"]), (at["state"], at["at_ms"]),
          f"respond's info agrees with event {responded['seq']}, its seq")
    ok(f"respond (question_seq 3) -> info state {responded['state']} seq {responded['seq']}; events 4 answer true, "
       f"5-7 progress {{step, of}}, 8 result {last['body']!r} (completed); the stream ends ok, null; "
       f"{len(events)} events numbered from 1 without gaps, each {{seq, at_ms, state, kind, body}}")

    info = a.get(tid)
    equal(info, {"task": tid, "cap": "app.agent", "verb": "work", "state": "completed",
                 "created_ms": events[0]["at_ms"], "updated_ms": last["at_ms"], "seq": 8, "first_seq": 1,
                 "progress": {"step": 3, "of": 3}, "question": None, "question_seq": None, "result": last["body"],
                 "error": None}, "get of the completed task (4.10)")
    ok("get after the end: {task, cap, verb, state, created_ms, updated_ms, seq, first_seq, progress, question, "
       "question_seq, result, error} in order: completed, seq 8, last progress {step: 3, of: 3}, the result")
    return {"id": tid, "req_id": req_id, "args": args, "frame": frame, "events": events, "info": info}


def check_resubmit(a, t1):
    _, again = a.submit(t1["args"], req_id=t1["req_id"])
    check(again["ok"], "a repeated submit succeeds", again.get("err"))
    equal(again["result"]["task"], t1["id"], "a submit repeated with the same req_id: the same task id (4.10)")
    # 4.4: within the ledger's window (120 s), a finished request's response frame is sent again byte for byte.
    equal(enc(again), enc(t1["frame"]), "a repeated submit within the ledger's window: the same response frame, "
          "byte for byte (4.4)")
    ids, _ = a.list_all(50)
    equal(ids.count(t1["id"]), 1, "the repeat started no task")
    ok(f"a second submit with the same req_id -> the same task {t1['id'][:8]}..., the first answer byte for byte "
       f"(within 4.4's window: state {again['result']['state']!r}); no new task")


def check_subscribe_from(a, t1):
    sub = a.subscribe(t1["id"], frm=5)
    events = sub.end_ok()
    equal([enc(e) for e in events], [enc(e) for e in t1["events"][4:]], "subscribe from 5: events 5..8, as before")
    sub = a.subscribe(t1["id"], frm=9)
    equal((sub.end(), sub.events.events), ({"type": "response", "req_id": sub.s.req_id, "ok": True,
                                            "result": None}, []),
          "subscribe from after the final event: ends at once, ok null, no item (4.10)")
    sub = a.subscribe(t1["id"])
    events = sub.end_ok()
    equal([enc(e) for e in events], [enc(e) for e in t1["events"]], "subscribe without from: from 1 (4.10)")
    ok("subscribe from 5: events 5-8 byte for byte, then ok null; from 9: ok null at once, no item; "
       "no from: all 8 from 1")


def check_subscribe_credit(a, t1):
    """4.9 on a subscription: no event beyond the credit granted, in items
    or in bytes."""
    sizes = [len(enc(e)) for e in t1["events"]]
    s = a.open_stream("core.tasks", "subscribe", {"task": t1["id"]}, credit=(5, sum(sizes[:3])))
    got = a.take(s, 3)
    a.nothing_more(s, "once the bytes granted are used by 3 events")
    a.grant(s, 0, sizes[3] + sizes[4] - 1)
    got += a.take(s, 1)
    a.nothing_more(s, "when the bytes left are one short of the next event")
    a.grant(s, 0, 1)
    got += a.take(s, 1)
    a.nothing_more(s, "once the 5 items granted are used")
    a.grant(s, 10, 1 << 16)
    rest, response = a.end(s)
    equal(response, {"type": "response", "req_id": s.req_id, "ok": True, "result": None}, "the subscription's end")
    equal([enc(e) for e in got + rest], [enc(e) for e in t1["events"]], "the events, as the first subscription had")
    ok(f"subscribe with credit for 5 events and the bytes of 3: 3, then nothing; bytes one short of two more: 1; "
       f"one byte more: the 5th, then nothing; more credit: the other {len(rest)}, then ok null")


def check_changed_to_node(a):
    """4.10: a node accepts `changed` from any contact (a notification)."""
    push = {"task": "0" * 32, "cap": "app.agent", "verb": "work", "submitter": a.key, "state": "working",
            "seq": 2, "at_ms": 1, "dropped": 0}
    a.send(a.control("core.tasks", "changed", "", push, None))
    err = a.refused("core.tasks", "changed", push, "unknown_verb")
    equal(a.quiet(), [], "nothing comes back for a changed notification")
    ok(f"core.tasks/changed sent to the node: as a notification, nothing comes back; request-shaped -> "
       f"unknown_verb ({err['message']!r})")


def check_cancel(a, b):
    """A running task: refused respond, a stranger's cancel, then ours."""
    req_id, frame = a.submitted({"text": "long", "steps": 1000, "step_ms": 50})
    tid = frame["result"]["task"]
    # 4.10: a subscription ends with timeout at its budget; opened again from its last seq plus 1, it goes on.
    first = a.subscribe(tid, budget_ms=400)
    response = first.end()
    equal((response["ok"], response.get("err", {}).get("code")), (False, "timeout"),
          "a subscription ends with timeout at its budget (4.9, 4.10)")
    seen = len(first.events.events)
    sub = a.subscribe(tid, frm=seen + 1, events=first.events)
    sub.until(lambda e: e["kind"] == "progress" and e["seq"] > seen)
    ok(f"a subscription with a budget of 400 ms: {seen} events, then timeout; opened again from seq {seen + 1}: "
       "the next ones, without a gap or a repeat")
    err = a.refused("core.tasks", "respond", {"task": tid, "answer": True}, "conflict")
    ok(f"respond to a working task that waits on no question -> conflict ({err['message']!r})")
    stranger = b.refused("core.tasks", "cancel", {"task": tid}, "not_found")
    equal(stranger["message"], NO_SUCH_TASK, "a stranger's cancel: no such task (4.10)")
    check(not FINAL[a.get(tid)["state"]], "a stranger's cancel leaves the task running")
    info = check_info(a.expect_ok("core.tasks", "cancel", {"task": tid}), "cancel's info")
    equal(info["state"], "canceled", "cancel: the task is canceled (4.10)")
    equal(info["error"]["code"], "cancelled", "cancel: the error's code is cancelled (4.10)")
    events = sub.end_ok()
    last = events[-1]
    equal((last["kind"], last["state"], last["body"]), ("error", "canceled", info["error"]),
          "the last event: error, canceled, the error of the info")
    equal((info["seq"], info["updated_ms"]), (last["seq"], last["at_ms"]), "cancel's info: after the error event")
    equal(a.get(tid), info, "get after the cancel: as cancel answered")
    again = check_info(a.expect_ok("core.tasks", "cancel", {"task": tid}), "a second cancel's info")
    equal(again, info, "a second cancel leaves the ended task as it is (4.10)")
    n = sum(e["kind"] == "progress" for e in events)
    ok(f"cancel of a running task (after {n} progress events) -> info canceled, error "
       f"{{code: 'cancelled', message: {info['error']['message']!r}}}; event {last['seq']} error (canceled); the "
       "stream ends ok, null; cancel again: unchanged")
    return {"id": tid, "req_id": req_id, "info": info}


def check_cancel_waiting(a, t1):
    """A task waiting on its question: cancel withdraws it."""
    _, frame = a.submitted({"text": "never answered", "steps": 2, "step_ms": 20, "ask": True})
    tid = frame["result"]["task"]
    sub = a.subscribe(tid)
    q = sub.until(lambda e: e["kind"] == "question")
    info = check_info(a.expect_ok("core.tasks", "cancel", {"task": tid}), "cancel's info")
    equal((info["state"], info["question"], info["question_seq"], info["error"]["code"]),
          ("canceled", None, None, "cancelled"), "cancel while input_required: canceled, the question gone")
    events = sub.end_ok()
    equal([e["kind"] for e in events], ["state", "state", "question", "error"],
          "events of a task cancelled while it waits: submitted, working, question, error")
    err = a.refused("core.tasks", "respond", {"task": tid, "answer": True, "question_seq": q["seq"]}, "conflict")
    err1 = a.refused("core.tasks", "respond", {"task": t1["id"], "answer": True}, "conflict")
    again = check_info(a.expect_ok("core.tasks", "cancel", {"task": t1["id"]}), "cancel of a completed task")
    equal(again, t1["info"], "cancel of a completed task leaves it as it is (4.10)")
    ok(f"cancel while input_required -> canceled, question null; respond to it then -> conflict "
       f"({err['message']!r}); respond to a completed task -> conflict ({err1['message']!r}); cancel of a "
       "completed task: its info unchanged")
    return {"id": tid, "info": info}


def check_submit_refusals(a):
    before, _ = a.list_all(200)
    err = a.refused("app.agent", "work", {"steps": 2}, "bad_args")
    err2 = a.refused("app.agent", "work", "just text", "bad_args")
    big = a.refused("app.agent", "work", {"text": "x" * 70_000}, "too_large")
    # Args that decode but are outside the verb's own bounds (appendix A:
    # 1 to 1000 steps, at most 60000 ms a step) are refused the same way.
    steps = a.refused("app.agent", "work", {"text": "many", "steps": 5000}, "bad_args")
    slow = a.refused("app.agent", "work", {"text": "slow", "step_ms": 60_001}, "bad_args")
    # 4.10, 4.3: a notification-shaped frame for a task verb is dropped.
    a.send(a.control("app.agent", "work", "", {"text": "dropped", "steps": 1, "step_ms": 0}, None))
    after, _ = a.list_all(200)
    equal(after, before, "no task exists after refused submits and a notification-shaped one (4.10)")
    extra = a.quiet()
    equal(extra, [], "nothing comes back for a notification-shaped submit")
    ok(f"submits refused: args without text -> bad_args ({err['message']!r:.60}), args not a map -> bad_args "
       f"({err2['message']!r:.60}), args over max_task_body -> too_large ({big['message']!r:.60}), "
       f"5000 steps -> bad_args ({steps['message']!r:.60}), 60001 ms a step -> bad_args "
       f"({slow['message']!r:.60}); a "
       "notification-shaped submit: dropped; list: no task made")


def check_oversized_result(a):
    """Args at max_task_body whose result is longer: a task whose handler
    has finished still ends (4.10: last one result or error), and no body
    is over max_task_body (4.8)."""
    args = {"text": "x" * 1000, "steps": 1, "step_ms": 0}  # a text header of 3 bytes, as for the final length
    args["text"] = "x" * (MAX_TASK_BODY - len(enc(args)) + 1000)
    equal(len(enc(args)), MAX_TASK_BODY, "test setup: args of exactly max_task_body")
    _, frame = a.submitted(args)
    tid = frame["result"]["task"]
    sub = a.subscribe(tid, window=(WINDOW[0], 1 << 20))
    try:
        events = sub.end_ok()
    except Mismatch as e:
        raise Mismatch(f"a task whose result is over max_task_body never ends: its events {sub.events.events}, "
                       f"get {a.get(tid)} ({e})")
    last = events[-1]
    check(all(len(enc(e["body"])) <= MAX_TASK_BODY for e in events), "no event body over max_task_body (4.8)")
    equal((last["kind"], last["state"], last["body"]["code"]), ("error", "failed", "too_large"),
          "a result over max_task_body: the task fails with too_large")
    info = a.get(tid)
    equal((info["state"], info["error"], info["result"]), ("failed", last["body"], None), "its info")
    ok(f"args of exactly max_task_body ({MAX_TASK_BODY} bytes) accepted; the result, longer, is not kept: the task "
       f"ends failed, too_large ({last['body']['message']!r})")
    return {"id": tid, "info": info}


def check_list(a, tasks):
    """tasks: ours, oldest first."""
    newest = [t["id"] for t in reversed(tasks)]
    infos = {t["id"]: t["info"] for t in tasks}
    page = a.list()
    equal([i["task"] for i in page["tasks"]], newest, "list: our tasks, newest submitted first (4.10)")
    equal(page["next"], None, "list: next null after the last")
    for info in page["tasks"]:
        equal(info, infos[info["task"]], "list: each info as get gives it")
    for limit in (1, 2):
        ids, pages = a.list_all(limit)
        equal(ids, newest, f"list pages of {limit}, next passed as before: every task once, newest first")
        ok_pages = -(-len(newest) // limit)
        equal(pages, ok_pages, f"list pages of {limit}: next null on the page of the last task (4.10)")
    big = a.list(limit=1000)
    equal([i["task"] for i in big["tasks"]], newest, "list with a limit over 200 (taken as 200)")
    by_state = {s: [i for i in newest if infos[i]["state"] == s]
                for s in ("completed", "canceled", "failed", "working")}
    for state, want in by_state.items():
        equal([i["task"] for i in a.list(state=state)["tasks"]], want, f"list state={state}")
    equal([i["task"] for i in a.list(cap="app.agent", verb="work")["tasks"]], newest, "list cap, verb")
    equal(a.list(verb="tell")["tasks"], [], "list verb=tell: none")
    equal(a.list(cap="app.nope")["tasks"], [], "list cap=app.nope: none")
    equal([i["task"] for i in a.list(before=newest[1])["tasks"]], newest[2:], "list before the second newest")
    equal(a.list(before=newest[-1]), {"tasks": [], "next": None}, "list before the oldest: empty, next null")
    err = a.refused("core.tasks", "list", {"before": "0" * 32}, "not_found")
    ok(f"list: {len(newest)} tasks newest first, each info as get's, next null; pages of 1 and 2 through next/before; "
       f"limit 1000 taken as 200; filters state ({', '.join(f'{s}: {len(w)}' for s, w in by_state.items())}), "
       f"cap and verb; before; a before that names no task -> not_found ({err['message']!r})")


def check_stranger(a, b, tasks):
    """b: a second key on its own session; it may see none of a's tasks."""
    tid = tasks[0]["id"]
    nobody = "0123456789abcdef" * 2
    answers = {}
    for verb, args in (("get", {"task": tid}), ("cancel", {"task": tid}),
                       ("respond", {"task": tid, "answer": True})):
        answers[verb] = b.refused("core.tasks", verb, args, "not_found")
        equal(answers[verb]["message"], NO_SUCH_TASK, f"a stranger's {verb}: message (4.10)")
        none = b.refused("core.tasks", verb, {**args, "task": nobody}, "not_found")
        equal(none, answers[verb], f"a stranger's {verb} is answered as for a task that does not exist (4.10)")
    sub = b.subscribe(tid)
    response = sub.end()
    equal((sub.events.events, response["ok"], response.get("err", {}).get("code"),
           response.get("err", {}).get("message")), ([], False, "not_found", NO_SUCH_TASK),
          "a stranger's subscribe: not_found, no such task, no item (4.10)")
    sub = b.subscribe(nobody)
    equal(sub.end()["err"], response["err"], "a stranger's subscribe: as for a task that does not exist")
    equal(b.list(), {"tasks": [], "next": None}, "a stranger's list: none of another's tasks (4.10)")
    b.refused("core.tasks", "list", {"before": tid}, "not_found")
    equal(a.get(tid), tasks[0]["info"], "the stranger changed nothing")
    # 4.10: tasks are keyed on (sender, req_id): the stranger's same req_id is another task.
    _, frame = b.submitted({"text": "mine", "steps": 1, "step_ms": 0}, req_id=tasks[0]["req_id"])
    theirs = frame["result"]["task"]
    check(theirs != tid, "another sender's submit with the same req_id: another task (4.10)", theirs)
    mine = b.subscribe(theirs).end_ok()
    equal(mine[-1]["kind"], "result", "the stranger follows its own task to its result")
    equal(a.refused("core.tasks", "get", {"task": theirs}, "not_found")["message"], NO_SUCH_TASK,
          "the submitter's task is not the other's to see")
    ok(f"a stranger (a second key): get, cancel, respond -> not_found {NO_SUCH_TASK!r}, as for no task at all; "
       "subscribe -> not_found, no item; list -> none, before -> not_found; its submit with the same req_id is "
       "its own task, which the first may not see")
    return theirs


def check_bad_ids(a):
    bad = ["0" * 31, "0" * 33, "0123456789ABCDEF" * 2, "g" * 32, "", 7, None]
    for v in bad:
        a.refused("core.tasks", "get", {"task": v}, "bad_args")
    for verb, args in (("cancel", {"task": "XYZ"}), ("respond", {"task": "XYZ", "answer": 1}),
                       ("list", {"before": "XYZ"})):
        a.refused("core.tasks", verb, args, "bad_args")
    sub = a.subscribe("XYZ")
    response = sub.end()
    equal((sub.events.events, response.get("err", {}).get("code")), ([], "bad_args"),
          "subscribe with a malformed id: bad_args, no item")
    ok(f"malformed ids ({', '.join(repr(v)[:12] for v in bad)}) -> bad_args for get; for cancel, respond, "
       "list's before and subscribe too")


def check_control_plane(addr, node_hex, a, c, code, tasks, theirs):
    """c binds as the node's control plane: it sees every task and gets
    `changed` pushes (4.10)."""
    c.expect_ok("core.monitoring", "bind", {"code": code})
    c.bound = True
    for t in tasks:
        equal(c.get(t["id"]), a.get(t["id"]), "the control plane's get: the submitter's info (4.10)")
    ids, _ = c.list_all(2)
    equal(ids, [theirs] + [t["id"] for t in reversed(tasks)], "the control plane lists every task, newest first")
    equal(c.pushes, [], "no push when a control plane binds (4.10)")
    watched = {"text": "watched", "steps": 2, "step_ms": 20}
    req_id, frame = a.submitted(watched)
    tid = frame["result"]["task"]
    sub = a.subscribe(tid)
    events = sub.end_ok()
    want = [e for e in events if e["kind"] != "progress"]
    while len(c.pushes) < len(want):
        c.pump()
    pushes = list(c.pushes)
    equal([(p["task"], p["cap"], p["verb"], p["submitter"], p["state"], p["seq"], p["at_ms"], p["dropped"])
           for p in pushes],
          [(tid, "app.agent", "work", a.key, e["state"], e["seq"], e["at_ms"], 0) for e in want],
          "core.tasks/changed: one push per event but progress, in order (4.10)")
    submit = [cp for cp in c.copies if cp["req_id"] == req_id]
    equal([(cp["dir"], cp["peer"], cp["cap"], cp["verb"], cp["body"]) for cp in submit],
          [("in", a.key, "app.agent", "work", watched)], "the submit is copied to the control plane (3.3)")
    ok(f"control plane: bound, get and list see every submitter's task; core.tasks/changed for events "
       f"{[p['seq'] for p in pushes]} of {len(events)} (all but progress): {{task, cap, verb, submitter, state, seq, "
       "at_ms, dropped}, in order; the submit's monitoring copy")
    # The control plane may answer another's task: respond without question_seq.
    _, frame = a.submitted({"text": "asked of the control plane", "steps": 1, "step_ms": 0, "ask": True})
    tid = frame["result"]["task"]
    watch = c.subscribe(tid, frm=1)
    q = watch.until(lambda e: e["kind"] == "question")
    info = check_info(c.expect_ok("core.tasks", "respond", {"task": tid, "answer": False}), "respond's info")
    equal((info["question"], info["question_seq"]), (None, None), "the control plane's answer is taken")
    events = watch.end_ok()
    equal([(e["kind"], e["state"]) for e in events[q["seq"]:]],
          [("answer", "working"), ("error", "failed")], "answered false: the answer, then the task fails")
    code = events[-1]["body"]["code"]
    check(re.fullmatch(r"[a-z][a-z0-9_]{0,63}", code) is not None and code not in BUILT_IN_CODES,
          "the handler's own error: an application code (2.4)", code)
    equal(a.get(tid)["error"], events[-1]["body"], "the submitter's get: the error of the failed task")
    ok(f"control plane: subscribes to another's task and answers its question without question_seq (false): "
       f"answer, then error {code!r} (failed)")
    # Unbound, it may see the task no more: its subscription ends not_found, at the latest at the next event.
    _, frame = a.submitted({"text": "unbound meanwhile", "steps": 1000, "step_ms": 50})
    tid = frame["result"]["task"]
    watch = c.subscribe(tid)
    watch.until(lambda e: e["kind"] == "progress")
    equal(c.expect_ok("core.monitoring", "disable", {}), None, "core.monitoring/disable (3.3)")
    c.bound = False
    response = watch.end()
    equal((response["ok"], response.get("err", {}).get("code"), response.get("err", {}).get("message")),
          (False, "not_found", NO_SUCH_TASK), "an unbound control plane's subscription ends not_found (4.10)")
    n = len(watch.events.events)
    equal(c.refused("core.tasks", "get", {"task": tid}, "not_found")["message"], NO_SUCH_TASK,
          "an unbound control plane's get (4.10)")
    equal(c.list(), {"tasks": [], "next": None}, "an unbound control plane lists none of another's tasks")
    info = check_info(a.expect_ok("core.tasks", "cancel", {"task": tid}), "cancel's info")
    equal(info["state"], "canceled", "the submitter cancels it")
    check(all(f["type"] == "hello" for f in c.quiet()), "no push after the unbind")
    ok(f"control plane unbound (disable) while subscribed to another's task: after {n} events, not_found "
       f"{NO_SUCH_TASK!r}; get -> not_found, list -> none; no push after it")
    # 4.2: every session ends up with the newest manifest, and a new one starts with it.
    a.quiet()
    held = max(a.manifest["epoch"], c.manifest["epoch"])
    d = session(addr, node_hex, "newcomer")
    check(d.manifest["epoch"] >= held, "a new session's hello is the newest manifest, not an older one (4.2)",
          d.manifest["epoch"], f">= {held}, held by the open sessions")
    close(d)
    ok(f"after the unbind: the open sessions' manifests at epoch {held}, a new session's at {d.manifest['epoch']}: "
       "the newest, never an older one; every later hello's epoch grew")


def check_sender_quota(addr, node_hex, b):
    """4.8, 4.10: a sender keeps at most max_tasks_per_sender tasks, ended
    ones included until their retention passes; another sender is not
    held back by it."""
    q = session(addr, node_hex, "quota")
    reqs = [q.new_req_id() for _ in range(MAX_TASKS_PER_SENDER)]
    q.t.send_records([enc(q.control("app.agent", "work", r, {"text": f"t{i}", "steps": 1, "step_ms": 0}, 60_000))
                      for i, r in enumerate(reqs)])
    answers = {}
    while len(answers) < len(reqs):
        frame = q.pump()
        if frame["type"] == "response":
            check(frame["req_id"] in reqs and frame["req_id"] not in answers, "one answer per submit", frame)
            v2.check_response(frame, "a submit's answer")
            answers[frame["req_id"]] = frame
    refused = [f["err"]["code"] for f in answers.values() if not f["ok"]]
    equal(refused, [], f"{MAX_TASKS_PER_SENDER} submits in one go (within max_inflight): all submitted")
    ids = {f["result"]["task"] for f in answers.values()}
    equal(len(ids), MAX_TASKS_PER_SENDER, "each submit its own task")
    err = q.refused("app.agent", "work", {"text": "one too many"}, "overloaded")
    for _ in range(400):  # until every task has ended
        if not any(q.list(state=st, limit=1)["tasks"] for st in ("submitted", "working")):
            break
        time.sleep(0.05)
    else:
        raise Mismatch("1000 one-step tasks did not end within 20 s")
    q.refused("app.agent", "work", {"text": "one too many, all ended"}, "overloaded")
    listed, pages = q.list_all(200)
    equal((sorted(listed), pages), (sorted(ids), 5), "list in pages of 200: all 1000 once, in 5 pages")
    _, frame = b.submitted({"text": "another sender", "steps": 1, "step_ms": 0})
    b.subscribe(frame["result"]["task"]).end_ok()
    close(q)
    ok(f"{MAX_TASKS_PER_SENDER} submits of one sender sent at once: all submitted; the next -> overloaded "
       f"({err['message']!r}), also once all have ended (they count until their retention passes); 5 pages of 200 "
       "list them all; another sender still submits")


def check_v1_session(addr, node_hex, tid):
    t, rs, hello = v2.connect(addr, node_hex, v1.our_hello)
    peer = TaskPeer(t, rs, "v1")
    peer.we_speak_2 = False
    peer.send(hello)
    peer.open()
    equal(peer.version, 1, "a peer without core.protocol: a version-1 session (4.1)")
    for verb, args in (("get", {"task": tid}), ("list", {}), ("cancel", {"task": tid}),
                       ("respond", {"task": tid, "answer": True}), ("subscribe", {"task": tid})):
        peer.refused("core.tasks", verb, args, "unknown_verb")
    err = peer.refused("app.agent", "work", {"text": "v1"}, "unknown_verb")
    peer.send(peer.control("app.agent", "work", "", {"text": "v1"}, None))
    equal(peer.quiet(), [], "a notification-shaped submit on a version-1 session: nothing comes back")
    equal(peer.hellos, 1, "no second hello on a version-1 session")
    close(peer)
    ok(f"version-1 session: core.tasks get, list, cancel, respond, subscribe -> unknown_verb; "
       f"app.agent/work -> unknown_verb "
       f"({err['message']!r}); as a notification: nothing")


def run(addr, node_hex, wire_md, invite):
    check_worked_examples(wire_md)
    inv_node, _, code = v1.parse_invite(invite)
    equal(inv_node, node_hex, "invite NODE_ID is the node id")
    a = session(addr, node_hex, "submitter")
    b = session(addr, node_hex, "stranger")
    check_manifests(a)
    t1 = check_ask_task(a)
    check_resubmit(a, t1)
    check_subscribe_from(a, t1)
    check_subscribe_credit(a, t1)
    check_changed_to_node(a)
    t2 = check_cancel(a, b)
    t3 = check_cancel_waiting(a, t1)
    check_submit_refusals(a)
    t4 = check_oversized_result(a)
    tasks = [t1, t2, t3, t4]
    check_list(a, tasks)
    theirs = check_stranger(a, b, tasks)
    check_bad_ids(a)
    check_v1_session(addr, node_hex, t1["id"])
    c = session(addr, node_hex, "control plane")
    check_control_plane(addr, node_hex, a, c, code, tasks, theirs)
    check_sender_quota(addr, node_hex, b)
    for p in (c, a, b):
        close(p)


def close(peer):
    """As peer_v2's close; the control plane may still get copies and pushes."""
    peer.send({"type": "close", "code": "normal", "reason": "done"}, close=(0, "done"))
    try:
        while True:
            frame = peer.pump()
            check(frame["type"] == "hello" or (peer.bound and frame["type"] == "control"),
                  f"{peer.name}: after our close only a hello (or, to the control plane, a copy or push) may come",
                  frame)
    except PeerClosed as e:
        check("inside a message" not in e.how, "the node ends the stream cleanly", e.how)
    peer.t.sock.close()
    ok(f"{peer.name}: close frame + CLOSE 0 sent; the node ended the stream cleanly")


# ------------------------------------------------------------ restart (4.10)

RESTART_STEPS = 1000  # 100 s of steps: the task is still running when the node is killed


def session_with(addr, node_hex, name, secret):
    """A version-2 session from a given static key (the submitter again
    after the node's restart)."""
    t, rs, _ = v1.handshake(addr, secret)
    equal(rs.hex(), node_hex, "responder's static key is the node id")
    public = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()
    hello = v2.our_hello_v2(public)
    peer = TaskPeer(t, rs, name)
    peer.key = public
    peer.send(hello)
    peer.open()
    equal(peer.version, 2, f"{name}: a version-2 session (4.1)")
    return peer


def before_restart(addr, node_hex, state_file):
    """Three tasks for the node to keep through a kill: one completed, one
    working, one waiting on its question. What was seen goes to
    `state_file` for the run after the restart."""
    secret = os.urandom(32)
    a = session_with(addr, node_hex, "submitter", secret)
    saved = {"secret": secret.hex()}
    for name, args, until in (
            ("done", {"text": "before", "steps": 2, "step_ms": 0}, None),
            ("running", {"text": "through a restart", "steps": RESTART_STEPS, "step_ms": 100},
             lambda e: e["kind"] == "progress" and e["body"]["step"] == 2),
            ("asking", {"text": "asked before", "steps": 1, "step_ms": 0, "ask": True},
             lambda e: e["kind"] == "question")):
        req_id, frame = a.submitted(args)
        sub = a.subscribe(frame["result"]["task"])
        if until is None:
            sub.end_ok()
        else:
            sub.until(until)
        tid = frame["result"]["task"]
        saved[name] = {"id": tid, "req_id": req_id, "args": args, "events": [enc(e).hex() for e in sub.events.events],
                       "info": enc(a.get(tid)).hex()}
    open(state_file, "w").write(json.dumps(saved))
    close(a)
    ok(f"before the restart: a completed task, one working (progress step 2 of {RESTART_STEPS} seen), one waiting "
       "on its question; what was seen is saved")


def after_restart(addr, node_hex, state_file):
    saved = json.loads(open(state_file).read())
    a = session_with(addr, node_hex, "submitter", bytes.fromhex(saved["secret"]))
    seen = {n: [v1.decode_strict(bytes.fromhex(h), "a saved event") for h in saved[n]["events"]]
            for n in ("done", "running", "asking")}
    done, running, asking = saved["done"], saved["running"], saved["asking"]

    info = a.get(done["id"])
    equal(enc(info).hex(), done["info"], "the completed task's info after the restart, byte for byte (4.10)")
    equal([enc(e) for e in a.subscribe(done["id"]).end_ok()], [enc(e) for e in seen["done"]],
          "the completed task's events after the restart, byte for byte")
    _, again = a.submitted(done["args"], req_id=done["req_id"])
    equal(again["result"], {"task": done["id"], "state": "completed"},
          "a submit repeated after the restart (the ledger of 4.4 is gone): the same id and the state now (4.10)")
    ok(f"after the restart: the completed task as it was, events and info byte for byte; the same req_id -> "
       f"{{task: {done['id'][:8]}..., state: 'completed'}}: the same task, its state now")

    sub = a.subscribe(running["id"])
    resumed = sub.until(lambda e: e["kind"] == "state" and e["body"] == "resumed")
    events = sub.events.events
    k = len(seen["running"])
    equal([enc(e) for e in events[:k]], [enc(e) for e in seen["running"]],
          "the working task's events seen before the kill, byte for byte after it (written before we were told)")
    before = [e["body"]["step"] for e in events if e["kind"] == "progress"]
    equal(before, list(range(1, len(before) + 1)), "its progress before the kill: steps from 1")
    equal((resumed["state"], resumed["seq"]), ("working", events[-2]["seq"] + 1),
          "state working, body \"resumed\", next in seq, when the node started again (4.10 Restart)")
    nxt = sub.until(lambda e: e["kind"] == "progress")
    equal(nxt["body"], {"step": before[-1] + 1, "of": RESTART_STEPS},
          "app.agent/work resumed after the last step it reported")
    info = check_info(a.expect_ok("core.tasks", "cancel", {"task": running["id"]}), "cancel's info")
    rest = sub.end_ok()
    equal((rest[-1]["kind"], info["state"]), ("error", "canceled"), "the resumed task cancelled")
    ok(f"after the restart: the working task's {k} events as seen, then event {resumed['seq']} state working "
       f"\"resumed\"; progress goes on at step {nxt['body']['step']} (the last before: {before[-1]}); cancelled")

    sub = a.subscribe(asking["id"])
    q2 = sub.until(lambda e: e["kind"] == "question" and e["seq"] > len(seen["asking"]))
    events = sub.events.events
    equal([enc(e) for e in events[:3]], [enc(e) for e in seen["asking"]], "the waiting task's events as seen")
    equal([(e["kind"], e["state"], e["body"]) for e in events[3:]],
          [("state", "working", "resumed"), ("question", "input_required", seen["asking"][2]["body"])],
          "a task waiting on its question when the node stopped: resumed, and its handler asks again")
    err = a.refused("core.tasks", "respond", {"task": asking["id"], "answer": True, "question_seq": 3}, "conflict")
    a.expect_ok("core.tasks", "respond", {"task": asking["id"], "answer": True, "question_seq": q2["seq"]})
    last = sub.end_ok()[-1]
    equal((last["kind"], last["state"]), ("result", "completed"), "the task answered after the restart completes")
    ids, _ = a.list_all(50)
    equal(ids, [asking["id"], running["id"], done["id"]], "list after the restart: the three tasks, newest first")
    close(a)
    ok(f"after the restart: the waiting task resumed and asked again (event {q2['seq']}); respond to the old question "
       f"-> conflict ({err['message']!r}); to the new one: completed; list: all three, newest first")


def main():
    args = sys.argv[1:]
    if len(args) == 4 and args[2] in ("--before-restart", "--after-restart"):
        phase = before_restart if args[2] == "--before-restart" else after_restart
        job = lambda: phase(args[0], args[1], args[3])  # noqa: E731
    elif len(args) == 4:
        job = lambda: run(*args)  # noqa: E731
    else:
        print("\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
        return 2
    try:
        job()
    except Mismatch as e:
        print(f"FAIL {e}", flush=True)
        return 1
    except PeerClosed as e:
        print(f"FAIL the node ended the session early: {e.how}", flush=True)
        return 1
    print("pypeer tasks: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
