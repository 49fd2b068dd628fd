#!/bin/bash
# One idempotent set-up path for a brand-new Debian 12 x86_64 machine (as root):
# apt sources and packages, the pinned Debian 6.12 guest kernel + headers, QEMU
# with the tacc device, tacc.ko, the initramfs and the project venv.
# Run by `make setup`, `make run-vm` and `make test`. Warm, it takes ~1-2 s.
#
# Environment: KERNEL=6.12.N[+deb12-amd64] (default: scripts/kernel.pin, with a
# fallback to the newest 6.12 the archive has; KERNEL=debug sets up the default here),
# SETUP_QUIET=1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build
log() { [ "${SETUP_QUIET:-0}" = 1 ] || echo "setup: $*"; }
die() { echo "setup: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt, /boot); try: sudo make ..."
# One set-up at a time (several `make` may start together); later ones find it done.
exec 9>build/.setup.lock
flock 9
grep -q 'bookworm' /etc/os-release 2>/dev/null || log "warning: not Debian 12 (bookworm); untested"
export DEBIAN_FRONTEND=noninteractive

# ---- apt sources: bookworm-backports (meson >= 1.5, QEMU 10 source) + deb-src
src=/etc/apt/sources.list.d/tacc-backports.sources
want_src='Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg'
apt_updated=0
apt_update() {
	[ $apt_updated = 1 ] && return
	log "apt-get update"
	apt-get update -q >build/apt-update.log 2>&1 || { cat build/apt-update.log >&2; die "apt-get update failed"; }
	apt_updated=1
}
if [ "$(cat "$src" 2>/dev/null)" != "$want_src" ]; then
	printf '%s\n' "$want_src" > "$src"
	apt_update
fi
[ -n "$(ls /var/lib/apt/lists/*bookworm-backports*Packages* 2>/dev/null)" ] || apt_update

# ---- packages
pkgs=(
	build-essential pkg-config ninja-build flex bison git ccache
	libglib2.0-dev libpixman-1-dev libslirp-dev libattr1-dev libcap-ng-dev
	python3-venv python3-pip python3-dev xz-utils zstd bzip2 dpkg-dev cpio kmod busybox-static
	e2fsprogs  # mke2fs -d: the guest Python disks, scripts/run-vm PYDISK
	seabios qemu-system-data
	bpfcc-tools python3-bpfcc bpftrace libelf-dev
	iproute2 procps util-linux passwd chromium pciutils make
	podman crun bpftool  # containers: tests/vm/test_containers.py, docs/containers.md
	tshark
	libopenblas-dev  # the device GEMM (qemu/hw/tacc/tacc-ops.c): cblas_sgemm
)
# linux-perf: the 6.12 build (close to the guest kernel's), not bookworm's 6.1
bpo_pkgs=(meson python3-pycotap linux-perf)
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'; }
missing=()
for p in "${pkgs[@]}" "${bpo_pkgs[@]}"; do
	installed "$p" || missing+=("$p")
done
if installed meson && dpkg --compare-versions "$(dpkg-query -W -f='${Version}' meson)" lt 1.5; then
	missing+=(meson)
fi
if installed linux-perf && dpkg --compare-versions "$(dpkg-query -W -f='${Version}' linux-perf)" lt 6.12; then
	missing+=(linux-perf)
fi
if [ ${#missing[@]} -gt 0 ]; then
	apt_update
	log "installing ${missing[*]}"
	# tshark (TLP capture dissector tests): no setuid dumpcap, and no debconf prompt
	echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
	export DEBIAN_FRONTEND=noninteractive
	args=()
	for p in "${missing[@]}"; do
		case " ${bpo_pkgs[*]} " in *" $p "*) args+=("$p/bookworm-backports") ;; *) args+=("$p") ;; esac
	done
	apt-get install -y -q --no-install-recommends "${args[@]}" >build/apt-install.log 2>&1 ||
		{ tail -20 build/apt-install.log >&2; die "apt-get install failed (log: build/apt-install.log)"; }
fi

# ---- guest kernel: pinned, else the newest 6.12 with image and headers
kernel_available() {
	for p in "linux-image-$1" "linux-headers-$1"; do
		installed "$p" && continue
		apt-cache show "$p" >/dev/null 2>&1 || return 1
	done
}
pin=$(head -1 scripts/kernel.pin)
want=${KERNEL:-}
[ "$want" = debug ] && want=   # built by scripts/debug-kernel.sh (make test-debug), not here
if [ -n "$want" ] && [ "$want" != default ]; then
	[[ $want =~ ^6\.12\.[0-9]+(\+deb12-amd64)?$ ]] ||
		die "KERNEL=$want: not a Debian 6.12 kernel; accepted: 6.12.N or 6.12.N+deb12-amd64"
	want=${want%+deb12-amd64}+deb12-amd64
	kernel_available "$want" || { apt_update; kernel_available "$want"; } ||
		die "KERNEL=$KERNEL: linux-image/headers-$want not in the archive; accepted: $(apt-cache search --names-only '^linux-headers-6\.12\.[0-9]+\+deb12-amd64$' | awk '{print $1}' | sed 's/linux-headers-//' | sort -V | tr '\n' ' ')"
	kver=$want
else
	kver=$pin
	if ! kernel_available "$kver"; then
		apt_update
		if ! kernel_available "$kver"; then
			kver=$(apt-cache search --names-only '^linux-headers-6\.12\.[0-9]+\+deb12-amd64$' |
				awk '{print $1}' | sed 's/^linux-headers-//' | sort -V |
				while read -r v; do kernel_available "$v" && echo "$v"; done | tail -1)
			[ -n "$kver" ] || die "no Debian 6.12 kernel with headers in the archive"
			echo "setup: warning: pinned kernel $pin left the archive; using $kver" >&2
		fi
	fi
	echo "$kver" > build/kernel-version.tmp && mv build/kernel-version.tmp build/kernel-version
fi
if ! installed "linux-image-$kver" || ! installed "linux-headers-$kver"; then
	apt_update
	log "installing kernel $kver"
	apt-get install -y -q --no-install-recommends "linux-image-$kver" "linux-headers-$kver" \
		>build/apt-kernel.log 2>&1 || { tail -20 build/apt-kernel.log >&2; die "kernel $kver install failed"; }
fi

# ---- venv (Debian's bcc imports through --system-site-packages), in the background
# while QEMU builds: the step below waits for it
venv_step() {
	local stamp=.venv/.tacc-stamp want_stamp
	want_stamp=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
	if [ ! -x .venv/bin/python ] || [ "$(cat $stamp 2>/dev/null)" != "$want_stamp" ]; then
		log "venv"
		[ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
		.venv/bin/pip install -q --disable-pip-version-check -e '.[test]' >build/pip.log 2>&1 ||
			{ tail -20 build/pip.log >&2; return 1; }
		echo "$want_stamp" > $stamp
	fi
}
venv_step &
venv_pid=$!

# ---- QEMU with the tacc device (rebuilds only when our device sources change)
scripts/build-qemu.sh || { wait "$venv_pid"; exit 1; }

# ---- tacc.ko for the guest kernel
if [ -f kernel/Makefile ]; then
	make -s -C kernel KVER="$kver" >build/kernel-build.log 2>&1 ||
		{ tail -30 build/kernel-build.log >&2; die "tacc.ko build failed (log: build/kernel-build.log)"; }
	mkdir -p "build/modules/$kver"
	for ko in tacc.ko tacc_vfio_pci.ko; do	# the second where the kernel has vfio-pci-core
		[ -f "kernel/$ko" ] || continue
		cmp -s "kernel/$ko" "build/modules/$kver/$ko" || cp "kernel/$ko" "build/modules/$kver/$ko"
	done
fi

# ---- initramfs (0.3 s; rebuilt when missing or older than its script)
initrd=build/initramfs-$kver.cpio.gz
if [ ! -f "$initrd" ] || [ scripts/mkinitramfs.sh -nt "$initrd" ]; then
	log "initramfs for $kver"
	scripts/mkinitramfs.sh "$kver" "$initrd"
fi

# ---- venv: started before the QEMU build and waited for here (pip mostly waits on the
# network; the build keeps the two cores busy)
wait "$venv_pid" || die "pip install failed (log: build/pip.log)"

# ---- the device contract as Python (tacc.hw._contract), generated from the C headers
# (the package build does the same in setup.py); rewritten only when it changes
.venv/bin/python userspace/tacc/hw/gen.py userspace/tacc/hw/_contract.py \
	kernel/include/tacc_hw.h kernel/include/uapi/drm/tacc_accel.h kernel/include/tacc_virtio.h ||
	die "cannot generate userspace/tacc/hw/_contract.py"

# ---- shell completions and man pages of tacc, accel-bpftrace and taccd, generated from
# their parsers (tacc.cli.conventions) when the CLI changed, installed under /usr/local
cli_docs=build/cli-docs
if [ ! -f $cli_docs/stamp ] ||
	[ -n "$(find userspace/tacc/cli userspace/tacc/daemon/main.py -newer $cli_docs/stamp -name '*.py' | head -1)" ]; then
	log "shell completions and man pages ($cli_docs)"
	rm -rf $cli_docs
	.venv/bin/python -m tacc.cli.conventions $cli_docs >/dev/null ||
		die "cannot generate the completions and man pages"
	install -D -m644 -t /usr/local/share/bash-completion/completions $cli_docs/bash-completion/*
	install -D -m644 -t /usr/local/share/zsh/site-functions $cli_docs/zsh/*
	install -D -m644 -t /usr/local/share/man/man1 $cli_docs/man1/*
	touch $cli_docs/stamp
fi

# ---- the runtime API ring's producer in C (tacc.runtime._apiring): without it
# apitrace.py uses its Python producer (same records, ~5x the traced thread's CPU)
src=userspace/tacc/runtime/_apiring.c
ext=userspace/tacc/runtime/_apiring$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -e "$ext" ] || [ "$src" -nt "$ext" ]; then
	log "runtime C producer ($ext)"
	# shellcheck disable=SC2046 # python3-config prints several -I flags
	gcc -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers \
		-shared -fPIC $(python3-config --includes) -o "$ext.tmp" "$src" ||
		die "cannot build $src"
	mv "$ext.tmp" "$ext"
fi
log "ready: kernel $kver, $(build/qemu/qemu-system-x86_64 --version | head -1)"
