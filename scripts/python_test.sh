#!/usr/bin/env bash
# The Python package as a user installs it: builds the wheel with maturin
# (`crates/recall-python`), installs it into a fresh venv that holds numpy
# and nothing else (no PyTorch), and runs its tests there against the
# FlagEmbedding and sentence-transformers references.
# Extra arguments go to `maturin build` (e.g. --release). Without any, the
# dev profile: the engine and its dependencies optimised as the tests build
# them, so the build reuses the one scripts/test.sh's `cargo test` made.
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheel is the engine and nothing of the application (ARCHITECTURE.md, "Invariants").
if cargo tree -p recall-python -e normal --prefix none | grep -E '^(axum|tokio|rusqlite|notify|hf-hub|ureq) '; then
  echo "recall-python depends on an application crate (above)" >&2
  exit 1
fi
# That reuse needs the dependencies both builds share to have the same
# features in each (recall-python's Cargo.toml says how).
features() {
  cargo tree "$@" -e features,normal,build,dev --prefix none -f '{p}@{f}' |
    grep -v ' feature "' | sed 's/ (\*)$//; s/ (proc-macro)//' |
    awk -F@ '{gsub(/ /, "_", $1); print $1, ($2 == "" ? "-" : $2)}' | sort -u
}
shared() { awk 'NR == FNR { seen[$1]; next } $1 in seen' "$1" "$2"; }
mkdir -p target
features -p recall-python >target/features-wheel.txt
features --workspace --exclude recall-python >target/features-tests.txt
stale="$(comm -3 <(shared target/features-tests.txt target/features-wheel.txt) \
  <(shared target/features-wheel.txt target/features-tests.txt))"
if [ -n "$stale" ]; then
  echo "the wheel's build and the tests' turn on other features in these" >&2
  echo "(the wheel's first, then the tests', indented):" >&2
  echo "$stale" >&2
  echo "turn them on in both (crates/recall-python/Cargo.toml says why)" >&2
  exit 1
fi
venv=target/python-test-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2" "numpy>=1.21"
rm -rf target/wheels
args=("$@")
[ $# -gt 0 ] || args=(--profile dev)
"$venv/bin/maturin" build -q -m crates/recall-python/Cargo.toml -o target/wheels "${args[@]}"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps target/wheels/recall_embed-*.whl
tests="$PWD/crates/recall-python/tests"
# Run from outside the source tree, so that the installed package is the one imported.
(cd "$venv" && bin/python -m unittest discover -s "$tests")
# Then with the frameworks the adapters serve and Ray (a local cluster of
# two workers), from PyPI (still no PyTorch).
"$venv/bin/pip" install -q --disable-pip-version-check langchain-core llama-index-core "ray[data]"
(cd "$venv" && RECALL_TEST_ADAPTERS=1 RECALL_TEST_RAY=1 bin/python -m unittest discover -s "$tests" -v)
