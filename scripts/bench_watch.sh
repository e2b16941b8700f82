#!/usr/bin/env bash
# Real-time indexing latency: the real Hermes (hermes-agent from PyPI)
# appends messages one at a time while `recall watch` runs; for each, the time
# from Hermes's commit to the first `recall search` that finds it.
#
#   bash scripts/bench_watch.sh [MODEL_DIR] [MESSAGES]
#
# MODEL_DIR defaults to models/tiny-bge-m3 (the pipeline's own latency);
# give models/bge-m3-random for BGE-M3's embedding cost on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/tiny-bge-m3}"
n="${2:-20}"
python="$(bash scripts/hermes_venv.sh | tail -n 1)"
cargo build --release --quiet
recall="$PWD/target/release/recall"
tmp="$(mktemp -d)"
watch_pid=""
trap '[ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
home="$tmp/hermes"
"$python" tests/hermes/hermes_db.py create "$home" >/dev/null
"$recall" watch --hermes-home "$home" --model "$model" >/dev/null 2>&1 &
watch_pid=$!
until "$recall" search --json --signals keyword nginx --hermes-home "$home" 2>/dev/null | grep -q session_id; do
  sleep 0.2
done
RECALL="$recall" PYTHONPATH=tests/hermes "$python" - "$home" "$n" <<'PY'
import os, subprocess, sys, time
import hermes_db

home, n = sys.argv[1], int(sys.argv[2])
recall = os.environ["RECALL"]
latencies = []
for i in range(n):
    word = f"benchword{i}x"
    committed = hermes_db.append(home, "20260601_120000_bench", "user", f"a new message with {word}")["committed_at"]
    while True:
        out = subprocess.run([recall, "search", "--json", "--signals", "keyword", word, "--hermes-home", home],
                             capture_output=True, text=True).stdout
        if "session_id" in out:
            break
        time.sleep(0.02)
    latencies.append(time.time() - committed)
latencies.sort()
pick = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))]
print(f"{n} messages appended by Hermes, commit -> searchable: p50 {pick(0.5):.2f} s, p90 {pick(0.9):.2f} s, max {latencies[-1]:.2f} s")
PY
