#!/usr/bin/env bash
# The Python environment that regenerates recall's reference fixtures
# (scripts/make_tiny_bge_m3.py, scripts/minilm_reference.py) and runs the
# peer benchmarks. Not needed by the tests: their references are committed.
# FlagEmbedding 1.4.2 only imports with transformers<5, datasets<4 and
# sentence-transformers<5. Prints the venv's python on its last line.
set -euo pipefail
venv="${RECALL_DEV_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/recall/venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet torch 'flagembedding==1.4.2' 'transformers<5' 'datasets<4' \
    'sentence-transformers<5' numpy safetensors >&2
fi
echo "$venv/bin/python"
