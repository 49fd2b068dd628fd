#!/usr/bin/env python3
"""Live migration of a VF through VFIO, run inside the test VM (`make bench BENCH=vfiomig`):

VF 1 on tacc_vfio_pci (docs/vfio.md "Live migration"); each round is
tacc.vfio.workload.migrate_in_flight (two jobs in flight, numpy-checked after the
restore); the figures of each phase, guest clock:
  state_bytes   the STOP_COPY data (header + registers + the VF's device-memory window)
  stop_ms       RUNNING -> STOP (the device's STOP, VF_STATE polled to STOPPED)
  stop_copy_ms  STOP -> STOP_COPY (QUERY, a PF buffer, SAVE)
  read_ms       the data fd read to EOF
  load_ms       STOP -> RESUMING, the data written, -> STOP (LOAD)
  resume_ms     STOP -> RUNNING (RESUME)
  downtime_ms   their sum: the VF runs nothing from the stop to the resume (the VMM's
                transfer of the data between hosts excluded)
VFs are enabled if the boot has none (and disabled again).

    tools/bench/vm_vfiomig.py [--json out.json] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/vm"))
sys.path.insert(0, str(ROOT / "userspace"))

from tacc.vfio import bind as vb  # noqa: E402
from tacc.vfio.driver import TaccVfio  # noqa: E402
from tacc.vfio.migration import Migration  # noqa: E402
from tacc.vfio.workload import migrate_in_flight  # noqa: E402
from test_driver_basic import pf_sysfs  # noqa: E402

PHASES = ("stop_ms", "stop_copy_ms", "read_ms", "load_ms", "resume_ms", "downtime_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--rounds", type=int, default=5, help="migrations")
    args = ap.parse_args()
    pf = pf_sysfs()
    before = (pf / "sriov_numvfs").read_text().strip()
    if before == "0":
        (pf / "sriov_numvfs").write_text("2")
    vf = sorted(p.resolve() for p in pf.glob("virtfn*"))[0]
    rounds = []
    try:
        vb.bind(vf.name, driver=vb.VARIANT_DRIVER)
        with TaccVfio(vf.name) as t:
            m = Migration(t.dev)
            for i in range(args.rounds):
                rounds.append(migrate_in_flight(t, m, seed=i))
    finally:
        vb.unbind(vf.name)
        if before == "0":
            (pf / "sriov_numvfs").write_text("0")
    res = {"bdf": vf.name, "rounds": args.rounds, "state_bytes": rounds[0]["state_bytes"],
           "regs_bytes": rounds[0]["regs_bytes"], "devmem_bytes": rounds[0]["devmem_bytes"],
           **{p: {"median": statistics.median(r[p] for r in rounds),
                  "min": min(r[p] for r in rounds), "max": max(r[p] for r in rounds)}
              for p in PHASES}}
    print(f"VF {vf.name} migrated {args.rounds} times with two jobs in flight (numpy-checked); "
          f"state {res['state_bytes']} bytes ({res['regs_bytes']} registers + "
          f"{res['devmem_bytes']} device memory); guest clock, ms:")
    print(f"{'phase':<14}{'median':>10}{'min':>10}{'max':>10}")
    for p in PHASES:
        s = res[p]
        print(f"{p:<14}{s['median']:>10.2f}{s['min']:>10.2f}{s['max']:>10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
