#!/usr/bin/env bash
# clippy -D warnings for every target recall ships on: x86-64 Linux,
# aarch64 Linux (installing its toolchain: scripts/aarch64_toolchain.sh)
# and macOS on Apple Silicon with Metal (scripts/macos.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup component add clippy >/dev/null 2>&1 || true
# shellcheck source=scripts/aarch64_toolchain.sh
source scripts/aarch64_toolchain.sh
cargo clippy --workspace --all-targets -- -D warnings
echo "x86-64 Linux: clippy -D warnings clean"
cargo clippy --target "$target" --workspace --all-targets -- -D warnings
echo "aarch64 Linux: clippy -D warnings clean"
bash scripts/macos.sh
