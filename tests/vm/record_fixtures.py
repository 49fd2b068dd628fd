"""Record the host layer's real captures in the test VM (``make fixtures``).

Run in the guest by scripts/record-fixtures (one boot, VIRTIO=1): taccd's capture engine
(tests/vm/test_e2e_real.py's Recorder: ``CaptureSession`` driven by a 50 ms tick, one BPF
program, the workloads in one worker process with API tracing on) records

- each twin of test_e2e_real.TWINS, bad and good, at that file's sizes and time-scales;
- the mixed workload (test_e2e_real.MIXED) on the PF;
- the mixed workload on the virtio-tacc function (virtio-mixed);
- noisy_neighbour on a VF pair, bad and good (VF1 victim, VF2 aggressor; 2 VFs enabled
  for it, as test_e2e_real's two_vfs does).

Usage (guest): python tests/vm/record_fixtures.py OUTDIR
Each capture lands in OUTDIR/<name>/ with OUTDIR/<name>.json (the runs and the worker's
results).  Not a test file: pytest does not collect it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_e2e_real as e2e  # noqa: E402
from conftest import tacc_pci_devices  # noqa: E402


def main(out: Path) -> int:
    from tacc.bpftrace import preflight
    from tacc.bpftrace.program import Program
    from tacc.devices import discover

    out.mkdir(parents=True, exist_ok=True)
    pf = next(d for d in tacc_pci_devices() if not (d / "physfn").exists())
    (pf / "power" / "control").write_text("on")
    prog = Program(preflight.all_checks(bcc=True), rb_pages=4096, host=True)
    worker = e2e.Worker()
    rec = e2e.Recorder(prog, worker, out, pf)
    done: dict[str, dict[str, object]] = {}

    def one(name: str, runs: list[tuple[str, bool, dict[str, object]]], scale: int = 1000,
            devices: list[str] | None = None) -> None:
        t = time.monotonic()
        _, results, _ = rec.capture(name, runs, scale, devices=devices)
        done[name] = {"runs": runs, "time_scale": scale / 1000, "devices": devices,
                      "results": results, "wall_s": round(time.monotonic() - t, 1)}
        (out / f"{name}.json").write_text(json.dumps(done[name], indent=1, default=str) + "\n")
        print(f"record_fixtures: {name} {done[name]['wall_s']} s", flush=True)

    try:
        for name, (kw, _, scale) in e2e.TWINS.items():
            one(f"{name}-bad", [(name, True, kw)], scale)
            one(f"{name}-good", [(name, False, kw)], scale)
        one("mixed", e2e.MIXED)
        virtio = [f for f in discover() if f.kind == "virtio" and f.accel]
        assert virtio, "no virtio-tacc function bound (boot with VIRTIO=1)"
        one("virtio-mixed", e2e.MIXED, devices=[virtio[0].pci])
        # the VF pair: the PF does not runtime-suspend while VFs are enabled
        numvfs = pf / "sriov_numvfs"
        numvfs.write_text("2")
        rec.fresh = False
        try:
            vfs = [(pf / f"virtfn{i}").resolve() for i in range(2)]
            deadline = time.monotonic() + 20
            while not all(list((v / "accel").glob("accel*")) if (v / "accel").exists() else []
                          for v in vfs):
                assert time.monotonic() < deadline, "VF accel nodes did not appear"
                time.sleep(0.1)
            pair = [v.name for v in vfs]
            one("noisy_neighbour-bad", [("noisy_neighbour", True, {})], 4000, pair)
            one("noisy_neighbour-good", [("noisy_neighbour", False, {})], 4000, pair)
        finally:
            numvfs.write_text("0")
    finally:
        worker.close()
        prog.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: record_fixtures.py OUTDIR")
    sys.exit(main(Path(sys.argv[1])))
