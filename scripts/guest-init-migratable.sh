#!/bin/sh
# PID 1 of the migratable test VM (scripts/run-vm MIGRATE=1; built into its initramfs by
# scripts/mkinitramfs-migratable.sh).  The root is the initramfs itself (no 9p root: QEMU
# refuses to migrate while a 9p export is mounted).  Kernel command line: taccvm.cmd=NAME
# (a file on the out share: read, then the share is unmounted), taccvm.out=DIR (where the
# out share mounts: after the move, by tacc-vm-migrate, and at the end),
# taccvm.pydisks=SERIAL:PATH,... (read-only ext4 images of the Python trees),
# taccvm.modparams=p=v,... (tacc.ko), taccvm.vfs=N (VFs enabled after tacc.ko loads).  The command's status leaves by isa-debug-exit.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
root=$(cat /etc/tacc-root)
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
hostname tacc-vm
ip link set lo up 2>/dev/null

cmd= out= modparams= pydisks= vfs=0
for w in $(cat /proc/cmdline); do
	case $w in
	taccvm.cmd=*) cmd=${w#taccvm.cmd=} ;;
	taccvm.out=*) out=${w#taccvm.out=} ;;
	taccvm.pydisks=*) pydisks=${w#taccvm.pydisks=} ;;
	taccvm.vfs=*) vfs=${w#taccvm.vfs=} ;;
	taccvm.modparams=*) modparams=$(echo "${w#taccvm.modparams=}" | tr , ' ') ;;
	esac
done

finish() {
	st=$1
	grep -q " $out " /proc/mounts || mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "$out"
	grep -q " $out " /proc/mounts && dmesg > "$out/dmesg.txt"
	sync
	[ "$st" -gt 254 ] && st=254
	echo "TACC-EXIT: $st"
	printf "\\$(printf %03o $((st + 1)))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	echo o > /proc/sysrq-trigger
	sleep 5
}

for m in /lib/tacc/[0-9]*.ko; do
	insmod "$m" || echo "guest-init: insmod $m failed"
done
for w in $(echo "$pydisks" | tr , ' '); do
	serial=${w%%:*} path=${w#*:} dev=
	for s in /sys/block/vd*/serial; do
		[ "$(cat "$s" 2>/dev/null)" = "$serial" ] && dev=${s#/sys/block/} && dev=/dev/${dev%/serial}
	done
	mkdir -p "$path"
	[ -n "$dev" ] && mount -t ext4 -o ro "$dev" "$path" ||
		echo "guest-init: the disk $serial (${dev:-not found}) did not mount at $path"
done
# shellcheck disable=SC2086
insmod /lib/tacc/tacc.ko $modparams || echo "guest-init: insmod tacc.ko failed"
. /lib/tacc/guest-enable-vfs.sh
enable_vfs "$vfs"
for n in /dev/accel/accel*; do [ -c "$n" ] && chgrp tacc "$n" && chmod 0660 "$n"; done

# the command, from the out share; then the share is unmounted (the fid of its root is
# clunked, which lifts QEMU's migration blocker) until the guest has moved
mkdir -p "$out"
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "$out"; then
	echo "guest-init: cannot mount the out share"
	finish 120
fi
cp "$out/$cmd" /run/cmd.sh 2>/dev/null || { echo "guest-init: no $out/$cmd"; finish 120; }
umount "$out" || { echo "guest-init: cannot unmount the out share"; finish 120; }

export HOME=/root TERM=linux TACC_ROOT=$root TACC_IN_VM=1 TACC_VM_MIGRATABLE=1
export PATH=$root/.venv/bin:$PATH TACC_VM_OUT=$out
cd "$root" || finish 120
echo "guest-init: ready after $(cut -d' ' -f1 /proc/uptime) s of guest time; running the command"
sh /run/cmd.sh < /dev/null
finish $?
