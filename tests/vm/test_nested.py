"""A nested guest on a VF (docs/vfio.md "Nested guest").

Runs in its own boot, "nested" (VFS=2 SMP=2 MEM=4G), under ``make test-long`` (the
``long`` marker: a TCG guest inside a TCG guest takes minutes).  VF 1 goes to vfio-pci
in the test VM, and
``scripts/run-vm`` itself boots a nested VM on it (``PASSTHROUGH=<VF>``: our QEMU's
``-device vfio-pci``, no emulated tacc device, no vIOMMU, host time), with the same
kernel, initramfs and guest-init, over 9p the test VM's root (the host's tree).  In the
nested guest tacc.ko binds the VF, and one ``tacc run mlp`` (numpy-checked) runs under
``tacc stat`` with ``accel-bpftrace snoop`` attached around it.  Then the VF goes back to
tacc.ko in the test VM, which runs the same commands on it: the device counters of the
same work must be equal in both, the times are reported (docs/vfio.md has the figures).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tacc.vfio import bind as vb
from test_driver_basic import pf_sysfs, wait_accel_node

pytestmark = [pytest.mark.long, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
# 512 MiB was enough to boot and run mlp, but accel-bpftrace's bcc compile (clang over the
# kernel headers) then ran 50+ min of host wall without finishing; with 1536 MiB it took
# 2 min 36 s of the nested clock, so the nested boot gets MEM=4G
NESTED_MEM = "1536M"
NESTED_TIMEOUT = 3000.0  # seconds of the test VM's clock (-icount) for the nested run
SNOOP_WAIT = 900  # the nested guest's wait for accel-bpftrace's probes (bcc compiles)
# counters that count the work itself, not where memory sits: equal for the same work
WORK_COUNTERS = ("jobs_completed", "cmds_completed", "flops", "h2d_bytes", "d2h_bytes")

# The workload, a shell script for the nested guest's guest-init (and, the same lines, for
# the test VM): the function's driver and node, then snoop attached around one
# `tacc stat -- tacc run mlp`, every output in $out.
WORKLOAD = r"""
set -u
out=$1 bdf=$2
fn=/sys/bus/pci/devices/$bdf
basename "$(readlink "$fn/driver")" > "$out/driver"
lspci -nnk -s "$bdf" > "$out/lspci.txt" 2>&1
ls "$fn/accel" > "$out/accel.txt" 2>&1
now() { cut -d' ' -f1 /proc/uptime; }
t0=$(now)
accel-bpftrace snoop --json --duration 3000 -d "$bdf" > "$out/snoop.json" 2> "$out/snoop.err" &
sp=$!
for _ in $(seq SNOOP_WAIT); do
	grep -q 'Ctrl-C to end' "$out/snoop.err" && break
	kill -0 "$sp" 2>/dev/null || break
	sleep 1
done
t1=$(now)
tacc stat --json -d "$bdf" -- sh -c "tacc run mlp --json -d $bdf > $out/mlp.json 2> $out/mlp.err" \
	> "$out/stat.json" 2> "$out/stat.err"
echo $? > "$out/stat.rc"
t2=$(now)
kill -INT "$sp" 2>/dev/null
wait "$sp"
echo $? > "$out/snoop.rc"
echo "$t0 $t1 $t2 $(now)" > "$out/times"
""".replace("SNOOP_WAIT", str(SNOOP_WAIT))


def _run_vm_module() -> Any:
    loader = importlib.machinery.SourceFileLoader("run_vm", str(ROOT / "scripts/run-vm"))
    spec = importlib.util.spec_from_loader("run_vm", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_vm"] = mod  # dataclasses look their module up
    loader.exec_module(mod)
    return mod


def host_now(out: Path) -> float:
    """The host's wall clock: the mtime the host's file system gives a file written on
    the output share (the test VM's own clock runs -icount, not wall time)."""
    f = out / ".nested-clock"
    f.write_text(str(time.monotonic()))
    t = f.stat().st_mtime
    f.unlink()
    return t


@dataclass
class Run:
    """One run of WORKLOAD: its output directory and what it wrote."""

    out: Path

    def text(self, name: str) -> str:
        p = self.out / name
        return p.read_text(errors="replace") if p.exists() else ""

    def json(self, name: str) -> Any:
        return json.loads(self.text(name))

    def times(self) -> tuple[float, float, float]:
        """(snoop attach, stat + mlp, snoop stop) seconds of that guest's clock."""
        t0, t1, t2, t3 = (float(x) for x in self.text("times").split())
        return t1 - t0, t2 - t1, t3 - t2

    def counters(self) -> dict[str, int]:
        fns = self.json("stat.json")["functions"]
        assert len(fns) == 1, fns
        return {k: v["value"] for k, v in fns[0]["counters"].items()}

    def snoop_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        lines = [json.loads(ln) for ln in self.text("snoop.json").splitlines()
                 if ln.startswith("{")]
        rows = [r for r in lines if r.get("event") in ("submit", "done")]
        return rows, [r for r in lines if r.get("event") == "summary"]


@dataclass
class Nested:
    run: Run
    console: str
    boot_wall_s: float  # host wall seconds, QEMU start to the nested command
    total_wall_s: float  # host wall seconds of the whole nested VM
    boot_guest_s: float  # the nested guest's own clock at its command


def _console_time(times: Path, marker: str) -> float:
    for ln in times.read_text(errors="replace").splitlines():
        if marker in ln:
            return float(ln.split(" ", 1)[0])
    return -1.0


@pytest.fixture(scope="module")
def vf() -> Any:
    """VF 1 of the nested boot on vfio-pci for the module; back on tacc.ko at the end."""
    vfs = sorted(p.resolve() for p in pf_sysfs().glob("virtfn*"))
    if not vfs:
        pytest.fail("no VFs: this file runs in the nested boot (VFS=2)")
    if not (vfs[0] / "iommu_group").exists():
        pytest.skip("IOMMU off: vfio-pci needs an IOMMU group (Debian's kernel has no "
                    "VFIO_NOIOMMU)")
    bdf = vfs[0].name
    f = vb.bind(bdf)
    assert f.driver == "vfio-pci" and f.vfio and os.path.exists(f.vfio), f
    try:
        yield vfs[0]
    finally:
        vb.unbind(bdf)
        assert vb.driver_of(bdf) == vb.TACC_DRIVER
        wait_accel_node(vfs[0])


@pytest.fixture(scope="module")
def nested(vf: Path) -> Nested:
    """The nested VM on the VF, running WORKLOAD once; its files kept in the test VM's
    output share (nested/)."""
    run_vm = _run_vm_module()
    share = Path(os.environ.get("TACC_VM_OUT", "/tmp"))
    run_dir = Path("/tmp/tacc-nested")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    script = run_dir / "workload.sh"
    script.write_text(WORKLOAD)
    env = {"PASSTHROUGH": vf.name, "MEM": NESTED_MEM, "IOMMU": "off", "ICOUNT": "0",
           "VFS": "0", "VIRTIO": "0", "SMP": "1", "NODES": "1"}
    cfg = run_vm.VMConfig.from_env(env)
    cfg.timeout = NESTED_TIMEOUT
    # the nested console goes straight to the output share, so a run killed on timeout
    # still shows how far the nested guest got (run-vm opens these paths for writing)
    keep = share / "nested"
    keep.mkdir(exist_ok=True)
    for name in ("console.log", "console.times"):
        (keep / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(keep / name)
    # the nested guest sees the test VM's / over 9p: this run directory's workload.sh too
    cmd = f'bash {script} "$TACC_VM_OUT" $(basename "$(dirname "$(grep -l 0x7acc ' \
          '/sys/bus/pci/devices/*/vendor | head -1)")")'
    t0 = host_now(share)
    st = run_vm.run(cfg, cmd, run_dir=run_dir, echo=False)
    total = host_now(share) - t0
    shutil.copytree(run_dir, keep, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns("*.sock", "console.*"))
    console = (run_dir / "console.log").read_text(errors="replace")
    # console.times: the test VM's clock (-icount), scaled to host wall by the run's total
    times = run_dir / "console.times"
    ready = _console_time(times, "guest-init: ready after")
    end = _console_time(times, "TACC-EXIT:")
    boot_wall = total * ready / end if ready > 0 and end > 0 else -1.0
    guest = -1.0
    for ln in console.splitlines():
        if "guest-init: ready after" in ln:
            guest = float(ln.split("ready after ", 1)[1].split()[0])
    assert st == 0, f"nested VM exited {st}; console tail:\n{console[-3000:]}"
    print(f"nested VM: {total:.0f} s of host wall in all, boot to the command ~{boot_wall:.0f} s"
          f" (nested guest clock {guest:.1f} s)")
    return Nested(Run(run_dir / "out"), console, boot_wall, total, guest)


@pytest.fixture(scope="module")
def outer(nested: Nested, vf: Path) -> Run:
    """The same WORKLOAD in the test VM, on the same VF back on tacc.ko."""
    import subprocess

    vb.unbind(vf.name)
    wait_accel_node(vf)
    out = Path("/tmp/tacc-nested-outer")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (out / "workload.sh").write_text(WORKLOAD)
    r = subprocess.run(["bash", str(out / "workload.sh"), str(out), vf.name],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    share = Path(os.environ.get("TACC_VM_OUT", "/tmp"))
    shutil.copytree(out, share / "nested-outer", dirs_exist_ok=True)
    return Run(out)


def test_nested_guest_binds_vf(nested: Nested, vf: Path) -> None:
    """In the nested guest the passed-through VF is a PCI function tacc.ko drives, with
    its accel node."""
    r = nested.run
    assert r.text("driver").strip() == "tacc", (r.text("driver"), nested.console[-2000:])
    assert "Kernel driver in use: tacc" in r.text("lspci.txt"), r.text("lspci.txt")
    assert r.text("accel.txt").startswith("accel"), r.text("accel.txt")
    assert "7acc" in r.text("lspci.txt"), r.text("lspci.txt")


def test_nested_mlp_passes(nested: Nested) -> None:
    """`tacc run mlp` (numpy-checked) through tacc.ko in the nested guest, under stat."""
    r = nested.run
    assert r.text("stat.rc").strip() == "0", (r.text("stat.err"), r.text("mlp.err"))
    mlp = r.json("mlp.json")
    assert mlp["workload"] == "mlp" and mlp["results"], mlp
    c = r.counters()
    assert c["jobs_completed"] > 0 and c["flops"] > 0, c
    assert c["dma_errors"] == 0 and c["mmu_faults"] == 0, c


def test_nested_snoop_sees_the_jobs(nested: Nested) -> None:
    """accel-bpftrace in the nested guest sees every submitted job complete, none lost.
    Not equal to the device's jobs_completed: that also counts tacc.ko's own scrub jobs
    (kernel context, no submit ioctl: 99 device jobs for 90 user jobs in one run,
    the same in the test VM), which snoop does not trace as user jobs."""
    r = nested.run
    assert r.text("snoop.rc").strip() == "0", r.text("snoop.err")[-2000:]
    rows, summ = r.snoop_rows()
    assert summ and summ[0]["lost"] == 0 and summ[0]["missed"] == 0, summ
    submits = sum(x["event"] == "submit" for x in rows)
    done = sum(x["event"] == "done" for x in rows)
    assert submits == done > 0, (submits, done)
    assert all(x["error"] == 0 for x in rows if x["event"] == "done"), rows[-3:]
    assert done <= r.counters()["jobs_completed"], (done, r.counters())


def test_nested_vs_test_vm(nested: Nested, outer: Run) -> None:
    """The same work on the same VF: equal work counters in the nested guest and in the
    test VM; the times of both printed (docs/vfio.md "Nested guest")."""
    assert outer.text("stat.rc").strip() == "0", outer.text("stat.err")
    n, o = nested.run.counters(), outer.counters()
    assert {k: n[k] for k in WORK_COUNTERS} == {k: o[k] for k in WORK_COUNTERS}
    orows, _ = outer.snoop_rows()
    nrows, _ = nested.run.snoop_rows()
    assert sum(x["event"] == "submit" for x in nrows) == sum(x["event"] == "submit"
                                                             for x in orows)
    na, nw, _ = nested.run.times()
    oa, ow, _ = outer.times()
    ns, os_ = nested.run.json("stat.json"), outer.json("stat.json")
    print(f"nested boot ~{nested.boot_wall_s:.0f} s host wall ({nested.boot_guest_s:.1f} s "
          f"nested clock), whole nested VM {nested.total_wall_s:.0f} s host wall")
    print(f"snoop attach: nested {na:.1f} s, test VM {oa:.1f} s; tacc stat -- tacc run mlp: "
          f"nested {nw:.1f} s, test VM {ow:.1f} s (each guest's clock)")
    print(f"tacc stat elapsed: nested {ns['elapsed_s']:.2f} s, test VM {os_['elapsed_s']:.2f} s")
    for k in sorted(n):
        if n[k] or o[k]:
            print(f"  {k:24} nested {n[k]:>14,}  test VM {o[k]:>14,}")
