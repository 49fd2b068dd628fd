#!/bin/bash
# The debug guest kernel (KASAN, KFENCE, lockdep, DEBUG_OBJECTS, kmemleak, fault
# injection) from Debian's linux-source-6.12 at the version of scripts/kernel.pin,
# x86_64_defconfig + scripts/debug-kernel/config.fragment, ccache'd, plus tacc.ko
# and an initramfs for it. Never run by `make setup`: only by `make test-debug`,
# `make run-vm KERNEL=debug` and by hand.
#   scripts/debug-kernel.sh            build what is missing or stale (cold: 878 s on 2 cores, 2026-12-04)
#   scripts/debug-kernel.sh --release  print the kernel release (after a build)
# Output, all under build/kernel-debug/:
#   src/      the kernel source (unpacked once per linux-source version)
#   obj/      the build tree (O=): bzImage, vmlinux, and the headers tree bcc uses
#             (the guest links /lib/modules/<release>/build to it at boot)
#   release   the kernel release, e.g. 6.12.117-tacc-debug
#   tacc/     tacc.ko built against obj/ (copied to build/modules/<release>/tacc.ko)
# Environment: JOBS=2, NICE=19, SETUP_QUIET=1, TACC_DEBUG_CCACHE_DIR (its own cache,
# ~/.cache/ccache-tacc-debug-kernel, 10G: TACC_DEBUG_CCACHE_SIZE).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$root/build/kernel-debug
log() { [ "${SETUP_QUIET:-0}" = 1 ] || echo "debug-kernel: $*"; }
die() { echo "debug-kernel: $*" >&2; exit 1; }

if [ "${1:-}" = --release ]; then
	[ -f "$out/release" ] || die "not built yet: scripts/debug-kernel.sh"
	cat "$out/release"; exit 0
fi
[ "$(id -u)" = 0 ] || die "must run as root (apt)"
mkdir -p "$out"
exec 8>"$out/.lock"
flock 8

# ---- packages: the kernel source at the pinned kernel's Debian version (the archive keeps
# only a series' newest point release: when the pinned one is gone, that newest 6.12 one,
# said once), pahole for BTF
pin=$(head -1 scripts/kernel.pin)       # 6.12.117+deb12-amd64
upstream=${pin%%+*}                     # 6.12.117
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'; }
src_version() { dpkg-query -W -f='${Version}' linux-source-6.12 2>/dev/null || true; }
archive_version() {  # the pinned release's source if the archive has it, else its newest
	apt-cache madison linux-source-6.12 | awk -v u="$upstream" '
		NR == 1 {newest = $3} $3 ~ "^"u"-" {print $3; found = 1; exit}
		END {if (!found && newest) print newest}'
}
v=$(archive_version)
if [ -z "$v" ] && ! installed linux-source-6.12; then
	apt-get update -q >build/apt-update.log 2>&1 || true
	v=$(archive_version)
fi
[ -n "$v" ] || v=$(src_version)
[ -n "$v" ] || die "linux-source-6.12 is not in the archive (bookworm-security) and not installed"
[[ $v == "$upstream"-* ]] || log "linux-source-6.12 $upstream-* is not in the archive: building $v"
if ! installed linux-source-6.12 || [ "$(src_version)" != "$v" ] || ! installed dwarves; then
	export DEBIAN_FRONTEND=noninteractive
	log "installing linux-source-6.12=$v dwarves"
	apt-get install -y -q --allow-downgrades --no-install-recommends "linux-source-6.12=$v" dwarves \
		>build/apt-debug-kernel.log 2>&1 || { tail -20 build/apt-debug-kernel.log >&2; die "apt-get install failed"; }
fi
command -v pahole >/dev/null || die "pahole missing (dwarves)"

# ---- source: unpacked once per package version
want_src=$(src_version)
if [ "$(cat "$out/src/.tacc-version" 2>/dev/null)" != "$want_src" ]; then
	log "unpacking linux-source-6.12 $want_src"
	rm -rf "$out/src" "$out/src.tmp"
	mkdir -p "$out/src.tmp"
	tar -xJf /usr/src/linux-source-6.12.tar.xz -C "$out/src.tmp" --strip-components=1
	# Two helper symbols have no prompt (drivers select them); tacc is out of tree.
	python3 - "$out/src.tmp/drivers/gpu/drm/Kconfig" <<'PY'
import re, sys
p = sys.argv[1]
t = open(p).read()
for sym, prompt in (("DRM_GEM_SHMEM_HELPER", "GEM shmem helpers"), ("DRM_SCHED", "GPU scheduler")):
    t, n = re.subn(rf"(config {sym}\n\ttristate)\n", rf'\1 "{prompt}"\n', t)
    if n != 1:
        sys.exit(f"debug-kernel: cannot give {sym} a prompt in {p}")
open(p, "w").write(t)
PY
	echo "$want_src" > "$out/src.tmp/.tacc-version"
	mv "$out/src.tmp" "$out/src"
fi

# ---- config: defconfig + fragment; every =y/=n line of the fragment must hold
frag=scripts/debug-kernel/config.fragment
# Its own ccache (debug info makes the objects big): QEMU's entries in the shared one stay.
export CCACHE_DIR=${TACC_DEBUG_CCACHE_DIR:-$HOME/.cache/ccache-tacc-debug-kernel}
export CCACHE_MAXSIZE=${TACC_DEBUG_CCACHE_SIZE:-10G}
kmake() { nice -n "${NICE:-19}" make -C "$out/src" O="$out/obj" CC="ccache gcc" HOSTCC="ccache gcc" "$@"; }
mkdir -p "$out/obj"
want_cfg=$(cat "$frag" <(echo "$want_src") | sha256sum | cut -c1-16)
if [ "$(cat "$out/obj/.tacc-config" 2>/dev/null)" != "$want_cfg" ] || [ ! -f "$out/obj/.config" ]; then
	log "configuring (x86_64_defconfig + $frag)"
	kmake -s x86_64_defconfig >"$out/config.log" 2>&1
	"$out/src/scripts/kconfig/merge_config.sh" -m -O "$out/obj" "$out/obj/.config" "$frag" >>"$out/config.log" 2>&1
	kmake -s olddefconfig >>"$out/config.log" 2>&1
	bad=()
	while IFS= read -r l; do
		case $l in
		CONFIG_*=*) grep -qxF "$l" "$out/obj/.config" || bad+=("$l") ;;
		"# CONFIG_"*" is not set") s=${l#\# }; s=${s%% *}
			grep -q "^$s=" "$out/obj/.config" && bad+=("$s=n") ;;
		esac
	done < "$frag"
	[ ${#bad[@]} = 0 ] || die "config fragment did not hold (dependencies?): ${bad[*]}"
	echo "$want_cfg" > "$out/obj/.tacc-config"
fi

# ---- build (make is incremental; ccache makes a rebuilt tree quick)
start=$(date +%s)
log "building (make -j${JOBS:-2}, nice ${NICE:-19}; log: $out/build.log)"
kmake -j"${JOBS:-2}" bzImage modules >"$out/build.log" 2>&1 ||
	{ tail -30 "$out/build.log" >&2; die "kernel build failed (log: $out/build.log)"; }
kmake -s modules_prepare >>"$out/build.log" 2>&1
rel=$(kmake -s kernelrelease)
echo "$rel" > "$out/release"
log "kernel $rel built in $(( $(date +%s) - start )) s"

# ---- tacc.ko against it, built in a copy so kernel/'s objects (for Debian's kernel) stay
rm -rf "$out/tacc"
mkdir -p "$out/tacc" "build/modules/$rel"
(cd kernel && find . \( -name '*.[ch]' ! -name '*.mod.c' -o -name Makefile \) -print0 |
	cpio -0pdm --quiet "$out/tacc")
make -s -C "$out/tacc" KDIR="$out/obj" >"$out/tacc-build.log" 2>&1 ||
	{ tail -30 "$out/tacc-build.log" >&2; die "tacc.ko build failed (log: $out/tacc-build.log)"; }
for ko in tacc.ko tacc_vfio_pci.ko; do
	[ -f "$out/tacc/$ko" ] || continue
	cmp -s "$out/tacc/$ko" "build/modules/$rel/$ko" || cp "$out/tacc/$ko" "build/modules/$rel/$ko"
done

# ---- initramfs: everything is built in, so no modules
initrd=build/initramfs-$rel.cpio.gz
if [ ! -f "$initrd" ] || [ scripts/mkinitramfs.sh -nt "$initrd" ]; then
	TACC_INITRAMFS_NO_MODULES=1 scripts/mkinitramfs.sh "$rel" "$initrd"
fi
log "ready: $out/obj/arch/x86/boot/bzImage ($rel), $(du -sh "$out/" | cut -f1) under $out"
