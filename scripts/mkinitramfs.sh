#!/bin/bash
# Build the test VM's tiny initramfs: busybox + the modules needed to mount the
# host's / over virtio-9p with a tmpfs overlay, then switch_root into the host's
# userland and run scripts/guest-init.sh from the checkout.
# Usage: scripts/mkinitramfs.sh KVER OUT.cpio.gz     (~0.3 s)
# TACC_INITRAMFS_NO_MODULES=1: for a kernel with 9p and overlayfs built in (the debug kernel).
set -euo pipefail
kver=$1 out=$2
mods=/lib/modules/$kver
modlist="kernel/fs/netfs/netfs.ko kernel/net/9p/9pnet.ko kernel/net/9p/9pnet_virtio.ko
	 kernel/fs/9p/9p.ko kernel/fs/overlayfs/overlay.ko"
[ "${TACC_INITRAMFS_NO_MODULES:-0}" = 1 ] && modlist=
[ -z "$modlist" ] || [ -d "$mods" ] || { echo "mkinitramfs: $mods missing (kernel $kver not installed)" >&2; exit 1; }
bb=$(command -v busybox || true)
[ -n "$bb" ] || { echo "mkinitramfs: busybox missing (apt-get install busybox-static)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,dev,proc,sys,newroot,lower,upper,lib/modules}
cp "$bb" "$work/bin/busybox"
for a in sh mount umount mkdir insmod switch_root cat echo sleep mknod dd printf poweroff; do
	ln -s busybox "$work/bin/$a"
done
# busybox insmod cannot read .ko.xz: decompress the few modules we need, in load order.
n=0
for m in $modlist; do
	src=$mods/$m
	n=$((n + 1))
	dst=$work/lib/modules/$(printf '%02d' $n)-$(basename "$m")
	if [ -f "$src.xz" ]; then xz -dc "$src.xz" > "$dst"
	elif [ -f "$src.zst" ]; then zstd -qdc "$src.zst" > "$dst"
	elif [ -f "$src" ]; then cp "$src" "$dst"
	else echo "mkinitramfs: $src(.xz) missing" >&2; exit 1; fi
done
cat > "$work/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
for m in /lib/modules/*.ko; do [ -f "$m" ] || continue; insmod "$m" || echo "initramfs: insmod $m failed"; done
cmdline=$(cat /proc/cmdline)
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro root /lower; then
	echo "initramfs: cannot mount the host root over 9p"
	echo TACC-EXIT: 120
	printf '\171' | dd of=/dev/port bs=1 seek=244 2>/dev/null
	poweroff -f
fi
mount -t tmpfs -o size=75% tmpfs /upper
mkdir -p /upper/up /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/up,workdir=/upper/work overlay /newroot
mkdir -p /newroot/run/tacc-initramfs
init=/bin/sh
for w in $cmdline; do case $w in taccvm.init=*) init=${w#taccvm.init=};; esac; done
umount /proc /sys 2>/dev/null
exec switch_root /newroot "$init"
INIT
chmod +x "$work/init"
mkdir -p "$(dirname "$out")"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
