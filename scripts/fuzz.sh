#!/usr/bin/env bash
# Run QEMU's coverage-guided fuzzer (generic-fuzz) on the tacc device for N seconds:
# q35 + intel-iommu + a pcie-root-port + the tacc PF (2 VFs) + virtio-tacc-pci (generic-fuzz
# maps only devices of bus 0: the PF sits on pcie.0, the root port beside it).
#   scripts/fuzz.sh [SECONDS]          (make fuzz FUZZ_S=N; make test-long: 1800)
# The corpus is kept in build/fuzz-corpus (every run starts from it); crashes and
# timeouts land in build/fuzz-artifacts (each one becomes a qtest regression test:
# QTEST_LOG=1 build/qemu-fuzz-build/qemu-fuzz-x86_64 ... ARTIFACT prints its qtest trace).
# Prints execs/s, the hw/tacc lines it covered (libFuzzer -print_coverage) and exits
# non-zero on any crash or timeout.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/build
SECS=${1:-${FUZZ_S:-60}}
FUZZ=$B/qemu-fuzz-build/qemu-fuzz-x86_64

[[ -x $FUZZ ]] || "$ROOT/scripts/build-fuzz.sh"
mkdir -p "$B/fuzz-corpus" "$B/fuzz-artifacts"
log=$B/fuzz.log

# The generic-fuzz configuration (the form of QEMU's generic_fuzz_configs.h):
# the machine, and the memory regions/devices whose MMIO and PIO it may touch.
export QEMU_FUZZ_ARGS="-machine q35 -nodefaults -L /usr/share/seabios -L /usr/share/qemu \
 -device intel-iommu \
 -device pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1 \
 -device tacc,id=tacc0,bus=pcie.0,sriov-max-vfs=2 \
 -device virtio-tacc-pci,tacc=tacc0,devmem-base=0x4000000,devmem-size=0x4000000"
export QEMU_FUZZ_OBJECTS="tacc tacc-regs tacc-counters tacc-msix* virtio-tacc* \
 virtio-pci*"
export QEMU_FUZZ_TIMEOUT=${QEMU_FUZZ_TIMEOUT:-1000000}   # us per input: a stall is a timeout

cd "$B"
rc=0
"$FUZZ" --fuzz-target=generic-fuzz -max_total_time="$SECS" -timeout=5 -rss_limit_mb=4096 \
    -artifact_prefix="$B/fuzz-artifacts/" -print_final_stats=1 -print_coverage=1 \
    "$B/fuzz-corpus" >"$log" 2>&1 || rc=$?

execs=$(grep -m1 "stat::number_of_executed_units" "$log" | awk '{print $2}' || true)
speed=$(grep -m1 "stat::average_exec_per_sec" "$log" | awk '{print $2}' || true)
rss=$(grep -m1 "stat::peak_rss_mb" "$log" | awk '{print $2}' || true)
# covered lines of hw/tacc: COVERED_FUNC lines list the covered PCs' file:line
lines=$(grep -oE "hw/tacc/[a-z-]+\.c:[0-9]+" "$log" | sort -u | wc -l || true)
crashes=$(ls "$B/fuzz-artifacts" | grep -cE "^(crash|timeout|oom|leak)-" || true)
echo "fuzz: ${SECS} s, ${execs:-?} execs (${speed:-?}/s), peak RSS ${rss:-?} MB," \
     "hw/tacc lines covered: $lines, crashes/timeouts: $crashes (log: $log)"
[[ $rc == 0 && $crashes == 0 ]]
