#!/bin/bash
# Build QEMU 10.0.x (x86_64-softmmu, trimmed device set) with the tacc device.
#
# Idempotent.  Output: build/qemu/qemu-system-x86_64 (symlink to the built
# binary); run it with -L /usr/share/seabios -L /usr/share/qemu.
#
#   build/dl/         downloaded source tarball (cache)
#   build/qemu-src/   extracted + patched QEMU tree; hw/tacc/* link to qemu/hw/tacc/*
#   build/qemu-build/ meson/ninja build directory
#
# Rebuild policy: a stamp holds a hash of this script, qemu/** and
# kernel/include/tacc_hw.h.  Same hash + binary present: nothing to do.  A
# change to this script or to the tree-level files (devices .mak,
# patches) re-prepares the tree and reconfigures; a change to device
# sources only runs ninja (incremental).  ccache makes a cold rebuild cheap.
#
# Env: TACC_QEMU_FORCE=1 rebuild unconditionally, TACC_QEMU_JOBS=N,
# TACC_QEMU_TARBALL=path a local copy of the source tarball (checksum-verified).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/build
DL=$B/dl
SRC=$B/qemu-src
BLD=$B/qemu-build
OUT=$B/qemu
VER=10.0.2
TARBALL=qemu_${VER}+ds.orig.tar.xz
SHA256=0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1
JOBS=${TACC_QEMU_JOBS:-$(nproc)}

log() { echo "build-qemu: $*"; }

# one build at a time (make may run us from several places)
mkdir -p "$B"
exec 9>"$B/.qemu-build.lock"
flock 9

hash_of() {  # hash of the listed files/dirs' contents and names
    local p existing=()
    for p in "$@"; do [[ -e $ROOT/$p ]] && existing+=("$p"); done
    (cd "$ROOT" && find "${existing[@]}" -type f -print0 | LC_ALL=C sort -z |
        xargs -0 -r sha256sum) | sha256sum | cut -c1-16
}

# Tree-level inputs: changing these needs a re-prepared tree + reconfigure.
TREE_HASH=$(hash_of scripts/build-qemu.sh qemu/configs qemu/patches)
ALL_HASH=$(hash_of scripts/build-qemu.sh qemu kernel/include/tacc_hw.h)

if [[ "${TACC_QEMU_FORCE:-0}" != 1 && -x $OUT/qemu-system-x86_64 &&
      "$(cat "$B/.qemu-stamp" 2>/dev/null)" == "$ALL_HASH" ]]; then
    log "up to date ($OUT/qemu-system-x86_64)"
    exit 0
fi

# ---------------------------------------------------------------- deps ----
# Nothing beyond scripts/setup.sh: virtfs (9p) needs only <sys/xattr.h> from
# glibc (meson's libattr check links without libattr), no libcap-ng.

# -------------------------------------------------------------- source ----
mkdir -p "$DL"
tarball=$DL/$TARBALL
if [[ ! -f $tarball ]]; then
    if [[ -n ${TACC_QEMU_TARBALL:-} && -f $TACC_QEMU_TARBALL ]]; then
        # a local copy (checked against the pinned sha256 below)
        cp "$TACC_QEMU_TARBALL" "$tarball.part" && mv "$tarball.part" "$tarball"
    else
        log "downloading QEMU source (apt-get source qemu/bookworm-backports)"
        # the .dsc 404s, so apt-get exits non-zero: check for the tarball instead
        (cd "$DL" && apt-get source --download-only qemu/bookworm-backports >/dev/null 2>&1) || true
    fi
fi
if [[ -f $tarball ]]; then
    if ! echo "$SHA256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
        log "ERROR: $tarball: sha256 mismatch"; rm -f "$tarball"; exit 1
    fi
else
    tarball=$(ls "$DL"/qemu_10.*.orig.tar.xz 2>/dev/null | sort -V | tail -n1 || true)
    [[ -n $tarball ]] || { log "ERROR: no QEMU 10.x source tarball in $DL"; exit 1; }
    echo "WARNING: QEMU $VER source not available; using $(basename "$tarball") (unverified)"
fi

# ------------------------------------------------------- prepare tree ----
if [[ "$(cat "$B/.qemu-tree-stamp" 2>/dev/null)" != "$TREE_HASH:$(basename "$tarball")" || ! -f $SRC/VERSION ]]; then
    log "preparing $SRC from $(basename "$tarball")"
    rm -rf "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    tar -xf "$tarball" -C "$SRC.tmp" --strip-components=1
    s=$SRC.tmp
    # our device: a real dir of links so new files need only a re-run
    mkdir -p "$s/hw/tacc"
    ln -sfn "$ROOT/kernel/include" "$s/hw/tacc/include"
    grep -q "subdir('tacc')" "$s/hw/meson.build" || echo "subdir('tacc')" >> "$s/hw/meson.build"
    grep -q "source tacc/Kconfig" "$s/hw/Kconfig" || echo "source tacc/Kconfig" >> "$s/hw/Kconfig"
    /usr/bin/python3 - "$s" <<'PY'
import sys, re, pathlib
s = pathlib.Path(sys.argv[1])
# trace-events of hw/tacc
m = s / "meson.build"
t = m.read_text()
if "'hw/tacc'" not in t:
    t = t.replace("    'hw/misc',\n", "    'hw/misc',\n    'hw/tacc',\n", 1)
    assert "'hw/tacc'" in t
    m.write_text(t)
# the +ds tarball lacks pc-bios/edk2-*.fd.bz2: skip missing ones
p = s / "pc-bios" / "meson.build"
t = p.read_text()
if "fs.exists" not in t:
    t = t.replace("  foreach f : fds\n    roms += custom_target(",
                  "  foreach f : fds\n    if not fs.exists(f + '.bz2')\n      continue\n    endif\n    roms += custom_target(", 1)
    assert "fs.exists" in t
    p.write_text(t)
PY
    cp "$ROOT/qemu/configs/tacc-devices.mak" "$s/configs/devices/x86_64-softmmu/tacc.mak"
    if compgen -G "$ROOT/qemu/patches/*.patch" >/dev/null; then
        for p in "$ROOT"/qemu/patches/*.patch; do patch -d "$s" -p1 -s < "$p"; done
    fi
    rm -rf "$SRC"
    mv "$SRC.tmp" "$SRC"
    rm -rf "$BLD"   # source path contents changed: configure afresh (ccache keeps it cheap)
    echo "$TREE_HASH:$(basename "$tarball")" > "$B/.qemu-tree-stamp"
fi
# device files: (re)link every file of qemu/hw/tacc (new files appear here)
for f in "$ROOT"/qemu/hw/tacc/*; do
    ln -sfn "$f" "$SRC/hw/tacc/$(basename "$f")"
done
for l in "$SRC"/hw/tacc/*; do [[ -e $l ]] || rm -f "$l"; done   # stale links
ln -sfn "$ROOT/kernel/include" "$SRC/hw/tacc/include"

# ----------------------------------------------------------- configure ----
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
if [[ ! -f $BLD/build.ninja ]]; then
    log "configuring"
    rm -rf "$BLD" && mkdir -p "$BLD"
    (cd "$BLD" && "$SRC/configure" \
        --python=/usr/bin/python3 \
        --target-list=x86_64-softmmu \
        --without-default-features --without-default-devices \
        --with-devices-x86_64=tacc \
        --disable-download --disable-install-blobs --disable-docs --disable-werror \
        --enable-tcg --enable-slirp --enable-pixman \
        --enable-attr --enable-virtfs \
        --enable-trace-backends=log \
        --cc=/usr/lib/ccache/gcc --host-cc=/usr/lib/ccache/gcc >configure.log 2>&1) ||
        { tail -n 40 "$BLD/configure.log"; log "ERROR: configure failed"; exit 1; }
fi

# --------------------------------------------------------------- build ----
log "building (ninja -j$JOBS)"
t0=$(date +%s)
ninja -C "$BLD" -j"$JOBS" qemu-system-x86_64 > "$B/qemu-ninja.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$B/qemu-ninja.log" | head -n 60; log "ERROR: build failed (see $B/qemu-ninja.log)"; exit 1; }
mkdir -p "$OUT"
ln -sfn "$BLD/qemu-system-x86_64" "$OUT/qemu-system-x86_64"
echo "$ALL_HASH" > "$B/.qemu-stamp"
log "done in $(( $(date +%s) - t0 )) s: $OUT/qemu-system-x86_64"
