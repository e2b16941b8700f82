#!/usr/bin/env bash
# The Python package as a user installs it: builds the wheel with maturin
# (`crates/recall-python`), installs it into a fresh venv that holds numpy
# and nothing else (no PyTorch), and runs its tests there against the
# FlagEmbedding and sentence-transformers references.
# Extra arguments go to `maturin build` (e.g. --release).
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheel is the engine and nothing of the application (ARCHITECTURE.md, "Invariants").
if cargo tree -p recall-python -e normal --prefix none | grep -E '^(axum|tokio|rusqlite|notify|hf-hub|ureq) '; then
  echo "recall-python depends on an application crate (above)" >&2
  exit 1
fi
venv=target/python-test-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2" "numpy>=1.21"
rm -rf target/wheels
"$venv/bin/maturin" build -q -m crates/recall-python/Cargo.toml -o target/wheels "$@"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps target/wheels/recall_embed-*.whl
tests="$PWD/crates/recall-python/tests"
# Run from outside the source tree, so that the installed package is the one imported.
(cd "$venv" && bin/python -m unittest discover -s "$tests")
# Then with the frameworks the adapters serve and Ray (a local cluster of
# two workers), from PyPI (still no PyTorch).
"$venv/bin/pip" install -q --disable-pip-version-check langchain-core llama-index-core "ray[data]"
(cd "$venv" && RECALL_TEST_ADAPTERS=1 RECALL_TEST_RAY=1 bin/python -m unittest discover -s "$tests" -v)
