#!/usr/bin/env python3
"""Search quality on LoCoMo-format conversations: recall beside Hermes's own
search and three baselines, as docs/search.md reports it.

LoCoMo (Maharana et al., ACL 2024) is long two-person conversations over
months, with questions and the turns that answer them. Its licence (CC BY-NC
4.0) keeps it out of this repository: the script reads it from where it lies
(by default ../shared/benchmarks/locomo/locomo-dev.json), and CI never runs it.

For each conversation it writes a Hermes history with the real
hermes_state.SessionDB (one Hermes session per LoCoMo session, speaker A as
`user`, speaker B as `assistant`, a photo's caption appended to its turn,
the session's date as its start and 40 s between turns), indexes it with
`recall index`, starts `recall serve` on it and asks every answerable question
(categories 1-4) verbatim with the defaults, limit 10. Printed per search:

  any@5    a session of the question's evidence in the top 5
  all@5    every session of its evidence in the top 5
  MRR@10   reciprocal rank of the first evidence session
  turn@5   one of the top 5 results' match_message_id is an evidence turn
  weak     share of the right answers in the top 5 that are marked weak
  note     share of questions whose top 5 are all weak (or none): the
           Hermes tool then tells the agent it was probably not discussed
  ms       mean search latency (recall: through /search)

Baselines on the same histories and model: Hermes's session_search with the
question as written and rewritten as `w1 OR w2 ...` (English stop words
dropped), the best message cosine per session (dense only), and reciprocal
rank fusion (k = 60) of those two lists.

    python3 scripts/eval_locomo.py [--data FILE] [--work DIR] [--model DIR]
                                   [--recall BIN] [--compare BIN] [--conversations 0,2]

--compare scores another recall build beside this one, on an index of its
own, in the same run (speed is only comparable within one run).
--work keeps the histories and their indexes (rebuilt only when missing);
without it they go to a temporary directory. The model defaults to the test
all-MiniLM-L6-v2 (scripts/fetch_test_models.sh), the Hermes venv to
scripts/hermes_venv.sh's.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "benchmarks" / "locomo" / "locomo-dev.json"

# A common English stop-word list, for the OR-rewritten keyword baseline.
STOP_WORDS = set(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves""".split()
)

TURN_SECONDS = 40

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


# ---------------------------------------------------------------- Hermes side
# These run under the Hermes venv's python (the script calls itself there).


def sessions_of(conversation: dict):
    """(number, date_time, turns) of each LoCoMo session, in order."""
    numbers = sorted(
        int(m.group(1))
        for k in conversation
        if (m := re.fullmatch(r"session_(\d+)", k)) and conversation[k]
    )
    for n in numbers:
        yield n, conversation[f"session_{n}_date_time"], conversation[f"session_{n}"]


def parse_when(text: str) -> float:
    """LoCoMo's "1:56 pm on 8 May, 2023" as a Unix time (UTC)."""
    dt = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    return dt.replace(tzinfo=timezone.utc).timestamp()


def turn_text(turn: dict) -> str:
    text = turn.get("text", "")
    if turn.get("blip_caption"):
        text += f" [shares a photo of {turn['blip_caption']}]"
    return text


def build_history(home: str, data: str, index: int) -> dict:
    """Writes conversation `index` of `data` into HOME/state.db; returns
    dia_id -> (session id, message id)."""
    import hermes_state

    conversation = json.load(open(data))[index]["conversation"]
    Path(home).mkdir(parents=True, exist_ok=True)
    db = hermes_state.SessionDB(db_path=Path(home) / "state.db")
    speakers = {conversation["speaker_a"]: "user", conversation["speaker_b"]: "assistant"}
    turns = {}
    real_time = hermes_state.time.time
    try:
        for n, when, dialogue in sessions_of(conversation):
            start = parse_when(when)
            sid = f"locomo{index}_session{n:02d}"
            # Hermes stamps a session's start with the clock: the session's date here.
            hermes_state.time.time = lambda: start
            db.create_session(sid, "cli", model="locomo")
            hermes_state.time.time = real_time
            for i, turn in enumerate(dialogue):
                role = speakers.get(turn["speaker"], "user")
                mid = db.append_message(sid, role, turn_text(turn), timestamp=start + TURN_SECONDS * i)
                turns[turn["dia_id"]] = [sid, mid]
    finally:
        hermes_state.time.time = real_time
    db.close()
    return turns


def hermes_search(home: str, queries_file: str) -> dict:
    """Hermes's own session_search: the ranked session ids of each query."""
    import hermes_state
    from tools.session_search_tool import session_search

    db = hermes_state.SessionDB(db_path=Path(home) / "state.db")
    out = {}
    for q in json.load(open(queries_file)):
        started = time.perf_counter()
        result = json.loads(session_search(query=q, limit=10, db=db))
        ms = 1000 * (time.perf_counter() - started)
        out[q] = {"ids": [r["session_id"] for r in result.get("results", [])], "ms": ms}
    db.close()
    return out


# ---------------------------------------------------------------- recall side


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def under_hermes(python: str, *args) -> dict:
    out = run([python, __file__, *args]).stdout
    return json.loads(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout=120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """`recall serve` on one history, for the duration of a `with`."""

    def __init__(self, recall: str, home: Path, model: str, index: Path = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [recall, "serve", "--hermes-home", str(home), "--model", model, "--port", str(self.port)]
        if index:
            self.cmd += ["--index", str(index)]

    def __enter__(self):
        self.process = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"recall serve exited: {self.process.stderr.read()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return self
            except OSError:
                time.sleep(0.2)
        raise SystemExit("recall serve did not start in 120 s")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)


def evidence_ids(qa: dict) -> list:
    """The dia_ids of a question's evidence (some are written `D1:3; D1:5`)."""
    out = []
    for e in qa.get("evidence", []):
        out += re.findall(r"D\d+:\d+", str(e))
    return out


def or_query(question: str) -> str:
    words = [w for w in re.findall(r"[\w']+", question.lower()) if w not in STOP_WORDS and len(w) > 1]
    words = [w.replace("'", "") for w in words]
    return " OR ".join(dict.fromkeys(w for w in words if w))


def cosine_ranking(question_vec, message_vecs, message_sessions):
    """Sessions by their best message's cosine, with that message's index."""
    best = {}
    for i, v in enumerate(message_vecs):
        s = sum(a * b for a, b in zip(question_vec, v))
        sid = message_sessions[i]
        if sid not in best or s > best[sid][0]:
            best[sid] = (s, i)
    return sorted(best, key=lambda k: -best[k][0]), {k: best[k][1] for k in best}


def embed(server: Server, texts: list) -> list:
    out = []
    for i in range(0, len(texts), 64):
        # TEI's route: it cuts a text longer than the model's limit, as indexing does.
        out += post(server.url + "/embed", {"inputs": texts[i : i + 64], "truncate": True})
    return out


def rrf(lists: list, k: float = 60.0) -> list:
    score = {}
    for ranked in lists:
        for pos, sid in enumerate(ranked):
            score[sid] = score.get(sid, 0.0) + 1.0 / (k + pos + 1)
    return sorted(score, key=lambda s: -score[s])


class Scores:
    def __init__(self):
        self.rows = []

    def add(self, ranked, relevant, turns=None, evidence=None, weak=None, ms=None):
        top5 = ranked[:5]
        first = next((i for i, s in enumerate(ranked[:10]) if s in relevant), None)
        row = {
            "any": first is not None and first < 5,
            "all": relevant <= set(top5),
            "rr": 0.0 if first is None else 1.0 / (first + 1),
            "turn": None if turns is None else bool(set(turns[:5]) & evidence),
            "ms": ms,
        }
        if weak is not None:
            right = [w for s, w in zip(top5, weak) if s in relevant]
            row["weak_right"] = right[:1]
            row["note"] = all(weak[:5])
        self.rows.append(row)

    def cells(self):
        n = max(len(self.rows), 1)
        mean = lambda key: sum(r[key] for r in self.rows) / n  # noqa: E731
        out = [f"{mean('any'):.2f}", f"{mean('all'):.2f}", f"{mean('rr'):.2f}"]
        turns = [r["turn"] for r in self.rows if r["turn"] is not None]
        out.append(f"{sum(turns) / len(turns):.2f}" if turns else "–")
        right = [w for r in self.rows for w in r.get("weak_right", [])]
        out.append(f"{100 * sum(right) / len(right):.0f} %" if "note" in self.rows[0] else "–")
        out.append(f"{100 * sum(r['note'] for r in self.rows) / n:.0f} %" if "note" in self.rows[0] else "–")
        ms = [r["ms"] for r in self.rows if r["ms"] is not None]
        out.append(f"{sum(ms) / len(ms):.0f}" if ms else "–")
        return out


def conversation_eval(args, index: int, sample: dict, home: Path, scores: dict):
    if not (home / "turns.json").exists():
        shutil.rmtree(home, ignore_errors=True)
        turns = under_hermes(args.hermes_python, "_build", str(home), str(args.data), str(index))
        (home / "turns.json").write_text(json.dumps(turns))
    turns = json.loads((home / "turns.json").read_text())
    started = time.time()
    run([args.recall, "index", "--hermes-home", str(home), "--model", args.model])
    indexed = time.time() - started
    questions = []
    for qa in sample["qa"]:
        if qa.get("category") not in (1, 2, 3, 4):
            continue
        ev = [turns[e] for e in evidence_ids(qa) if e in turns]
        if not ev:
            continue
        questions.append((qa["question"], {s for s, _ in ev}, {m for _, m in ev}, qa["category"]))

    print(
        f"{sample.get('sample_id', index)}: {len(questions)} questions, "
        f"{len(turns)} messages, indexed in {indexed:.0f} s",
        file=sys.stderr,
    )
    if args.compare:
        # Another recall build on an index of its own, side by side.
        index = home / "compare" / "index.db"
        run([args.compare, "index", "--hermes-home", str(home), "--index", str(index), "--model", args.model])
        with Server(args.compare, home, args.model, index) as server:
            for q, relevant, evidence, _ in questions:
                started = time.perf_counter()
                results = post(server.url + "/search", {"query": q, "limit": 10})["results"]
                scores["recall, --compare build"].add(
                    [r["session_id"] for r in results],
                    relevant,
                    turns=[r["match_message_id"] for r in results],
                    evidence=evidence,
                    weak=[r["weak"] for r in results],
                    ms=1000 * (time.perf_counter() - started),
                )
    with Server(args.recall, home, args.model) as server:
        for q, relevant, evidence, category in questions:
            started = time.perf_counter()
            answer = post(server.url + "/search", {"query": q, "limit": 10})
            ms = 1000 * (time.perf_counter() - started)
            results = answer["results"]
            for key in ("recall, defaults", f"recall, defaults: {CATEGORIES[category]}"):
                scores[key].add(
                    [r["session_id"] for r in results],
                    relevant,
                    turns=[r["match_message_id"] for r in results],
                    evidence=evidence,
                    weak=[r["weak"] for r in results],
                    ms=ms,
                )
        messages = message_texts(home)
        if args.recall_only:
            return
        # The dense baseline: every message's cosine, the best per session.
        vectors = embed(server, [t for _, _, t in messages])
        qvecs = embed(server, [q for q, _, _, _ in questions])
    sessions = [s for _, s, _ in messages]
    dense_lists = []
    for (q, relevant, evidence, _), qv in zip(questions, qvecs):
        ranked, best = cosine_ranking(qv, vectors, sessions)
        dense_lists.append(ranked)
        scores["best message cosine per session"].add(
            ranked, relevant, turns=[messages[best[s]][0] for s in ranked], evidence=evidence
        )

    qfile = home / "questions.json"
    for name, rewrite in (("verbatim", lambda q: q), ("or", or_query)):
        qfile.write_text(json.dumps([rewrite(q) for q, _, _, _ in questions]))
        found = under_hermes(args.hermes_python, "_hermes_search", str(home), str(qfile))
        for i, (q, relevant, _, _) in enumerate(questions):
            hit = found[rewrite(q)]
            key = {
                "verbatim": "Hermes session_search, as written",
                "or": "Hermes session_search, `w1 OR w2 ...`",
            }[name]
            scores[key].add(hit["ids"], relevant, ms=hit["ms"])
            if name == "or":
                scores["RRF (k = 60) of OR-FTS5 and cosine"].add(rrf([hit["ids"], dense_lists[i]]), relevant)


def message_texts(home: Path) -> list:
    """(message id, session id, text) of every message, read-only from state.db."""
    import sqlite3

    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    rows = db.execute("SELECT id, session_id, content FROM messages ORDER BY id").fetchall()
    db.close()
    return [(m, s, t or "") for m, s, t in rows]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_build":
        print(json.dumps(build_history(*sys.argv[2:4], int(sys.argv[4]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_hermes_search":
        print(json.dumps(hermes_search(*sys.argv[2:4])))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LoCoMo-format JSON file")
    p.add_argument("--work", type=Path, help="keep histories and indexes here")
    p.add_argument("--model", help="model directory (default: the test all-MiniLM-L6-v2)")
    p.add_argument("--recall", default=str(ROOT / "target" / "release" / "recall"))
    p.add_argument("--hermes-python", help="a python with hermes-agent (default: scripts/hermes_venv.sh)")
    p.add_argument("--conversations", help="comma-separated indexes (default: all)")
    p.add_argument("--recall-only", action="store_true", help="skip the baselines")
    p.add_argument("--compare", help="another recall binary, scored beside this one (its own index)")
    args = p.parse_args()
    if not args.data.exists():
        raise SystemExit(f"{args.data}: no such file (LoCoMo-format JSON; see its README)")
    if not Path(args.recall).exists():
        raise SystemExit(f"{args.recall}: no recall binary (cargo build --release)")
    if args.model is None:
        args.model = os.environ.get("RECALL_TEST_MINILM") or run(
            ["bash", str(ROOT / "scripts" / "fetch_test_models.sh")]
        ).stdout.strip().splitlines()[-1]
    if args.hermes_python is None:
        args.hermes_python = run(["bash", str(ROOT / "scripts" / "hermes_venv.sh")]).stdout.strip().splitlines()[-1]
    data = json.load(open(args.data))
    chosen = range(len(data)) if not args.conversations else [int(i) for i in args.conversations.split(",")]
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory()
        args.work = Path(tmp.name)
    names = [
        "Hermes session_search, as written",
        "Hermes session_search, `w1 OR w2 ...`",
        "best message cosine per session",
        "RRF (k = 60) of OR-FTS5 and cosine",
        "recall, --compare build",
        "recall, defaults",
    ]
    scores = {n: Scores() for n in names + [f"recall, defaults: {c}" for c in CATEGORIES.values()]}
    for i in chosen:
        conversation_eval(args, i, data[i], args.work / f"conversation-{i}", scores)
    n = len(scores["recall, defaults"].rows)
    print(f"{args.data.name}: {len(list(chosen))} conversations, {n} questions (categories 1-4)")
    print("| search | any@5 | all@5 | MRR@10 | turn@5 | right answers weak | 'not discussed' | ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        if scores[name].rows:
            print(f"| {name} | " + " | ".join(scores[name].cells()) + " |")
    print("\nrecall by question category:\n")
    print("| category | questions | any@5 | all@5 | MRR@10 | turn@5 | right answers weak | 'not discussed' | ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in CATEGORIES.values():
        rows = scores[f"recall, defaults: {c}"]
        print(f"| {c} | {len(rows.rows)} | " + " | ".join(rows.cells()) + " |")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
