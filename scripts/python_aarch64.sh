#!/usr/bin/env bash
# The Python wheel on aarch64, checked on an x86-64 machine: cross-builds it
# with maturin, then imports it into Debian's own aarch64 CPython (its
# packages unpacked into a sysroot, never installed) with PyPI's aarch64
# numpy, and runs the package's tests under qemu-aarch64 -cpu max
# (correctness only). scripts/test.sh --full runs it after
# scripts/aarch64.sh, whose dependencies the wheel's build reuses.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/aarch64_toolchain.sh
source scripts/aarch64_toolchain.sh
work="$PWD/target/python-aarch64"

sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo[@]}" dpkg --add-architecture arm64
fi
"${sudo[@]}" apt-get update -qq
rm -rf "$work"
mkdir -p "$work/debs" "$work/root/lib" "$work/site"
# Debian's CPython: the interpreter, its standard library and the C
# libraries they load; the C library itself comes from the cross sysroot.
debian_python=$(apt-cache policy python3 | awk '/Candidate/ {print $2}' | cut -d. -f1,2)
(cd "$work/debs" && apt-get download -q \
  "libpython$debian_python-minimal:arm64" "python$debian_python-minimal:arm64" \
  "libpython$debian_python-stdlib:arm64" zlib1g:arm64 libexpat1:arm64 libffi8:arm64 \
  libbz2-1.0:arm64 liblzma5:arm64 >/dev/null 2>&1)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
cp -a /usr/aarch64-linux-gnu/lib/. "$work/root/lib/aarch64-linux-gnu/"
cp /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 "$work/root/lib/"

venv=target/python-build-venv
if [ ! -x "$venv/bin/maturin" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2"
fi
"$venv/bin/pip" download -q --disable-pip-version-check --only-binary=:all: \
  --platform manylinux2014_aarch64 --implementation cp --python-version "$debian_python" \
  -d "$work/wheels" "numpy>=1.21"
# The dev profile reuses the dependencies scripts/aarch64.sh built
# (scripts/python_test.sh says how).
"$venv/bin/maturin" build -q --target "$target" --profile dev -m crates/recall-python/Cargo.toml -o "$work/wheels"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done

tests="$PWD/crates/recall-python/tests"
# From an empty directory, so that nothing there shadows a package.
mkdir -p "$work/run"
(cd "$work/run" && PYTHONPATH="$work/site" QEMU_LD_PREFIX="$work/root" \
  qemu-aarch64 -cpu max "$work/root/usr/bin/python$debian_python" -m unittest discover -s "$tests")
echo "aarch64 (qemu -cpu max): the recall_embed wheel's tests passed under Debian's CPython $debian_python"
