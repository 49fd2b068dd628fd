#!/bin/bash
# Stage-2 init of the test VM (PID 1 after the initramfs switch_root).
# The root is the host's / (read-only 9p) under a tmpfs overlay, so this
# checkout, its venv, the kernel headers and bcc are at the host's paths.
# Kernel command line: taccvm.cmd=FILE (run it, then power off with its status),
# taccvm.out=DIR (host directory shared read-write: dmesg, results), taccvm.vfs=N.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
root=$(cd "$(dirname "$0")/.." && pwd)

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
hostname tacc-vm
# The trees every Python start reads, from the disk images run-vm attached (PYDISK:
# taccvm.pydisks=SERIAL:PATH,...): over 9p a start listed site-packages (~320 entries) four
# times and opened every module by a round trip to QEMU (python -c pass: 0.7-1.3 s of guest
# time; 0.10 s from the disks).  Read-only ext4 under a tmpfs overlay at the tree's own
# path: what the guest writes there stays in the guest, as on the 9p root.
py_disks() {
	local w s serial path dev m pydisks=
	for w in $(cat /proc/cmdline); do
		case $w in taccvm.pydisks=*) pydisks=${w#taccvm.pydisks=} ;; esac
	done
	[ -n "$pydisks" ] || return 0
	modprobe -q virtio_blk 2>/dev/null || { echo "guest-init: no virtio_blk: Python over 9p"; return 0; }
	for w in $(echo "$pydisks" | tr , ' '); do
		serial=${w%%:*} path=${w#*:} dev=
		for s in /sys/block/vd*/serial; do
			[ "$(cat "$s" 2>/dev/null)" = "$serial" ] && dev=${s#/sys/block/} && dev=/dev/${dev%/serial}
		done
		m=/run/tacc-pydisk/$serial
		mkdir -p $m/lower $m/up $m/work
		if [ -n "$dev" ] && [ -d "$path" ] && mount -t ext4 -o ro "$dev" $m/lower &&
			mount -t overlay -o "lowerdir=$m/lower,upperdir=$m/up,workdir=$m/work" "$serial" "$path"; then
			continue
		fi
		echo "guest-init: the disk $serial (${dev:-not found}) did not mount over $path: 9p"
		umount $m/lower 2>/dev/null
	done
}
py_disks
# run-vm NVME=1 (taccvm.nvme=SERIAL): the NVMe scratch disk as TACC_NVME_DEV, its
# namespace's node found by the controller's serial (no udev: devtmpfs makes the node).
nvme_disk() {
	local w serial= c i
	for w in $(cat /proc/cmdline); do
		case $w in taccvm.nvme=*) serial=${w#taccvm.nvme=} ;; esac
	done
	[ -n "$serial" ] || return 0
	modprobe -q nvme 2>/dev/null || { echo "guest-init: no nvme module"; return 0; }
	for i in $(seq 100); do
		for c in /sys/class/nvme/nvme*; do
			[ "$(tr -d ' ' < "$c/serial" 2>/dev/null)" = "$serial" ] || continue
			# the namespace (a multipath head's name is the subsystem's, not the
			# controller's): the VM has this one NVMe controller
			for w in /dev/nvme*n1; do
				[ -b "$w" ] && export TACC_NVME_DEV=$w && return 0
			done
		done
		sleep 0.05
	done
	echo "guest-init: the NVMe disk $serial did not appear"
}
nvme_disk
# A host's sandbox may add a .pth that imports certifi at every Python start (an egress proxy's
# CA; the guest has no network beyond the cluster's loopback): ~40 ms of host CPU, several
# times that under TCG, per process.  Hidden in the guest's overlay only.
for f in /usr/lib/python3/dist-packages/_sandboxing_egress_ca.pth \
	/usr/local/lib/python3*/dist-packages/_sandboxing_egress_ca.pth; do
	[ -e "$f" ] && rm -f "$f"
done
ip link set lo up 2>/dev/null

cmd= out= vfs=0 modparams= iommu= tty= term= node= nodes=
for w in $(cat /proc/cmdline); do
	case $w in
	taccvm.cmd=*) cmd=${w#taccvm.cmd=} ;;
	taccvm.out=*) out=${w#taccvm.out=} ;;
	taccvm.vfs=*) vfs=${w#taccvm.vfs=} ;;
	taccvm.iommu=*) iommu=${w#taccvm.iommu=} ;;
	taccvm.tty=*) tty=${w#taccvm.tty=} ;;
	taccvm.term=*) term=${w#taccvm.term=} ;;
	taccvm.node=*) node=${w#taccvm.node=} ;;
	taccvm.nodes=*) nodes=${w#taccvm.nodes=} ;;
	taccvm.modparams=*) modparams=$(echo "${w#taccvm.modparams=}" | tr , ' ') ;;
	esac
done
kmsg_pid=
if [ -n "$out" ]; then
	mkdir -p "$out"
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "$out" ||
		echo "guest-init: cannot mount the output share at $out"
	# The kernel log as it is written, from boot on (scripts/test-vm's verdict reads it):
	# a test that clears the ring (dmesg -C) cannot hide a warning from it.
	cat /dev/kmsg > "$out/kmsg.txt" 2>/dev/null &
	kmsg_pid=$!
fi

# A cluster node (scripts/run-vm NODES=N, docs/cluster.md): hostname tacc-node<i>, capture
# node id node<i>, the virtio-net NIC at 169.254.0.<i+1>/16 (link-local: no default route,
# no gateway; the host side is a hub on 127.0.0.1).
cluster_net() {
	local ifc
	hostname "tacc-node$node"
	modprobe virtio_net 2>/dev/null
	ifc=$(ls /sys/class/net | grep -v '^lo$' | head -1)
	if [ -z "$ifc" ]; then
		echo "guest-init: node $node: no network interface (virtio_net)"
		return
	fi
	ip addr add "169.254.0.$((node + 1))/16" dev "$ifc" &&
		ip link set "$ifc" up || echo "guest-init: node $node: cannot configure $ifc"
	local i peers=
	for i in $(seq 0 $((nodes - 1))); do
		[ "$i" = "$node" ] || peers=$peers${peers:+,}169.254.0.$((i + 1))
	done
	export TACC_NODE=$node TACC_NODES=$nodes TACC_NODE_ID=node$node TACC_NET_IF=$ifc \
		TACC_NODE_ADDR=169.254.0.$((node + 1)) TACC_PEERS=$peers
}
[ -n "$node" ] && cluster_net

finish() {
	local st=$1
	[ -n "$kmsg_pid" ] && { sleep 0.2; kill $kmsg_pid 2>/dev/null; }
	[ -n "$out" ] && dmesg > "$out/dmesg.txt" 2>/dev/null
	sync
	# isa-debug-exit: QEMU exits with (v << 1) | 1; v = status + 1 so that
	# QEMU's own exit status 1 can never read as success.
	[ "$st" -gt 254 ] && st=254
	echo "TACC-EXIT: $st"
	printf "\\x$(printf %02x $((st + 1)))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	echo o > /proc/sysrq-trigger
	sleep 5
}

# Users and permissions: /dev/accel/* belong to group tacc (0660). No udevd
# runs here and Debian's kernel has no uevent helper, so a tiny watcher fixes
# nodes that appear later (VFs, module reloads) within a second.
# Written straight into the overlay's /etc (the host's stays as it is): useradd and groupadd
# took 1.0-2.2 s and 0.35 s of guest time in the test VM (login.defs, subordinate ids, lock
# files, each file rewritten over 9p), seconds of host wall in every boot.  The ids are the
# first free ones from 1000 up, as useradd's would be; each user gets its own group too.
free_id() {  # the first id >= 1000 that no line of the files given uses
	awk -F: '{ used[$3] = 1 } END { for (i = 1000; i in used; i++); print i }' "$@"
}
if ! grep -q '^tacc:' /etc/group; then
	echo "tacc:x:$(free_id /etc/group):" >> /etc/group
fi
# tacc-user2 is a second tenant of the same group (per-user limits: another uid still gets
# service, tests/vm/test_isolation_matrix.py).
for u in tacc-user tacc-user2; do
	grep -q "^$u:" /etc/passwd && continue
	uid=$(free_id /etc/passwd /etc/group)
	echo "$u:x:$uid:$uid::/tmp:/bin/bash" >> /etc/passwd
	echo "$u:!:$(($(date +%s) / 86400)):0:99999:7:::" >> /etc/shadow
	echo "$u:x:$uid:" >> /etc/group
	sed -i "s/^\(tacc:x:[0-9]*:\)\(.*\)\$/\1\2,$u/; s/^\(tacc:x:[0-9]*:\),/\1/" /etc/group
done
# tacc-user runs this checkout's venv tools: a checkout made in a 0700 directory
# (git clone into "$(mktemp -d)", as CI does) must be traversable by others. / is an
# overlay on a read-only share: this changes the guest's view only, never the host's.
chmod o+x "$root"
fix_accel_nodes() {
	local n
	for n in /dev/accel/accel*; do
		[ -c "$n" ] && [ -G "$n" ] && chgrp tacc "$n" && chmod 0660 "$n"
	done
}
( while sleep 1; do fix_accel_nodes; done ) </dev/null >/dev/null 2>&1 &

# The debug kernel (scripts/debug-kernel.sh) is not installed on the host: bcc finds its
# headers through /lib/modules/<release>/{build,source}, linked in the guest's overlay only.
rel=$(uname -r)
if [ ! -e "/lib/modules/$rel" ] && [ "$(cat "$root/build/kernel-debug/release" 2>/dev/null)" = "$rel" ]; then
	mkdir -p "/lib/modules/$rel"
	ln -s "$root/build/kernel-debug/obj" "/lib/modules/$rel/build"
	ln -s "$root/build/kernel-debug/src" "/lib/modules/$rel/source"
fi

# The driver: dependencies through kmod (it reads .ko.xz), tacc.ko from the checkout.
modprobe -a drm_shmem_helper gpu-sched drm_kms_helper 2>/dev/null
ko=$root/build/modules/$(uname -r)/tacc.ko
if [ -f "$ko" ]; then
	insmod "$ko" $modparams || echo "guest-init: insmod $ko failed"
else
	echo "guest-init: $ko missing (make setup builds it)"
fi
fix_accel_nodes
. "$root/scripts/guest-enable-vfs.sh"
enable_vfs "$vfs"

export HOME=/root TERM=${TERM:-linux} TACC_ROOT=$root TACC_IN_VM=1
# numpy's OpenBLAS on one thread: under TCG the vCPUs take turns on one host thread
# (-icount), so OpenBLAS's workers spinning for their next task take the emulated CPU
# from the thread that waits for them (SMP=2: `tacc run mlp` 2.3-3.3 s of guest time
# with them, 1.75 s without; docs/measurements.md)
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export PATH=$root/.venv/bin:$PATH
[ -n "$out" ] && export TACC_VM_OUT=$out
cd "$root"

if [ -n "$cmd" ]; then
	echo "guest-init: ready after $(cut -d' ' -f1 /proc/uptime) s of guest time; running the command"
	bash "$cmd" < /dev/null
	finish $?
else
	# The host terminal's size and type (scripts/run-vm passes them), and the VM's own rc
	# file: the host's dotfiles over 9p would reset PATH (the venv) and add host tools.
	case $tty in *x*) stty rows "${tty%x*}" cols "${tty#*x}" < /dev/ttyS0 ;; esac
	[ -n "$term" ] && export TERM=$term
	export TACC_VM_IOMMU=$iommu TACC_VM_VFS=${vfs#0}
	echo "tacc VM: $(uname -r), IOMMU $iommu; exit the shell (or Ctrl-A x) to power off."
	setsid -c bash --rcfile "$root/scripts/guest-bashrc" -i < /dev/ttyS0 > /dev/ttyS0 2>&1
	finish $?
fi
