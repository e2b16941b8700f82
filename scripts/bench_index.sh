#!/usr/bin/env bash
# Indexing benchmark: a corpus of N messages (default 10,000) written by the
# real Hermes, indexed from scratch with the tiny BGE-M3 and with MiniLM.
# Prints, per model: end-to-end tokens/s, the model's own tokens/s in the
# same run (time inside the encoder), the pipeline's overhead, index bytes
# per chunk, and peak memory.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
python="$(bash scripts/hermes_venv.sh | tail -n 1)"
minilm="$(bash scripts/fetch_test_models.sh | tail -n 1)"
cargo build --release --quiet
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" tests/hermes/hermes_db.py bulk "$work/hermes" "$n" >/dev/null
printf '%-18s %8s %7s %9s %11s %11s %9s %10s %9s\n' model messages chunks tokens "e2e tok/s" "model tok/s" overhead bytes/chunk "peak RSS"
for model in models/tiny-bge-m3 "$minilm"; do
  name="$(basename "$model")"
  /usr/bin/time -f '%M' -o "$work/rss" ./target/release/recall index --json --hermes-home "$work/hermes" \
    --index "$work/$name.db" --model "$model" >"$work/out.json"
  python3 - "$work/out.json" "$work/rss" "$work/$name.db" "$name" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
rss_kib = int(open(sys.argv[2]).read().split()[-1])
db = sys.argv[3]
size = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
e2e = r["tokens"] / r["seconds"]
model = r["tokens"] / r["embed_seconds"]
print(f'{sys.argv[4]:<18} {r["messages"]:>8} {r["chunks"]:>7} {r["tokens"]:>9} {e2e:>11.0f} {model:>11.0f} '
      f'{(model / e2e - 1) * 100:>8.1f}% {size / r["chunks"]:>10.0f} {rss_kib / 1024:>7.0f} MiB')
PY
done
