#!/usr/bin/env bash
# recall on aarch64 (Apple Silicon's ISA, Graviton, Ampere), checked on an
# x86-64 machine: cross-builds for aarch64-unknown-linux-gnu and runs the
# unit and parity tests and the retrieval evaluation's searches under
# qemu-aarch64 (correctness only: timings under emulation mean nothing).
# Clippy for the target is scripts/lint.sh's.
#
# Installs what it needs (scripts/aarch64_toolchain.sh).
# Extra arguments go to every `cargo test`.
#
# Three emulated CPUs:
# - `max`: every feature qemu has, I8MM among them, so q8 runs recall's
#   smmla tile (Apple M2 on, Graviton 3 on) and f32 its NEON tile;
# - `neoverse-n1` (Graviton 2; like Apple M1, the dot product without
#   I8MM): q8's sdot tile;
# - `cortex-a72` (Graviton 1, Raspberry Pi 4): no dot product, so q8 runs
#   the portable loop.
# Every q8 kernel must give the same integers (the unit tests compare them).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/aarch64_toolchain.sh
source scripts/aarch64_toolchain.sh
runner="qemu-aarch64 -L $sysroot"

# The tests read this to find the real all-MiniLM-L6-v2 (scripts/test.sh
# sets it).
if [ -z "${RECALL_TEST_MINILM:-}" ]; then
  RECALL_TEST_MINILM="$(bash scripts/fetch_test_models.sh | tail -n 1)"
fi
export RECALL_TEST_MINILM

# The retrieval evaluation (tests/it/eval.rs). Indexing its test history under
# qemu takes longer than CI has: qemu emulates floating point in software,
# so f32 MiniLM runs about 45x slower than natively (one indexing ran past
# 14 minutes with 45 of 305 messages done). So the history is written and
# indexed natively (x86-64), then searched under qemu against the same
# floors: every query embedded by the NEON tile, and the ranking,
# sqlite-vec's distances and the binary first pass run on aarch64 (about 7
# minutes). Its passages' vectors are the parity tests' (f32 within 1e-5 of
# sentence-transformers). RECALL_AARCH64_EVAL=1 runs all of tests/it/eval.rs
# under qemu instead, indexing included (slow).
if [ -z "${RECALL_TEST_HERMES_PYTHON:-}" ]; then
  RECALL_TEST_HERMES_PYTHON="$(bash scripts/hermes_venv.sh | tail -n 1)"
fi
export RECALL_TEST_HERMES_PYTHON
packages=(--workspace --exclude recall-python)
lib=("${packages[@]}" --lib)
it=("${packages[@]}" --test it)
filters=(bge_m3_parity:: minilm::)
if [ "${RECALL_AARCH64_EVAL:-0}" = 1 ]; then
  filters+=(eval::)
else
  eval_dir="$(mktemp -d)"
  trap 'rm -rf "$eval_dir"' EXIT
  floors=eval::search_holds_its_floors_on_the_test_history
  RECALL_EVAL_DIR="$eval_dir" cargo test "$@" "${it[@]}" -- "$floors"
  RECALL_EVAL_DIR="$eval_dir" CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner -cpu max" \
    cargo test --target "$target" "$@" "${it[@]}" -- "$floors"
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner -cpu max"
cargo test --target "$target" "$@" "${lib[@]}"
cargo test --target "$target" "$@" "${it[@]}" -- "${filters[@]}" --skip defaults_are_the_best_on_dev
for cpu in neoverse-n1 cortex-a72; do
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner -cpu $cpu"
  cargo test --target "$target" "$@" "${lib[@]}" -- quant q8
  cargo test --target "$target" "$@" "${it[@]}" -- bge_m3_parity::q8
done

# The binary says which kernels it picked on each.
for cpu in max neoverse-n1 cortex-a72; do
  echo "aarch64 (qemu -cpu $cpu):"
  $runner -cpu "$cpu" "target/$target/debug/recall" --version | sed 's/^/  /'
done
