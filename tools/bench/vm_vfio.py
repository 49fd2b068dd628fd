#!/usr/bin/env python3
"""tacc.ko versus tacc.vfio on the same VF, run inside the test VM (`make bench BENCH=vfio`):

submit-to-completion latency of a one-NOP job (guest clock), interleaved rounds on VF 2:
  kernel     tacc.ko: DRM_IOCTL_TACC_SUBMIT + WAIT (MSI-X -> fence -> wake)
  vfio_irq   tacc.vfio: descriptor + doorbell from user space, MSI-X -> eventfd -> select
  vfio_poll  tacc.vfio: descriptor + doorbell, spin on CQ_TAIL (no interrupt)
Between rounds the VF moves between tacc.ko and vfio-pci (tacc vfio bind/unbind), so
every mode sees the same function, IOMMU and device.  VFs are enabled if the boot has
none (and disabled again).

    tools/bench/vm_vfio.py [--json out.json] [--iters N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/vm"))
sys.path.insert(0, str(ROOT / "userspace"))

from tacc.vfio import bind as vb  # noqa: E402
from tacc.vfio.driver import TaccVfio  # noqa: E402
from tacc.vfio.workload import nop_latency  # noqa: E402
from test_driver_basic import Dev, nop, pf_sysfs, wait_accel_node  # noqa: E402

WARM = 20


def stats(us: list[float]) -> dict:
    xs = sorted(us)
    return {"iters": len(xs), "median_us": statistics.median(xs),
            "p10_us": xs[len(xs) // 10], "p90_us": xs[len(xs) * 9 // 10], "min_us": xs[0]}


def kernel_round(vf: Path, iters: int) -> list[float]:
    vb.unbind(vf.name)
    with Dev(wait_accel_node(vf)) as d:
        for _ in range(WARM):
            d.run([nop()])
        out = []
        for i in range(iters):
            t = time.perf_counter_ns()
            assert d.run([nop(tag=i)]) == 0
            out.append((time.perf_counter_ns() - t) / 1000)
    return out


def vfio_round(vf: Path, iters: int, irq: bool) -> list[float]:
    vb.bind(vf.name)
    with TaccVfio(vf.name, irq=irq) as t:
        nop_latency(t, WARM)
        return [ns / 1000 for ns in nop_latency(t, iters)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--iters", type=int, default=300, help="NOP jobs per mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = ap.parse_args()
    pf = pf_sysfs()
    before = (pf / "sriov_numvfs").read_text().strip()
    if before == "0":
        (pf / "sriov_numvfs").write_text("2")
    vf = sorted(p.resolve() for p in pf.glob("virtfn*"))[1]
    lat: dict[str, list[float]] = {"kernel": [], "vfio_irq": [], "vfio_poll": []}
    try:
        for _ in range(args.rounds):
            lat["kernel"] += kernel_round(vf, args.iters)
            lat["vfio_irq"] += vfio_round(vf, args.iters, irq=True)
            lat["vfio_poll"] += vfio_round(vf, args.iters, irq=False)
    finally:
        vb.unbind(vf.name)
        if before == "0":
            (pf / "sriov_numvfs").write_text("0")
    res = {"bdf": vf.name, "rounds": args.rounds, **{k: stats(v) for k, v in lat.items()}}
    k = res["kernel"]["median_us"]
    res["ratio_vfio_irq_over_kernel"] = res["vfio_irq"]["median_us"] / k
    res["ratio_vfio_poll_over_kernel"] = res["vfio_poll"]["median_us"] / k
    print(f"NOP submit-to-completion on VF {vf.name} ({args.rounds} interleaved rounds x "
          f"{args.iters}), guest clock:")
    print(f"{'path':<11}{'median us':>10}{'p10':>9}{'p90':>9}{'min':>9}{'x tacc.ko':>11}")
    for name in lat:
        s = res[name]
        print(f"{name:<11}{s['median_us']:>10.1f}{s['p10_us']:>9.1f}{s['p90_us']:>9.1f}"
              f"{s['min_us']:>9.1f}{s['median_us'] / k:>11.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
