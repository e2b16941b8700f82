#!/usr/bin/env python3
"""Builds recall's retrieval evaluation from its parts: checks every part,
then splits it once, by session group, into a dev history (the one search's
constants are tuned on) and a test history (only ever scored).

    python3 tests/hermes/eval/build.py      writes dev.json and test.json here

Each part-N.json holds sessions ({id, source, title, group, messages,
parent?}) and labelled queries ({query, kind, relevant}). Sessions that
belong together (a multi-session topic, a near-duplicate pair, a parent and
its continuation, a hidden session and the visible one it mirrors) share a
group, so they land in the same history and no query spans the two.
part-0.json is the first, smaller evaluation, whose queries recall's earlier
minimum score was calibrated on: it is dev as a whole. Every other group goes
to dev or test by a hash of its name, so the split never changes when a
constant does. tests/hermes/hermes_db.py `eval-create` writes a history into
a Hermes database with the real Hermes SessionDB; tests/it/eval.rs scores it.
"""

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HIDDEN = {"kanban", "subagent", "tool"}
KINDS = {"paraphrase", "identifier", "cron", "multi", "distractor", "absent", "chinese", "mixed"}
ID = re.compile(r"^\d{8}_\d{6}_[0-9a-z]{6}$")


def fail(part: str, why: str) -> None:
    sys.exit(f"{part}: {why}")


def check(name: str, data: dict) -> None:
    sessions = {s["id"]: s for s in data["sessions"]}
    if len(sessions) != len(data["sessions"]):
        fail(name, "duplicate session ids")
    for s in data["sessions"]:
        if not ID.match(s["id"]):
            fail(name, f"session id {s['id']!r} is not Hermes's YYYYMMDD_HHMMSS_xxxxxx")
        roles = [r for r, _ in s["messages"]]
        if not roles or any(r != ("user" if i % 2 == 0 else "assistant") for i, r in enumerate(roles)):
            fail(name, f"{s['id']}: roles must alternate from user")
        parent = s.get("parent")
        if parent is not None and (parent not in sessions or parent >= s["id"]):
            fail(name, f"{s['id']}: parent {parent} missing or not earlier")
        if parent is not None and sessions[parent].get("group") != s.get("group"):
            fail(name, f"{s['id']}: a continuation shares its parent's group")
    seen = set()
    for q in data["queries"]:
        if q["kind"] not in KINDS:
            fail(name, f"{q['query']!r}: unknown kind {q['kind']}")
        if q["query"] in seen:
            fail(name, f"{q['query']!r} twice")
        seen.add(q["query"])
        if (q["kind"] == "absent") != (not q["relevant"]):
            fail(name, f"{q['query']!r}: absent queries, and only they, have no relevant session")
        for sid in q["relevant"]:
            if sid not in sessions:
                fail(name, f"{q['query']!r}: no session {sid}")
            if sessions[sid]["source"] in HIDDEN:
                fail(name, f"{q['query']!r}: {sid} is hidden from search")
        if len({sessions[sid].get("group", sid) for sid in q["relevant"]}) > 1:
            fail(name, f"{q['query']!r}: relevant sessions of two groups")
        if q["kind"] == "identifier":
            needle = q["query"].lower()
            holders = {
                sid
                for sid, s in sessions.items()
                if needle in (s["title"] + "\n" + "\n".join(t for _, t in s["messages"])).lower()
            }
            if not holders or not holders <= set(q["relevant"]) | {
                sid for sid, s in sessions.items() if s["source"] in HIDDEN
            }:
                fail(name, f"identifier {q['query']!r} occurs in {sorted(holders)}, relevant {q['relevant']}")


def split_of(part: str, group: str) -> str:
    if part == "part-0":
        return "dev"
    digest = hashlib.sha256(f"{part}/{group}".encode()).digest()
    return "test" if digest[0] & 1 else "dev"


def main() -> None:
    out = {"dev": {"sessions": [], "queries": []}, "test": {"sessions": [], "queries": []}}
    titles = {"dev": set(), "test": set()}
    for path in sorted(HERE.glob("part-*.json")):
        part = path.stem
        data = json.loads(path.read_text())
        check(part, data)
        sessions = {s["id"]: s for s in data["sessions"]}
        for s in data["sessions"]:
            split = split_of(part, s.get("group", s["id"]))
            title = s["title"]
            # Hermes keeps titles unique; a second run of a job gets "#2" as its continuations do.
            n = 2
            while title in titles[split]:
                title, n = f"{s['title']} #{n}", n + 1
            titles[split].add(title)
            out[split]["sessions"].append({**s, "title": title, "part": part})
        for q in data["queries"]:
            group = (
                sessions[q["relevant"][0]].get("group", q["relevant"][0])
                if q["relevant"]
                else "absent:" + q["query"]
            )
            out[split_of(part, group)]["queries"].append({**q, "part": part})
    for split, data in out.items():
        ids = [s["id"] for s in data["sessions"]]
        if len(set(ids)) != len(ids):
            sys.exit(f"{split}: session ids repeat across parts")
        (HERE / f"{split}.json").write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        kinds = {}
        for q in data["queries"]:
            kinds[q["kind"]] = kinds.get(q["kind"], 0) + 1
        print(f"{split}: {len(data['sessions'])} sessions, {len(data['queries'])} queries {kinds}")


if __name__ == "__main__":
    main()
