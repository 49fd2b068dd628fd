# shellcheck shell=sh
# Sourced by the guest inits (scripts/guest-init.sh, and scripts/guest-init-migratable.sh
# from its initramfs): enable_vfs N enables N VFs on the first tacc PF (taccvm.vfs=N).
enable_vfs() {
	[ "$1" -gt 0 ] 2>/dev/null || return 0
	pf=$(grep -l 0x7acc /sys/bus/pci/devices/*/vendor 2>/dev/null | head -1)
	if [ -n "$pf" ]; then
		echo "$1" > "$(dirname "$pf")/sriov_numvfs" || echo "guest-init: enabling $1 VFs failed"
	else
		echo "guest-init: no tacc PF found for VFS=$1"
	fi
}
