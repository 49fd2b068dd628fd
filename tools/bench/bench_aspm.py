#!/usr/bin/env python3
"""ASPM off / L0s / L1 side by side in one run (the tacc device model under qtest, the PF
behind a pcie-root-port, no guest): the first copy's latency after idle, steady
throughput, and link-state residency over an idle-then-burst duty cycle (the energy
proxy: share of time in L0s / L1), docs/hardware.md section 12.

    tools/bench/bench_aspm.py [--json out.json] [--idle-us 100] [--cycles 20]

JSON (``version`` 1): ``rows``: one per mode (``off``, ``l0s``, ``l1``): ``first_copy_ns``
(doorbell to CQE end of a 64 KiB COPY_H2D after ``idle_us`` of idle), ``exit_ns`` (the part
of it before the command started: the exit latency paid), ``steady_gbps`` (16 x 1 MiB
COPY_H2D in one job, payload / CQE time), ``duty``: over ``cycles`` x (idle + 64 KiB copy):
``l0_pct``, ``l0s_pct``, ``l1_pct`` residency, ``exits``, ``exit_ns`` paid, ``mean_copy_ns``;
``ratios``: each mode's first-copy latency and steady throughput over ``off``'s.  Modelled
time under qtest is exact, so one run suffices (no repeats).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "userspace"))

from tacc.testing.taccdev import DEVMEM_VA, HW, Tacc, d_copy  # noqa: E402

LNKCTL, ASPM = 0x10, {"off": 0, "l0s": 1, "l1": 2}
N, BIG = 64 << 10, 1 << 20
NAMES = ("L0S_EXITS", "L0S_TICKS", "L1_EXITS", "L1_TICKS", "EXIT_TICKS")


def set_aspm(d: Tacc, bits: int) -> None:
    """ASPM Control of both ends, in Linux's order (root port first when enabling L1)."""
    ends = [(0, Tacc.RP_DEVFN), (1, 0)]
    for bus, devfn in ends if bits & 2 else ends[::-1]:
        cap = d.qt.find_cap(bus, devfn, 0x10)
        v = d.qt.cfg_read(bus, devfn, cap + LNKCTL, 2)
        d.qt.cfg_write(bus, devfn, cap + LNKCTL, (v & ~3) | bits, 2)


def lpm(pf) -> dict[str, int]:
    return {n.lower(): pf.r64(getattr(HW, "TACC_REG_LINKPM_" + n)) for n in NAMES}


def copy_at(d: Tacc, pf, src: int, n: int, count: int = 1) -> tuple[int, object]:
    """Submit a job of ``count`` COPY_H2D of ``n`` bytes now: (doorbell time, CQE)."""
    _, ds = pf.job_of(0, [d_copy(HW.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)] * count)
    t0 = d.qt.clock()
    pf.submit(0, ds)
    step, cqs = max(200, n * count // 32000), []  # ~1/10 of the copy's time per step
    while not cqs:
        d.qt.clock_step(step)
        cqs = pf.cqes(0)
    (cq,) = cqs
    assert cq.status == HW.TACC_ST_OK
    return t0, cq


def mode_row(d: Tacc, pf, src: int, mode: str, idle_ns: int, cycles: int) -> dict:
    set_aspm(d, ASPM[mode])
    copy_at(d, pf, src, BIG, 16)  # warm the TLB
    d.qt.clock_step(idle_ns)
    t0, cq = copy_at(d, pf, src, N)
    first, exit_ns = cq.end - t0, cq.start - t0
    _, big = copy_at(d, pf, src, BIG, 16)
    steady = 16 * BIG / (big.end - big.start)
    b, c0, lat = lpm(pf), d.qt.clock(), []
    for _ in range(cycles):
        d.qt.clock_step(idle_ns)
        t0, cq = copy_at(d, pf, src, N)
        lat.append(cq.end - t0)
    a, span = lpm(pf), d.qt.clock() - c0
    dl = {k: a[k] - b[k] for k in a}
    l0s, l1 = 100 * dl["l0s_ticks"] / span, 100 * dl["l1_ticks"] / span
    return {"mode": mode, "first_copy_ns": first, "exit_ns": exit_ns, "steady_gbps": steady,
            "duty": {"l0_pct": 100 - l0s - l1, "l0s_pct": l0s, "l1_pct": l1,
                     "exits": dl["l0s_exits"] + dl["l1_exits"], "exit_ns": dl["exit_ticks"],
                     "mean_copy_ns": sum(lat) / len(lat), "span_ns": span}}


def run(idle_us: int, cycles: int) -> dict:
    d = Tacc("sriov-max-vfs=0", root_port="")
    try:
        root = d.map_default()
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, root)
        src = d.alloc(BIG)
        rows = [mode_row(d, pf, src, m, idle_us * 1000, cycles) for m in ASPM]
    finally:
        d.close()
    off = rows[0]
    ratios = {r["mode"]: {"first_copy": r["first_copy_ns"] / off["first_copy_ns"],
                          "steady": r["steady_gbps"] / off["steady_gbps"]} for r in rows}
    return {"version": 1, "idle_us": idle_us, "cycles": cycles, "copy_bytes": N,
            "rows": rows, "ratios": ratios}


def table(res: dict) -> str:
    out = [f"ASPM (PF behind a root port; {res['cycles']} x ({res['idle_us']} us idle + "
           f"{res['copy_bytes'] >> 10} KiB COPY_H2D); modelled time, exact)",
           f"{'mode':>5} {'1st copy ns':>11} {'exit ns':>8} {'x off':>6} {'steady GB/s':>11} "
           f"{'L0 %':>6} {'L0s %':>6} {'L1 %':>6} {'exits':>6}"]
    for r in res["rows"]:
        u = r["duty"]
        out.append(f"{r['mode']:>5} {r['first_copy_ns']:>11} {r['exit_ns']:>8} "
                   f"{res['ratios'][r['mode']]['first_copy']:>6.3f} {r['steady_gbps']:>11.2f} "
                   f"{u['l0_pct']:>6.1f} {u['l0s_pct']:>6.1f} {u['l1_pct']:>6.1f} "
                   f"{u['exits']:>6}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: tools/bench/bench_aspm.py --json "
                                 "build/bench/aspm.json --idle-us 50",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--idle-us", type=int, default=100, help="idle before each copy (100)")
    ap.add_argument("--cycles", type=int, default=20, help="idle-then-copy cycles (20)")
    a = ap.parse_args()
    if a.idle_us < 1 or a.cycles < 1:
        print("bench_aspm: --idle-us and --cycles must be >= 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    res = run(a.idle_us, a.cycles)
    res["wall_s"] = round(time.monotonic() - t0, 2)
    print(table(res))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
