#!/usr/bin/env bash
# recall on macOS, checked on Linux: clippy with -D warnings for
# aarch64-apple-darwin (Apple Silicon), every crate and target, with the
# Metal feature (`cargo install --features metal`), so that the code behind
# cfg(target_os = "macos"), the fallbacks of Linux-only calls, candle's
# Metal backend and every dependency's Rust type-check and lint clean for
# macOS.
#
# Not a build: there is no macOS SDK here, so nothing is linked or run, and
# the C and assembly sources of dependencies (SQLite, sqlite-vec, oniguruma,
# mimalloc, ring, among others) are not compiled: a stand-in C compiler answers cc's probes as clang and
# writes empty objects, which `cargo clippy` never links.
#
# Installs the Rust target (rustup) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-apple-darwin
rustup target add "$target" >/dev/null 2>&1 || rustup target add "$target"

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cat > "$dir/cc" <<'EOF'
#!/bin/sh
out=
for a in "$@"; do
  case "$a" in
    -E) echo '#pragma message "clang"'; exit 0;; # cc's family probe
    '-?') exit 1;;                                # not cl.exe
  esac
done
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift;; esac
  shift
done
[ -z "$out" ] || : > "$out"
EOF
chmod +x "$dir/cc"

CC_aarch64_apple_darwin="$dir/cc" CXX_aarch64_apple_darwin="$dir/cc" AR_aarch64_apple_darwin=ar \
  cargo clippy --target "$target" --workspace --all-targets --features metal -- -D warnings
echo "macOS (aarch64-apple-darwin, --features metal): clippy -D warnings clean (type-checked, not linked)"
