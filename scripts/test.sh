#!/bin/bash
# Run the test layers and give one combined pass/fail.
#   scripts/test.sh            host, device and vm layers
#   scripts/test.sh host|device|vm|long|debug   (debug: the VM layer on the debug kernel)
# Extra pytest arguments: PYTEST_ARGS='-k foo -x', split as a shell would
# (PYTEST_ARGS='-k "capture and format"' is one -k expression).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=.venv/bin/python
layers=${*:-host device vm}
# PYTEST_ARGS split like a shell's words (shlex): quotes group, nothing is expanded
split=$(/usr/bin/python3 -c 'import os, shlex
print(" ".join(shlex.quote(a) for a in shlex.split(os.environ.get("PYTEST_ARGS", ""))))' 2>&1) ||
	{ echo "test: PYTEST_ARGS: cannot split like a shell: ${split##*: }" >&2; exit 2; }
eval "extra=($split)"
mkdir -p build/test-results
t0=$(date +%s)
# Every QEMU started below inherits this tag; whatever is left at the end is killed.
export TACC_TEST_SESSION=$$-$RANDOM
cleanup() {
	for p in /proc/[0-9]*; do
		grep -qz "^TACC_TEST_SESSION=$TACC_TEST_SESSION\$" "$p/environ" 2>/dev/null || continue
		case $(cat "$p/comm" 2>/dev/null) in qemu-system-*)
			echo "test: killing leftover QEMU ${p#/proc/}" >&2; kill -9 "${p#/proc/}" 2>/dev/null ;;
		esac
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -A result seconds
# The VM layer's Python disks (scripts/run-vm PYDISK: ~10 s of mke2fs in a new checkout)
# made while the host and device layers run; scripts/test-vm waits for it (a lock).
if [[ " $layers " == *" vm "* ]]; then
	( $py scripts/guest-pyc && /usr/bin/python3 scripts/run-vm --py-disks ) \
		>build/test-results/py-disks.log 2>&1 &
fi
# The host and device layers run their files on every core (pytest-xdist, one file per
# worker at a time: a file's tests share its fixtures and scratch paths); when both are
# asked they run side by side, each into its log, printed in order when both are done.
# On 2 idle cores: host 60 s alone (99 s in one process), host and device side by side
# 78 s (105 s in one process each).
xdist=(-n auto --dist loadfile)
declare -A early
if [[ " $layers " == *" host "* && " $layers " == *" device "* ]]; then
	for layer in host device; do
		(
			start=$(date +%s)
			$py -m pytest tests/$layer -q -p no:cacheprovider "${xdist[@]}" \
				--junitxml=build/test-results/$layer.xml "${extra[@]}" \
				>build/test-results/$layer.log 2>&1
			echo "$? $(( $(date +%s) - start ))" >build/test-results/$layer.status
		) &
		early[$layer]=$!
	done
fi

for layer in $layers; do
	start=$(date +%s)
	echo "==================== layer: $layer ===================="
	if [ -n "${early[$layer]:-}" ]; then
		wait "${early[$layer]}"
		cat build/test-results/$layer.log
		rc=1 secs=0
		read -r rc secs <build/test-results/$layer.status || rc=1
		[ $rc = 0 ] && { /usr/bin/python3 scripts/test-vm --check-skips "build/test-results/$layer.xml" || rc=1; }
		result[$layer]=$rc
		seconds[$layer]=$secs
		continue
	fi
	case $layer in
	host)   $py -m pytest tests/host -q -p no:cacheprovider "${xdist[@]}" --junitxml=build/test-results/host.xml "${extra[@]}" ;;
	device) $py -m pytest tests/device -q -p no:cacheprovider "${xdist[@]}" --junitxml=build/test-results/device.xml "${extra[@]}" ;;
	vm)     /usr/bin/python3 scripts/test-vm "${extra[@]}" ;;
	# long: the heavy tests of every layer, then the VM settings make test does not boot
	# (IOMMU=off, ICOUNT=0: scripts/test-vm --set long)
	long)   TACC_LONG=1 $py -m pytest tests/host tests/device -q -p no:cacheprovider -m long "${extra[@]}" &&
		TACC_LONG=1 /usr/bin/python3 scripts/test-vm --no-boot-check -q -m long "${extra[@]}" &&
		TACC_LONG=1 /usr/bin/python3 scripts/test-vm --no-boot-check --set long "${extra[@]}" ;;
	# the VM layer, the tests marked debugkernel (long ones included) and fault injection
	# (two boots side by side: the strict files, and the extras' with VFs, SMP and virtio)
	debug)  scripts/debug-kernel.sh && {
		TACC_LONG=1 /usr/bin/python3 scripts/test-vm --no-boot-check --config debug \
			-m 'not long or debugkernel' "${extra[@]}" & a=$!
		TACC_LONG=1 /usr/bin/python3 scripts/test-vm --no-boot-check --config debug-extras \
			-m 'not long or debugkernel' "${extra[@]}"; b=$?
		wait $a && [ $b = 0 ]; } ;;
	*) echo "test: unknown layer $layer; accepted: host device vm long debug" >&2; exit 2 ;;
	esac
	rc=$?
	case $layer in host|device)
		[ $rc = 0 ] && { /usr/bin/python3 scripts/test-vm --check-skips "build/test-results/$layer.xml" || rc=1; } ;;
	esac
	# pytest exit 5 = nothing collected: a layer with no tests is not a pass.
	result[$layer]=$rc
	seconds[$layer]=$(( $(date +%s) - start ))
done
echo "==================== summary ===================="
fail=0
for layer in $layers; do
	if [ "${result[$layer]}" = 0 ]; then s=passed; else s="FAILED (exit ${result[$layer]})"; fail=1; fi
	printf '%-8s %-20s %4ss\n' "$layer" "$s" "${seconds[$layer]}"
done
# the failed tests by name, last: a log kept only by its tail still says which
[ $fail = 0 ] || /usr/bin/python3 scripts/test-vm --list-failures build/test-results --since "$t0" || true
[ $fail = 0 ] && echo "make test: all layers passed" || echo "make test: FAILED"
exit $fail
