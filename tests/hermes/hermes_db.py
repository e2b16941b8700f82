#!/usr/bin/env python3
"""Writes Hermes test databases with the real Hermes (hermes-agent==0.19.0's
hermes_state.SessionDB), for recall's indexing tests. Prints JSON.

    hermes_db.py create HOME [--mode wal|delete]     a small realistic history
    hermes_db.py append HOME SESSION ROLE TEXT       one more message
    hermes_db.py append-file HOME SESSION ROLE FILE  one more message, its text read from FILE (a large one)
    hermes_db.py replace HOME SESSION KEEP [EDIT]    /retry-style rewrite: keep the first KEEP messages,
                                                     the last of them with its text changed to EDIT
    hermes_db.py bulk HOME N [--mode wal|delete]     N messages over N/10 sessions
    hermes_db.py writer HOME SECONDS                 append for SECONDS; report lock errors
    hermes_db.py eval-create HOME CORPUS.json        the retrieval-evaluation history
    hermes_db.py chat-create HOME HISTORY.json       everyday conversations (tests/hermes/chat/): message ids
    hermes_db.py hermes-search HOME QUERY...         Hermes's own session_search: ranked session ids per query
    hermes_db.py live-copy HOME DEST                 a copy of HOME's state.db and its WAL taken while
                                                     Hermes has it open (a backup of a live database)
    hermes_db.py odd-rows HOME                       a session whose rows hold what Hermes can store but is no
                                                     clean text: bytes content (through append_message), text
                                                     that is not UTF-8, a timestamp written as text
"""

import json
import random
import sys
import time
from pathlib import Path

import hermes_state


def open_db(home: str, mode: str = "wal") -> "hermes_state.SessionDB":
    if mode == "delete":
        # Hermes picks DELETE mode on filesystems without WAL; do the same here.
        def delete_mode(conn, **_kw):
            conn.execute("PRAGMA journal_mode=DELETE")
            return "delete"

        hermes_state.apply_wal_with_fallback = delete_mode
    Path(home).mkdir(parents=True, exist_ok=True)
    return hermes_state.SessionDB(db_path=Path(home) / "state.db")


SESSIONS = [
    ("20260301_101500_aa0001", "cli", "Disk cleanup on the build server", [
        ("user", "The build server says no space left on device, what can I delete?"),
        ("assistant", "Let's look at what is using the disk: run du -sh /var/* and docker system df."),
        ("user", "docker images take 40GB"),
        ("assistant", "Run docker image prune -a to remove unused images, and clear old logs in /var/log."),
    ]),
    ("20260302_090000_aa0002", "telegram", "Nginx config error", [
        ("user", "nginx -t says unexpected end of file in sites-enabled/default"),
        ("assistant", "A closing brace is missing: check the server block before line 40."),
    ]),
    ("20260303_180000_aa0003", "cli", "数据库迁移方案", [
        ("user", "我们讨论一下数据库从 MySQL 迁移到 PostgreSQL 的方案"),
        ("assistant", "建议先用 pgloader 做一次全量迁移，然后用逻辑复制同步增量。"),
    ]),
    ("20260304_120000_aa0004", "subagent", "Delegated research", [
        ("user", "Summarise the ERR_CONNECTION_RESET reports"),
        ("assistant", "The resets come from the proxy's idle timeout."),
    ]),
    ("20260305_070000_aa0005", "cron", "Morning email digest", [
        ("user", "Summarise my unread email"),
        ("assistant", "You have three unread emails about the quarterly report."),
    ]),
]


def create(home: str, mode: str) -> dict:
    db = open_db(home, mode)
    ids = {}
    for sid, source, title, messages in SESSIONS:
        db.create_session(sid, source, model="test-model")
        db.set_session_title(sid, title)
        ids[sid] = [db.append_message(sid, role, content) for role, content in messages]
    # A tool call with no text, a tool result, and multimodal content.
    sid = SESSIONS[0][0]
    calls = [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{\"command\": \"df -h\"}"}}]
    ids[sid].append(db.append_message(sid, "assistant", None, tool_calls=calls))
    ids[sid].append(db.append_message(sid, "tool", "Filesystem Size Used Avail\n/dev/sda1 100G 99G 1G", tool_call_id="c1", tool_name="terminal"))
    parts = [{"type": "text", "text": "Here is a screenshot of the disk usage chart"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    ids[sid].append(db.append_message(sid, "user", parts))
    # A compressed continuation of the first session.
    child = "20260301_113000_aa0006"
    db.create_session(child, "cli", model="test-model", parent_session_id=sid)
    ids[child] = [db.append_message(child, "user", "After the cleanup, the disk is at 60 percent again.")]
    db.close()
    return {"ids": ids}


def append(home: str, session: str, role: str, text: str) -> dict:
    db = open_db(home)
    if db.get_session(session) is None:
        db.create_session(session, "cli", model="test-model")
    mid = db.append_message(session, role, text)
    committed_at = time.time()
    db.close()
    return {"id": mid, "committed_at": committed_at}


def replace(home: str, session: str, keep: int, edit: str = None) -> dict:
    db = open_db(home)
    rows = db.get_messages(session)
    kept = [{"role": r["role"], "content": r["content"], "timestamp": r["timestamp"]} for r in rows[:keep]]
    if edit is not None and kept:
        kept[-1]["content"] = edit
    db.replace_messages(session, kept)
    ids = [r["id"] for r in db.get_messages(session)]
    db.close()
    return {"ids": ids}


TOPICS = [
    "the server ran out of disk space and docker images filled the root partition",
    "nginx returned 502 bad gateway after the upstream restarted",
    "how to write a Rust iterator that borrows from a vector",
    "planning a trip to Kyoto in the autumn with temples and gardens",
    "a recipe for sourdough bread with a long cold fermentation",
    "数据库迁移到 PostgreSQL 的步骤和风险",
    "configuring a systemd timer that runs a backup every night",
    "ERR_CONNECTION_RESET when the browser talks to the proxy",
]


def bulk(home: str, n: int, mode: str) -> dict:
    db = open_db(home, mode)
    rng = random.Random(7)
    per = 10
    for s in range((n + per - 1) // per):
        sid = f"20260401_{s // 3600:02d}{(s // 60) % 60:02d}{s % 60:02d}_{s:06x}"
        db.create_session(sid, rng.choice(["cli", "telegram", "discord"]), model="test-model")
        for i in range(min(per, n - s * per)):
            topic = rng.choice(TOPICS)
            role = "user" if i % 2 == 0 else "assistant"
            words = " ".join(rng.choice(topic.split()) for _ in range(rng.randint(5, 60)))
            db.append_message(sid, role, f"{topic}. {words}")
    db.close()
    return {"messages": n}


def writer(home: str, seconds: float) -> dict:
    db = open_db(home)
    sid = "20260501_000000_ffffff"
    if db.get_session(sid) is None:
        db.create_session(sid, "cli", model="test-model")
    written, errors = 0, []
    end = time.time() + seconds
    while time.time() < end:
        try:
            db.append_message(sid, "user", f"concurrent message {written} about disk space")
            written += 1
        except Exception as e:  # a lock error here is what the test looks for
            errors.append(repr(e))
        time.sleep(0.005)
    db.close()
    return {"written": written, "errors": errors}


def eval_create(home: str, corpus: str) -> dict:
    db = open_db(home)
    data = json.load(open(corpus))
    for s in data["sessions"]:
        db.create_session(s["id"], s["source"], model="test-model", parent_session_id=s.get("parent"))
        db.set_session_title(s["id"], s["title"])
        for role, content in s["messages"]:
            db.append_message(s["id"], role, content)
    db.close()
    return {"sessions": len(data["sessions"])}


def chat_create(home: str, history: str) -> dict:
    db = open_db(home)
    ids = {}
    for s in json.load(open(history))["sessions"]:
        db.create_session(s["id"], "cli", model="test-model")
        ids[s["id"]] = [db.append_message(s["id"], role, content) for role, content in s["messages"]]
    db.close()
    return {"ids": ids}


def live_copy(home: str, dest: str) -> dict:
    import shutil

    db = open_db(home)
    mid = db.append_message("20260301_101500_aa0001", "user", "written just before the backup")
    Path(dest).mkdir(parents=True, exist_ok=True)
    for name in ("state.db", "state.db-wal"):
        shutil.copyfile(Path(home) / name, Path(dest) / name)
    db.close()
    return {"id": mid}


def odd_rows(home: str) -> dict:
    import sqlite3

    db = open_db(home)
    sid = "20260601_000000_0dd001"
    db.create_session(sid, "cli", model="test-model")
    db.set_session_title(sid, "Odd rows")
    # Hermes's own append_message passes bytes through: a BLOB in `content`.
    as_bytes = db.append_message(sid, "user", "the backup disk \u00e9 is full".encode("utf-8") + b" \xff\xfe")
    not_utf8 = db.append_message(sid, "assistant", "placeholder")
    text_time = db.append_message(sid, "user", "a timestamp written as text")
    fine = db.append_message(sid, "assistant", "after the odd rows, a clean message about rsync")
    db.close()
    # What older writers left: text that is not UTF-8, a timestamp as text.
    raw = sqlite3.connect(str(Path(home) / "state.db"))
    raw.execute("UPDATE messages SET content = CAST(X'6e6f7420c3a9c3a920ff7574662d38' AS TEXT) WHERE id = ?", (not_utf8,))
    raw.execute("UPDATE messages SET timestamp = 'yesterday' WHERE id = ?", (text_time,))
    # Terminal escapes and a NUL in what `recall search` and `show` print.
    raw.execute("UPDATE sessions SET title = ? WHERE id = ?", ("Odd \x1b[2J\x1b[31mrows\x00", sid))
    raw.execute("UPDATE messages SET content = ? WHERE id = ?", ("after the odd rows, a clean message about rsync \x1b]0;pwned\x07", fine))
    raw.commit()
    raw.close()
    return {"session": sid, "ids": [as_bytes, not_utf8, text_time, fine]}


def hermes_search(home: str, queries: list) -> dict:
    from tools.session_search_tool import session_search

    db = open_db(home)
    out = {}
    for q in queries:
        result = json.loads(session_search(query=q, limit=10, db=db))
        out[q] = [r["session_id"] for r in result.get("results", [])]
    db.close()
    return {"results": out}


def main() -> None:
    args = sys.argv[1:]
    mode = "wal"
    if "--mode" in args:
        i = args.index("--mode")
        mode = args[i + 1]
        del args[i : i + 2]
    cmd, home, rest = args[0], args[1], args[2:]
    if cmd == "create":
        out = create(home, mode)
    elif cmd == "append-file":
        out = append(home, rest[0], rest[1], Path(rest[2]).read_text(encoding="utf-8"))
    elif cmd == "append":
        out = append(home, *rest)
    elif cmd == "replace":
        out = replace(home, rest[0], int(rest[1]), rest[2] if len(rest) > 2 else None)
    elif cmd == "bulk":
        out = bulk(home, int(rest[0]), mode)
    elif cmd == "eval-create":
        out = eval_create(home, rest[0])
    elif cmd == "chat-create":
        out = chat_create(home, rest[0])
    elif cmd == "live-copy":
        out = live_copy(home, rest[0])
    elif cmd == "odd-rows":
        out = odd_rows(home)
    elif cmd == "hermes-search":
        out = hermes_search(home, rest)
    elif cmd == "writer":
        out = writer(home, float(rest[0]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
