# Sourced by the scripts that build for aarch64-unknown-linux-gnu (Apple
# Silicon's ISA on Linux, Graviton, Ampere) on an x86-64 machine: installs
# what they need, the Rust target (rustup) and Debian's cross compiler,
# C library and qemu-user (apt-get, as root or through sudo), and points
# cargo and the C builds at the cross compiler.
target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
rustup target add "$target" >/dev/null 2>&1 || rustup target add "$target"
packages=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
