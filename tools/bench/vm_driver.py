#!/usr/bin/env python3
"""tacc.ko benchmark, run inside the test VM (`make bench BENCH=driver`):

- submit-to-completion latency of a one-NOP job (SUBMIT + WAIT, guest clock);
- jobs per second: one-NOP jobs kept in flight on one queue, and on all queues;
- DMA map cost per MiB in every IOMMU domain type of one boot: the PF is
  unbound, its IOMMU group switched (DMA = strict, DMA-FQ = lazy,
  identity = pt) through /sys/kernel/iommu_groups/N/type, and the PF bound
  again; then userptr BOs (pin + dma_map_sgtable) are created and freed
  (dma_unmap_sgtable + unpin) and timed per MiB.  Pinning costs the same in
  every mode, so the ratios strict/pt (and lazy/pt) and the difference
  strict - pt are the IOMMU's mapping cost.  Where ftrace's function_graph
  tracer is available, dma_map_sgtable/dma_unmap_sgtable are also timed
  alone.

    tools/bench/vm_driver.py [--json out.json] [--iters N] [--map-mib 1,16,64]

Prints a table; exits 0 unless the device cannot be used at all.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/vm"))
sys.path.insert(0, str(ROOT / "userspace"))

from test_driver_basic import (  # noqa: E402
    BO_NO_BIND,
    USERPTR,
    Dev,
    UserBuf,
    nop,
    pf_sysfs,
)

DRV = Path("/sys/bus/pci/drivers/tacc")
TRACING = Path("/sys/kernel/tracing")
MODES = [("strict", "DMA"), ("lazy", "DMA-FQ"), ("pt", "identity")]


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def accel_node(pci: Path, timeout: float = 20.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = sorted((pci / "accel").glob("accel*")) if (pci / "accel").exists() else []
        if nodes and Path("/dev/accel", nodes[0].name).exists():
            return Path("/dev/accel", nodes[0].name)
        time.sleep(0.05)
    raise TimeoutError(f"{pci.name}: no accel node")


# ----------------------------------------------------------------- submit ----
def nop_latency(node: Path, iters: int) -> dict:
    with Dev(node) as d:
        for _ in range(20):
            d.run([nop()])  # warm: runtime-PM resume, scheduler threads
        lat = []
        for i in range(iters):
            t = now()
            assert d.run([nop(tag=i)]) == 0
            lat.append((now() - t) * 1e6)
    return {"iters": iters, "median_us": statistics.median(lat), "p10_us": pct(lat, 10),
            "p90_us": pct(lat, 90), "p99_us": pct(lat, 99), "min_us": min(lat),
            "samples_us": [round(x, 3) for x in lat]}  # report.py's histogram


def jobs_per_second(node: Path, jobs: int, queues: int, depth: int = 64) -> dict:
    with Dev(node) as d:
        d.run([nop()])
        pending: list[tuple[int, int]] = []
        t = now()
        for i in range(jobs):
            q = i % queues
            while True:
                try:
                    pending.append((q, d.submit([nop(tag=i)], queue=q)))
                    break
                except OSError as e:
                    if e.errno != errno.EAGAIN:
                        raise
                    d.wait(pending.pop(0)[1])
            if len(pending) >= depth * queues:
                assert d.wait(pending.pop(0)[1]) == 0
        for _, s in pending:
            assert d.wait(s) == 0
        el = now() - t
    return {"jobs": jobs, "queues": queues, "depth": depth, "seconds": el,
            "jobs_per_s": jobs / el, "us_per_job": el / jobs * 1e6}


# ---------------------------------------------------------------- DMA map ----
class GraphTimer:
    """function_graph durations of dma_map_sgtable / dma_unmap_sgtable."""

    FUNCS = ("dma_map_sgtable", "dma_unmap_sgtable")

    def __init__(self) -> None:
        self.ok = False
        try:
            if "function_graph" not in (TRACING / "available_tracers").read_text():
                return
            (TRACING / "tracing_on").write_text("0")
            (TRACING / "current_tracer").write_text("nop")
            (TRACING / "set_graph_function").write_text(" ".join(self.FUNCS))
            (TRACING / "max_graph_depth").write_text("1")
            self.ok = True
        except OSError:
            self.ok = False

    def start(self) -> None:
        if self.ok:
            (TRACING / "trace").write_text("")
            (TRACING / "current_tracer").write_text("function_graph")
            (TRACING / "tracing_on").write_text("1")

    def stop(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {f: [] for f in self.FUNCS}
        if not self.ok:
            return out
        (TRACING / "tracing_on").write_text("0")
        for ln in (TRACING / "trace").read_text().splitlines():
            # " 0)  + 12.345 us   |  dma_map_sgtable();"
            for f in self.FUNCS:
                if f + "()" in ln and " us " in ln:
                    num = ln.split("|")[0].split(")")[-1].strip(" +!#*@$").split()[0]
                    try:
                        out[f].append(float(num))
                    except ValueError:
                        pass
        (TRACING / "current_tracer").write_text("nop")
        return out

    def close(self) -> None:
        if self.ok:
            for f, v in (("tracing_on", "0"), ("current_tracer", "nop"),
                         ("set_graph_function", "")):
                try:
                    (TRACING / f).write_text(v)
                except OSError:
                    pass


def map_cost(node: Path, sizes_mib: list[int], reps: int, graph: GraphTimer) -> dict:
    res = {}
    with Dev(node) as d:
        for mib in sizes_mib:
            ub = UserBuf(mib << 20)
            ub.mm.write(b"\1" * ub.size)  # fault every page in: time pin + map only
            d.gem_close(d.bo(ub.size, USERPTR, flags=BO_NO_BIND, userptr=ub.addr).handle)
            create, free = [], []
            graph.start()
            for _ in range(reps):
                t = now()
                h = d.bo(ub.size, USERPTR, flags=BO_NO_BIND, userptr=ub.addr).handle
                t1 = now()
                d.gem_close(h)
                t2 = now()
                create.append((t1 - t) * 1e6 / mib)
                free.append((t2 - t1) * 1e6 / mib)
            g = graph.stop()
            ub.mm.close()
            row = {"create_us_per_mib": statistics.median(create),
                   "free_us_per_mib": statistics.median(free), "reps": reps}
            if g["dma_map_sgtable"]:
                row["dma_map_us_per_mib"] = statistics.median(g["dma_map_sgtable"]) / mib
            if g["dma_unmap_sgtable"]:
                row["dma_unmap_us_per_mib"] = statistics.median(g["dma_unmap_sgtable"]) / mib
            res[str(mib)] = row
    return res


def set_domain(pci: Path, typ: str) -> Path:
    """Unbind the PF, switch its IOMMU group's domain type, bind it again."""
    grp = (pci / "iommu_group").resolve()
    members = [p.name for p in (grp / "devices").iterdir()]
    if members != [pci.name]:
        raise RuntimeError(f"IOMMU group {grp.name} holds {members}: cannot switch alone")
    if (pci / "driver").exists():
        (DRV / "unbind").write_text(pci.name)
    try:
        (grp / "type").write_text(typ)
    finally:
        (DRV / "bind").write_text(pci.name)
    got = (grp / "type").read_text().strip()
    if got != typ:
        raise RuntimeError(f"group {grp.name}: type {got}, wanted {typ}")
    return accel_node(pci)


def iommu_sweep(pci: Path, sizes: list[int], reps: int) -> dict:
    grp = pci / "iommu_group"
    if not grp.exists():
        return {"skipped": "no IOMMU (IOMMU=off)"}
    if int((pci / "sriov_numvfs").read_text() or 0):
        return {"skipped": "VFs enabled: the PF cannot be unbound"}
    orig = (grp / "type").read_text().strip()
    graph = GraphTimer()
    out: dict = {"boot_type": orig, "ftrace_function_graph": graph.ok, "modes": {}}
    try:
        for name, typ in MODES:
            try:
                node = set_domain(pci, typ)
            except (OSError, RuntimeError) as e:
                out["modes"][name] = {"error": str(e)}
                continue
            out["modes"][name] = {"type": typ, "sizes": map_cost(node, sizes, reps, graph)}
    finally:
        graph.close()
        try:
            set_domain(pci, orig)
        except (OSError, RuntimeError) as e:
            out["restore_error"] = str(e)
    modes = out["modes"]
    if "sizes" in modes.get("pt", {}):
        ratios = {}
        for name in ("strict", "lazy"):
            if "sizes" not in modes.get(name, {}):
                continue
            for mib, row in modes[name]["sizes"].items():
                base = modes["pt"]["sizes"][mib]
                r = ratios.setdefault(f"{name}/pt {mib} MiB", {})
                for k in ("create_us_per_mib", "free_us_per_mib", "dma_map_us_per_mib",
                          "dma_unmap_us_per_mib"):
                    if k in row and k in base and base[k] > 0:
                        r[k] = row[k] / base[k]
                        r[k.replace("_us_per_mib", "_extra_us_per_mib")] = row[k] - base[k]
        out["ratios"] = ratios
    return out


# ------------------------------------------------------------------- table ----
def table(res: dict) -> str:
    L = [f"tacc.ko driver benchmark ({res['kernel']}, boot IOMMU {res['iommu_boot']}, "
         f"guest CLOCK_MONOTONIC)"]
    n = res["nop_latency"]
    L.append(f"NOP submit->completion: median {n['median_us']:.1f} us, p10 {n['p10_us']:.1f}, "
             f"p90 {n['p90_us']:.1f}, p99 {n['p99_us']:.1f}, min {n['min_us']:.1f} "
             f"({n['iters']} jobs)")
    for j in res["throughput"]:
        L.append(f"jobs/s, {j['queues']} queue(s), {j['depth']} in flight per queue: "
                 f"{j['jobs_per_s']:.0f} jobs/s ({j['us_per_job']:.1f} us/job, {j['jobs']} jobs)")
    io = res["iommu"]
    if "skipped" in io:
        L.append(f"DMA map cost: skipped ({io['skipped']})")
        return "\n".join(L)
    L.append("")
    L.append("DMA map cost per MiB, userptr BO (pin + dma_map_sgtable / dma_unmap_sgtable + unpin)")
    hdr = f"{'mode':8} {'group type':10} {'MiB':>4} {'create us/MiB':>14} {'free us/MiB':>12}"
    hdr += f" {'map us/MiB':>11} {'unmap us/MiB':>13}"
    L.append(hdr)
    for name, m in io["modes"].items():
        if "error" in m:
            L.append(f"{name:8} error: {m['error']}")
            continue
        for mib, r in m["sizes"].items():
            mp = r.get("dma_map_us_per_mib")
            um = r.get("dma_unmap_us_per_mib")
            L.append(f"{name:8} {m['type']:10} {mib:>4} {r['create_us_per_mib']:>14.1f} "
                     f"{r['free_us_per_mib']:>12.1f} "
                     f"{'-' if mp is None else f'{mp:.1f}':>11} "
                     f"{'-' if um is None else f'{um:.1f}':>13}")
    if io.get("ratios"):
        L.append("")
        L.append(f"{'ratio':18} {'create':>8} {'free':>8} {'map':>8} {'unmap':>8}"
                 f" {'map extra us/MiB':>17}")
        for k, r in io["ratios"].items():
            def f(x):
                return "-" if x is None else f"{x:.2f}"
            extra = r.get("dma_map_extra_us_per_mib", r.get("create_extra_us_per_mib"))
            L.append(f"{k:18} {f(r.get('create_us_per_mib')):>8} {f(r.get('free_us_per_mib')):>8} "
                     f"{f(r.get('dma_map_us_per_mib')):>8} {f(r.get('dma_unmap_us_per_mib')):>8} "
                     f"{f(extra):>17}")
    if io.get("restore_error"):
        L.append(f"restoring the boot domain failed: {io['restore_error']}")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=500, help="NOP latency samples")
    ap.add_argument("--jobs", type=int, default=2000, help="jobs for jobs/s")
    ap.add_argument("--map-mib", default="1,16,64", help="userptr sizes, MiB")
    ap.add_argument("--reps", type=int, default=5, help="create/free repetitions per size")
    args = ap.parse_args()
    if not os.environ.get("TACC_IN_VM"):
        print("vm_driver.py runs inside the test VM: `make bench BENCH=driver`", file=sys.stderr)
        return 2
    pci = pf_sysfs()
    grp = pci / "iommu_group"
    res = {"kernel": os.uname().release,
           "iommu_boot": (grp / "type").read_text().strip() if grp.exists() else "none"}
    node = accel_node(pci)
    res["nop_latency"] = nop_latency(node, args.iters)
    res["throughput"] = [jobs_per_second(node, args.jobs, 1),
                         jobs_per_second(node, args.jobs, 4)]
    sizes = [int(x) for x in args.map_mib.split(",") if x]
    res["iommu"] = iommu_sweep(pci, sizes, args.reps)
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
