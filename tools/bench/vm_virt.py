#!/usr/bin/env python3
"""PF, VF and virtio-tacc side by side, run inside the test VM (`make bench BENCH=virt`,
one boot with VFS=2 VIRTIO=1; docs/virtio.md):

- NOP submit-to-completion latency (SUBMIT + WAIT of a one-NOP job; median, p99), and
  where it goes: the SUBMIT ioctl alone and the WAIT after it;
- jobs/s: one-NOP jobs kept 64 in flight on one queue of one file (the guest CPU is the
  bottleneck), and one-GEMM jobs of 256^3 (the device is: jobs queue up behind the ring,
  where batching can act);
- copy bandwidth by size (H2D and D2H through the runtime, submit to completion);
- `tacc run mlp` batches/s (the double-buffered pipeline, numpy check off);
- the same on virtio-tacc with the frontend's batching limit (`virtio_ring_batches`) at 0
  (one submit buffer per job: no batching) and 1, beside its default (2);
- per job: interrupts (`msi`: the function's MSI-X vectors in /proc/interrupts) and, on
  virtio-tacc, the frontend's debugfs `virtio_stats` (`fe_*`): submit buffers (batches),
  kicks, completion callbacks (irqs), used buffers, and guest ns in the SUBMIT ioctl and
  in the completion callback.

Every metric runs in R interleaved rounds (one round = every function once, the order
rotated per round); medians with 95 % intervals (benchstats.median_ci) and the ratios
virtio/VF and VF/PF with paired-bootstrap intervals over rounds (benchstats.ratio_ci).
Times are the guest's CLOCK_MONOTONIC: under ICOUNT=1 that is virtual time (guest
instructions plus the device model's modelled delays; the host's cost of a VM exit, a
kick or the backend's C code is not in it).

    tools/bench/vm_virt.py [--json out.json] [--rounds R] [--iters N] [--quick]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/vm"))
sys.path.insert(0, str(ROOT / "userspace"))
sys.path.insert(0, str(ROOT / "tools/bench"))

import numpy as np  # noqa: E402
from benchstats import median_ci, ratio_ci  # noqa: E402
from tacc.runtime import Context  # noqa: E402
from tacc.runtime.device import DeviceInfo, devices  # noqa: E402
from tacc.workloads.mlp import mlp  # noqa: E402
from test_driver_basic import DEVICE, Dev, gemm, nop, pf_sysfs  # noqa: E402

KINDS = ("pf", "vf", "virtio")
# virtio-tacc again with the frontend's batching knob (tacc.ko virtio_ring_batches):
# 0 = one submit buffer per job (no job held), 1 = held behind one buffer per ring
VARIANTS = {"virtio_rb0": 0, "virtio_rb1": 1}
RING_BATCHES = Path("/sys/module/tacc/parameters/virtio_ring_batches")
DEBUGFS = Path("/sys/kernel/debug/accel")
COPY_SIZES = (4096, 65536, 1 << 20, 4 << 20)
GEMM_DIM = 256  # the GEMM jobs of the device-bound jobs/s run: 256^3 multiply-adds
WARM = 20


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


# ------------------------------------------------------------- counters ----
def irq_count(pci: str) -> int:
    """Interrupts taken on the function's MSI/MSI-X vectors (all CPUs)."""
    d = Path(f"/sys/bus/pci/devices/{pci}/msi_irqs")
    irqs = {p.name for p in d.iterdir()} if d.exists() else set()
    total = 0
    for ln in Path("/proc/interrupts").read_text().splitlines()[1:]:
        head, _, rest = ln.partition(":")
        if head.strip() in irqs:
            total += sum(int(x) for x in rest.split() if x.isdigit())
    return total


def vstats_path(info: DeviceInfo) -> Path | None:
    """6.12's accel debugfs directory is named after the DRM device's parent: the
    virtio device (virtioN) under the virtio-pci function."""
    for v in Path(f"/sys/bus/pci/devices/{info.pci}").glob("virtio*"):
        p = DEBUGFS / v.name / "virtio_stats"
        if p.exists():
            return p
    return None


def vstats(info: DeviceInfo) -> dict[str, int]:
    """The frontend's counters (`key value` lines), {} without them."""
    p = vstats_path(info)
    if p is None:
        return {}
    out = {}
    for ln in p.read_text().splitlines():
        k, _, v = ln.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


class Counted:
    """Interrupts and frontend counters over a section, per job."""

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info

    def __enter__(self) -> Counted:
        self.irq0, self.v0 = irq_count(self.info.pci), vstats(self.info)
        return self

    def __exit__(self, *exc: object) -> None:
        self.irqs = irq_count(self.info.pci) - self.irq0
        v1 = vstats(self.info)
        self.vdelta = {k: v1[k] - self.v0.get(k, 0) for k in v1}

    def per_job(self, jobs: int) -> dict[str, float]:
        out = {"msi_per_job": self.irqs / jobs}
        for k, v in self.vdelta.items():
            if k not in ("jobs", "fence_page"):
                out[f"fe_{k}_per_job"] = v / jobs
        return out


# -------------------------------------------------------------- metrics ----
def nop_round(info: DeviceInfo, iters: int) -> dict[str, Any]:
    with Dev(info.devnode) as d:
        for _ in range(WARM):
            d.run([nop()])
        lat, sub, wt = [], [], []
        with Counted(info) as c:
            for i in range(iters):
                t0 = now()
                s = d.submit([nop(tag=i)])
                t1 = now()
                assert d.wait(s) == 0
                t2 = now()
                lat.append((t2 - t0) * 1e6)
                sub.append((t1 - t0) * 1e6)
                wt.append((t2 - t1) * 1e6)
    return {"lat_us": lat, "submit_us": statistics.median(sub),
            "wait_us": statistics.median(wt), **c.per_job(iters)}


def jobs_round(info: DeviceInfo, jobs: int, gemms: bool = False,
               depth: int = 64) -> dict[str, Any]:
    """``jobs`` one-command jobs kept ``depth`` in flight on queue 0: NOPs (the guest CPU
    is the bottleneck), or 256^3 GEMMs (the device is)."""
    with Dev(info.devnode) as d:
        cmd = nop()
        if gemms:
            n = GEMM_DIM
            a, b, c = (d.bo(n * n * 4, DEVICE).handle for _ in range(3))
            cmd = gemm(a, b, c, n, n, n)
        d.run([cmd])
        pending: list[int] = []
        with Counted(info) as c:
            t = now()
            for _ in range(jobs):
                while True:
                    try:
                        pending.append(d.submit([cmd]))
                        break
                    except OSError as e:
                        if e.errno != errno.EAGAIN or not pending:
                            raise
                        assert d.wait(pending.pop(0)) == 0
                if len(pending) >= depth:
                    assert d.wait(pending.pop(0)) == 0
            for s in pending:
                assert d.wait(s) == 0
            el = now() - t
    return {"jobs_per_s": jobs / el, **c.per_job(jobs)}


def copy_round(ctx: Context, reps: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    s = ctx.stream()
    for size in COPY_SIZES:
        h = ctx.host_buffer(size, np.uint8)
        dv = ctx.device_buffer(size, np.uint8)
        h.array[...] = 7
        s.copy_h2d(dv, h)
        s.synchronize()  # warm: first touch of both buffers
        row = {}
        for name in ("h2d", "d2h"):
            ts = []
            for _ in range(reps):
                t = now()
                if name == "h2d":
                    s.copy_h2d(dv, h)
                else:
                    s.copy_d2h(h, dv)
                s.synchronize()
                ts.append(now() - t)
            row[f"{name}_mib_s"] = size / statistics.median(ts) / (1 << 20)
        out[str(size)] = row
        dv.free()
        h.free()
    return out


def mlp_round(ctx: Context, batches: int) -> dict[str, float]:
    r = mlp(ctx, check=False, batches=batches)
    return {"batches_per_s": batches / (r.wall_ns / 1e9),
            "device_ms": r.device_ns / 1e6, "wall_ms": r.wall_ns / 1e6}


# --------------------------------------------------------------- driver ----
def functions() -> dict[str, DeviceInfo]:
    found: dict[str, DeviceInfo] = {}
    for d in devices():
        found.setdefault(d.kind, d)
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    fns = functions()
    missing = [k for k in KINDS if k not in fns]
    if missing:
        raise SystemExit(f"vm_virt.py: no {', '.join(missing)} function in this boot "
                         "(make bench BENCH=virt boots with VFS=2 VIRTIO=1)")
    default_rb = RING_BATCHES.read_text().strip() if RING_BATCHES.exists() else None
    paths = list(KINDS) + (list(VARIANTS) if default_rb is not None else [])
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in paths}
    ctxs = {k: Context(fns[k]) for k in KINDS}
    try:
        for k in KINDS:  # warm every path once (runtime PM, page cache, numpy)
            mlp_round(ctxs[k], 2)
        for r in range(args.rounds):
            order = paths[r % len(paths):] + paths[:r % len(paths)]
            for p in order:
                k = p if p in KINDS else "virtio"
                if default_rb is not None:
                    RING_BATCHES.write_text(str(VARIANTS.get(p, default_rb)))
                t = now()
                row: dict[str, Any] = {"nop": nop_round(fns[k], args.iters),
                                       "jobs": jobs_round(fns[k], args.jobs),
                                       "gemmjobs": jobs_round(fns[k], args.jobs // 4, True),
                                       "copy": copy_round(ctxs[k], args.copy_reps),
                                       "mlp": mlp_round(ctxs[k], args.batches)}
                row["seconds"] = now() - t
                rounds[p].append(row)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        if default_rb is not None:
            RING_BATCHES.write_text(default_rb)
        for c in ctxs.values():
            c.close()
    res = summarize(fns, rounds, args)
    res["virtio_ring_batches_default"] = default_rb
    return res


def _ci(xs: list[float]) -> dict[str, float]:
    m, lo, hi = median_ci(xs)
    return {"median": m, "ci95": [lo, hi]}


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    p, lo, hi = ratio_ci(num, den)
    return {"ratio": p, "ci95": [lo, hi]}


def summarize(fns: dict[str, DeviceInfo], rounds: dict[str, list[dict[str, Any]]],
              args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"kernel": os.uname().release, "rounds": args.rounds,
                           "iters": args.iters, "jobs": args.jobs, "mlp_batches": args.batches,
                           "functions": {k: {"pci": fns[k].pci, "node": fns[k].devnode}
                                         for k in KINDS},
                           "per_function": {}, "ratios": {}}
    series: dict[str, dict[str, list[float]]] = {}
    for k in rounds:
        rs = rounds[k]
        allat = [x for r in rs for x in r["nop"]["lat_us"]]
        s = series[k] = {
            "nop_median_us": [statistics.median(r["nop"]["lat_us"]) for r in rs],
            "nop_p99_us": [pct(r["nop"]["lat_us"], 99) for r in rs],
            "jobs_per_s": [r["jobs"]["jobs_per_s"] for r in rs],
            "gemm_jobs_per_s": [r["gemmjobs"]["jobs_per_s"] for r in rs],
            "mlp_batches_per_s": [r["mlp"]["batches_per_s"] for r in rs],
        }
        for size in COPY_SIZES:
            for d in ("h2d", "d2h"):
                s[f"copy_{d}_{size}_mib_s"] = [r["copy"][str(size)][f"{d}_mib_s"] for r in rs]
        pf: dict[str, Any] = {m: _ci(v) for m, v in s.items()}
        pf["nop_all"] = {"n": len(allat), "median_us": statistics.median(allat),
                         "p99_us": pct(allat, 99), "min_us": min(allat)}
        where: dict[str, float] = {}
        for part in ("nop", "jobs", "gemmjobs"):
            keys = [x for x in rs[0][part] if x not in ("lat_us", "jobs_per_s")]
            for x in keys:
                where[f"{part}.{x}"] = statistics.median(r[part][x] for r in rs)
        pf["where"] = where
        pf["seconds"] = sum(r["seconds"] for r in rs)
        res["per_function"][k] = pf
    pairs = [("virtio", "vf"), ("vf", "pf"), ("virtio", "pf")]
    pairs += [("virtio", v) for v in VARIANTS if v in rounds]
    for num, den in pairs:
        res["ratios"][f"{num}/{den}"] = {m: _ratio(series[num][m], series[den][m])
                                         for m in series[num]}
    vf = res["ratios"]["virtio/vf"]
    res["goals"] = {
        "mlp_virtio_over_vf": vf["mlp_batches_per_s"]["ratio"],
        "mlp_goal_min": 0.90,
        "mlp_met": vf["mlp_batches_per_s"]["ratio"] >= 0.90,
        "nop_virtio_over_vf": vf["nop_median_us"]["ratio"],
        "nop_goal_max": 1.5,
        "nop_met": vf["nop_median_us"]["ratio"] <= 1.5,
    }
    return res


def table(res: dict[str, Any]) -> str:
    pfn = res["per_function"]
    L = [f"PF / VF / virtio-tacc, {res['rounds']} interleaved rounds, guest CLOCK_MONOTONIC "
         f"({res['kernel']}); median [95 % CI] of the per-round values"]

    paths = list(pfn)

    def row(label: str, metric: str, fmt: str = "{:.1f}") -> None:
        cells = []
        for k in paths:
            v = pfn[k][metric]
            cells.append(f"{fmt.format(v['median'])} [{fmt.format(v['ci95'][0])}-"
                         f"{fmt.format(v['ci95'][1])}]")
        rat = ""
        for name in ("virtio/vf", "virtio/virtio_rb0"):
            if name in res["ratios"]:
                r = res["ratios"][name][metric]
                rat += f"{r['ratio']:>9.2f} [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}]"
        L.append(f"{label:<26}" + "".join(f"{c:>24}" for c in cells) + rat)

    L.append(f"{'metric':<26}" + "".join(f"{k:>24}" for k in paths) + f"{'virtio/VF':>22}"
             + (f"{'virtio/rb0':>22}" if "virtio/virtio_rb0" in res["ratios"] else ""))
    row("NOP latency median us", "nop_median_us")
    row("NOP latency p99 us", "nop_p99_us")
    row("NOP jobs/s (64 in flight)", "jobs_per_s", "{:.0f}")
    row("GEMM 256^3 jobs/s (64 i.f.)", "gemm_jobs_per_s", "{:.0f}")
    for size in COPY_SIZES:
        for d in ("h2d", "d2h"):
            row(f"copy {d} {size >> 10} KiB MiB/s", f"copy_{d}_{size}_mib_s", "{:.0f}")
    row("mlp batches/s", "mlp_batches_per_s", "{:.2f}")
    L.append("")
    L.append("where the time goes (median over rounds, per job):")
    keys = sorted({x for k in paths for x in pfn[k]["where"]})
    L.append(f"{'':<30}" + "".join(f"{k:>12}" for k in paths))
    for x in keys:
        L.append(f"{x:<30}" + "".join(
            f"{pfn[k]['where'][x]:>12.2f}" if x in pfn[k]["where"] else f"{'-':>12}"
            for k in paths))
    g = res["goals"]
    L.append("")
    L.append(f"goals: virtio mlp / VF = {g['mlp_virtio_over_vf']:.2f} (goal >= 0.90: "
             f"{'met' if g['mlp_met'] else 'NOT met'}); virtio NOP latency / VF = "
             f"{g['nop_virtio_over_vf']:.2f} (goal <= 1.5: "
             f"{'met' if g['nop_met'] else 'NOT met'})")
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--iters", type=int, default=200, help="NOP latency jobs per round")
    ap.add_argument("--jobs", type=int, default=1000, help="NOP jobs for jobs/s per round")
    ap.add_argument("--copy-reps", type=int, default=5, help="copies per size per round")
    ap.add_argument("--batches", type=int, default=16, help="mlp batches per round")
    ap.add_argument("--quick", action="store_true", help="2 rounds, fewer jobs (a smoke run)")
    args = ap.parse_args(argv)
    if not os.environ.get("TACC_IN_VM"):
        print("vm_virt.py runs inside the test VM: `make bench BENCH=virt`", file=sys.stderr)
        return 2
    if args.quick:
        args.rounds, args.iters, args.jobs, args.copy_reps, args.batches = 2, 50, 200, 2, 4
    pf_sysfs()  # the PF is bound (raises with a clear message otherwise)
    res = run(args)
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
