#!/usr/bin/env bash
# Build qemu-fuzz-x86_64: QEMU's coverage-guided fuzzer (libFuzzer, ASan) from the
# same prepared source as build/qemu (scripts/build-qemu.sh), in its own build
# directory build/qemu-fuzz-build, with clang-16 through ccache.  Not part of
# `make setup`: `make fuzz` and `make test-long` run it (docs/hardware.md
# "Coverage-guided fuzzing").
#
# Env: TACC_QEMU_JOBS=N (default nproc).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/build
SRC=$B/qemu-src
BLD=$B/qemu-fuzz-build
JOBS=${TACC_QEMU_JOBS:-$(nproc)}

log() { echo "build-fuzz: $*"; }

# the toolchain: Debian's clang-16 and its libFuzzer/ASan runtimes
missing=()
for p in clang-16 libclang-rt-16-dev ccache; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$B/apt-fuzz.log" 2>&1 ||
        { tail -n 20 "$B/apt-fuzz.log"; log "ERROR: apt-get install failed"; exit 1; }
fi
# the prepared tree (patches, hw/tacc links) comes from the ordinary build
"$ROOT/scripts/build-qemu.sh"

exec 9>"$B/.qemu-fuzz-build.lock"
flock 9

# a small device set: what the generic-fuzz configuration instantiates
cat >"$SRC/configs/devices/x86_64-softmmu/tacc-fuzz.mak" <<'EOF'
CONFIG_Q35=y
CONFIG_VTD=y
CONFIG_PCIE_PORT=y
CONFIG_VIRTIO_PCI=y
CONFIG_TACC=y
EOF
# ccache in front of clang (CCACHE_BASEDIR: hits across worktrees)
mkdir -p "$B/fuzz-cc"
printf '#!/bin/sh\nexec ccache clang-16 "$@"\n' >"$B/fuzz-cc/cc" && chmod +x "$B/fuzz-cc/cc"
printf '#!/bin/sh\nexec ccache clang++-16 "$@"\n' >"$B/fuzz-cc/c++" && chmod +x "$B/fuzz-cc/c++"
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
if [[ ! -f $BLD/build.ninja ]]; then
    log "configuring ($BLD)"
    rm -rf "$BLD" && mkdir -p "$BLD"
    (cd "$BLD" && "$SRC/configure" \
        --python=/usr/bin/python3 \
        --target-list=x86_64-softmmu \
        --without-default-features --without-default-devices \
        --with-devices-x86_64=tacc-fuzz \
        --disable-download --disable-install-blobs --disable-docs --disable-werror \
        --enable-tcg --enable-fuzzing --enable-asan \
        --enable-trace-backends=log \
        --cc="$B/fuzz-cc/cc" --cxx="$B/fuzz-cc/c++" --host-cc="$B/fuzz-cc/cc" \
        >configure.log 2>&1) ||
        { tail -n 40 "$BLD/configure.log"; log "ERROR: configure failed"; exit 1; }
fi
log "building (ninja -j$JOBS qemu-fuzz-x86_64)"
t0=$(date +%s)
ninja -C "$BLD" -j"$JOBS" qemu-fuzz-x86_64 >"$B/qemu-fuzz-ninja.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$B/qemu-fuzz-ninja.log" | head -n 60
      log "ERROR: build failed (see $B/qemu-fuzz-ninja.log)"; exit 1; }
log "done in $(($(date +%s) - t0)) s: $BLD/qemu-fuzz-x86_64"
