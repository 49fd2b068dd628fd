#!/bin/bash
# make bench: every benchmark, JSON under build/bench/ plus a readable table each.
#   host/device benchmarks: tools/bench/bench_*.py (run on the host)
#   in-guest benchmarks:    tools/bench/vm_*.py (one VM boot runs them all; vm_virt.py
#                           has its own, with VFS=2 VIRTIO=1, and vm_decode.py its own,
#                           with 1 GiB of device memory and 4 GiB of guest memory)
# BENCH='link timeline' limits the set; BENCH_EVENTS=N sizes the synthetic captures;
# BENCH_LINK_CONFIGS='link-gen=3,link-width=4 ...' adds link sweeps (link-<n>.json).
# Last, tools/bench/report.py draws build/bench/report.html from every JSON there.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=build/bench
mkdir -p "$out"
py=.venv/bin/python
want=${BENCH:-}
events=${BENCH_EVENTS:-10000000}
fail=0
selected() { [ -z "$want" ] || [[ " $want " == *" $1 "* ]]; }
for f in tools/bench/bench_*.py; do
	name=$(basename "$f" .py); name=${name#bench_}
	selected "$name" || continue
	echo "==================== bench: $name ===================="
	args=(--json "$out/$name.json")
	case $name in timeline|analyze|fleet) args+=(--events "$events") ;; esac
	$py "$f" "${args[@]}" || { echo "bench: $name FAILED" >&2; fail=1; }
	if [ "$name" = link ]; then  # the same sweep in other link configurations
		i=0
		for props in ${BENCH_LINK_CONFIGS-link-gen=3,link-width=4 link-gen=5,link-width=8}; do
			i=$((i + 1))
			$py "$f" --props "$props" --json "$out/link-$i.json" ||
				{ echo "bench: link ($props) FAILED" >&2; fail=1; }
		done
	fi
done
# vm_boot LOG SCRIPT...: one VM boot runs the in-guest benchmarks, JSON to build/bench/
# (VM_BENCH_ARGS: options given to each script)
vm_boot() {
	local log=$1; shift
	echo "==================== bench (in the VM): $* ===================="
	cmd="cd $root && rc=0; for f in $*; do n=\$(basename \$f .py); .venv/bin/python \$f --json \$TACC_VM_OUT/\${n#vm_}.json ${VM_BENCH_ARGS:-} || rc=1; done; exit \$rc"
	TACC_KEEP_RUNDIR=1 /usr/bin/python3 scripts/run-vm --cmd "$cmd" < /dev/null \
		2> "$out/$log.stderr" | tee "$out/$log" || fail=1
	cat "$out/$log.stderr" >&2
	# this boot's own run directory, as run-vm names it (not the newest /tmp/tacc-vm-*:
	# another engineer's VM may be newer, and removing it broke their run)
	local d
	d=$(sed -n 's/^run-vm: kept the run directory \([^ ]*\) .*/\1/p' "$out/$log.stderr" | tail -1)
	if [ -n "$d" ] && [ -d "$d" ]; then cp "$d"/out/*.json "$out/" 2>/dev/null; rm -rf "$d"; fi
}
vm=()
for f in tools/bench/vm_*.py; do
	[ -e "$f" ] || continue
	name=$(basename "$f" .py); name=${name#vm_}
	case $name in virt|decode) continue ;; esac  # their own boots, below
	selected "$name" && vm+=("$f")
done
[ ${#vm[@]} -eq 0 ] || vm_boot vm.log "${vm[@]}"
# virt: the PF, a VF and virtio-tacc side by side need VFs and the virtio function at boot
if selected virt; then
	VFS=2 VIRTIO=1 vm_boot vm-virt.log tools/bench/vm_virt.py
fi
# decode (GPT-2 small, fp32): the device's memory holds the weights (498 MB) and the KV
# cache (9.4 MB a sequence): devmem-size=1G; the guest 8 GiB (BENCH_DECODE_MEM) for its
# copies of the weights and the engines; the device's time scale BENCH_DECODE_SCALE
# (time-scale, x 1000): guest code under -icount runs that many times slower than this
# host runs it natively, so device durations stretched alike keep a real part's
# host/device balance (docs/measurements.md); BENCH_DECODE_ARGS: vm_decode.py's options,
# e.g. '--batches 8 --rounds 5'
if selected decode; then
	MEM=${BENCH_DECODE_MEM:-8G} QEMU_ARGS="${QEMU_ARGS:-} -global tacc.devmem-size=1G \
-global tacc.time-scale=${BENCH_DECODE_SCALE:-15000}" \
		VM_BENCH_ARGS=${BENCH_DECODE_ARGS:-} vm_boot vm-decode.log tools/bench/vm_decode.py
fi
$py tools/bench/report.py --dir "$out" || { echo "bench: report FAILED" >&2; fail=1; }
echo "bench: results in $out/"
exit $fail
