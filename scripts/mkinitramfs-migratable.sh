#!/bin/bash
# The migratable test VM's initramfs (scripts/run-vm MIGRATE=1, docs/hardware.md section 15
# "A migrating test VM"): the whole root in the initramfs (a tmpfs in the guest), no 9p root.
# QEMU's 9p device blocks migration while an export is mounted in the guest, so this root
# holds what a tacc workload needs: busybox, the host's python3 and every library `ldd`
# names for it and for the extension modules of its standard library and of the venv,
# (not Debian's dist-packages: bcc, whose BPF compile this VM does not offer),
# tacc.ko and the modules it and the disks need (decompressed: busybox insmod cannot read
# .ko.xz).  The Python trees come from the PYDISK ext4 images, mounted read-only at their
# paths; the command is read from the out share, which is then unmounted until the move.
# Usage: scripts/mkinitramfs-migratable.sh KVER OUT.cpio.gz   (~3 s)
set -euo pipefail
trap 'echo "mkinitramfs-migratable: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
kver=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mods=/lib/modules/$kver
ko=$root/build/modules/$kver/tacc.ko
py=$(readlink -f /usr/bin/python3)
bb=$(command -v busybox || true)
[ -n "$bb" ] || { echo "mkinitramfs-migratable: busybox missing" >&2; exit 1; }
[ -d "$mods" ] || { echo "mkinitramfs-migratable: $mods missing (kernel $kver not installed)" >&2; exit 1; }
[ -f "$ko" ] || { echo "mkinitramfs-migratable: $ko missing (make setup builds it)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,run,tmp,root,mnt/out,etc,lib/tacc}
chmod 1777 "$work/tmp"
cp "$bb" "$work/bin/busybox"
for a in $("$bb" --list); do
	[ "$a" = busybox ] || ln -s busybox "$work/bin/$a"
done
# the interpreter at its own path (the venv's python3 links to /usr/bin/python3)
mkdir -p "$work$(dirname "$py")"
cp "$py" "$work$py"
ln -sf "$py" "$work/usr/bin/python3"
# its libraries and those of the extension modules it may import (the trees themselves
# come from the PYDISK images)
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
# libudev: pyudev (the runtime's device discovery) loads it by ctypes, found by ldconfig -p
udev=$(ldconfig -p | awk '$1 == "libudev.so.1" && /x86-64/ { print $NF; exit }')
{
	echo "$py"
	echo "$udev"
	# a file another process writes meanwhile (a .pyc's temporary) may vanish under find:
	# not an error for a list of libraries
	find "$stdlib/lib-dynload" "$root/.venv/lib" -name '*.so*' -type f 2>/dev/null || true
} | { xargs -r ldd 2>/dev/null || true; printf '%s => %s\n' "$udev" "$udev"; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' |
	sort -u > "$work/.libs"
while read -r lib; do
	case $lib in "$root"/*|/usr/lib/python3*) continue ;; esac  # in a PYDISK tree
	for p in "$lib" "$(readlink -f "$lib")"; do
		mkdir -p "$work$(dirname "$p")"
		[ -e "$work$p" ] || cp -a "$p" "$work$p"
	done
done < "$work/.libs"
rm "$work/.libs"
# /lib64 and /lib are links on a merged-/usr host: the same links here
for l in /lib /lib64 /sbin /bin; do
	[ -L "$l" ] || continue
	t=$(readlink "$l")
	if [ -d "$work$l" ] && [ ! -L "$work$l" ]; then
		mkdir -p "$work/usr/${l#/}"
		cp -a "$work$l/." "$work/usr/${l#/}/"
		rm -rf "${work:?}$l"
	fi
	ln -s "$t" "$work$l"
done
# modules, dependencies first (busybox insmod): the disks, 9p for the out share, DRM
n=0
for m in virtio_blk crc16 mbcache jbd2 ext4 9pnet_virtio 9p drm drm_kms_helper drm_shmem_helper gpu-sched; do
	for dep in $(modprobe -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" { print $2 }'); do
		base=$(basename "$dep"); base=${base%.xz}; base=${base%.zst}
		ls "$work/lib/tacc/"*-"$base" > /dev/null 2>&1 && continue
		n=$((n + 1))
		dst=$work/lib/tacc/$(printf '%02d' $n)-$base
		case $dep in
		*.xz) xz -dc "$dep" > "$dst" ;;
		*.zst) zstd -qdc "$dep" > "$dst" ;;
		*) cp "$dep" "$dst" ;;
		esac
	done
done
cp "$ko" "$work/lib/tacc/tacc.ko"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$work/etc/passwd"
printf 'root:x:0:\ntacc:x:1000:\n' > "$work/etc/group"
cp /etc/ld.so.cache "$work/etc/" 2>/dev/null || true
cp "$(readlink -f /sbin/ldconfig)" "$work/usr/sbin/ldconfig"  # static: ctypes.util.find_library
# the trees' mount points
"$py" - "$root" "$stdlib" > "$work/.dirs" <<'EOF'
import sys
print("\n".join([sys.argv[1] + "/.venv", sys.argv[1] + "/userspace", sys.argv[2],
                 "/usr/lib/python3/dist-packages"]))
EOF
while read -r d; do mkdir -p "$work$d"; done < "$work/.dirs"
rm "$work/.dirs"
cp "$root/scripts/guest-init-migratable.sh" "$work/init"
cp "$root/scripts/guest-enable-vfs.sh" "$work/lib/tacc/guest-enable-vfs.sh"
# on PATH, and at its checkout path (the guest's commands run in the checkout)
mkdir -p "$work$root/scripts"
cp "$root/scripts/tacc-vm-migrate" "$work/usr/bin/tacc-vm-migrate"
cp "$root/scripts/tacc-vm-migrate" "$work$root/scripts/tacc-vm-migrate"
chmod +x "$work/init" "$work/usr/bin/tacc-vm-migrate" "$work$root/scripts/tacc-vm-migrate"
printf '%s\n' "$root" > "$work/etc/tacc-root"
mkdir -p "$(dirname "$out")"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
