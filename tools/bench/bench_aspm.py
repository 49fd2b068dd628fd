#!/usr/bin/env python3
"""ASPM off / L0s / L1 / L1.1 / L1.2 side by side in one run (the tacc device model under
qtest, the PF behind a pcie-root-port, no guest): the first copy's latency after idle,
steady throughput, and link-state residency over an idle-then-burst duty cycle (the
energy proxy: share of time in L0s / L1 / its substates), docs/hardware.md section 12.

    tools/bench/bench_aspm.py [--json out.json] [--idle-us 100] [--cycles 20]

JSON (``version`` 2): ``rows``: one per mode (``off``, ``l0s``, ``l1``, ``l1.1``, ``l1.2``:
L1 with ASPM L1.1 only, or L1.1 + L1.2 with LTR, programmed as Linux's
aspm_calc_l12_info does from both ends' L1 PM Substates capabilities): ``first_copy_ns``
(doorbell to CQE end of a 64 KiB COPY_H2D after ``idle_us`` of idle), ``exit_ns`` (the part
of it before the command started: the exit latency paid), ``steady_gbps`` (16 x 1 MiB
COPY_H2D in one job, payload / CQE time), ``duty``: over ``cycles`` x (idle + 64 KiB copy):
``l0_pct``, ``l0s_pct``, ``l1_pct`` residency (``l11_pct``, ``l12_pct``: the parts of L1
in L1.1, L1.2; version 2), ``exits``, ``exit_ns`` paid, ``mean_copy_ns``;
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

from tacc import hw
from tacc.hw.records import d_copy
from tacc.testing.taccdev import DEVMEM_VA, Tacc  # noqa: E402

LNKCTL, DEVCTL2, LTR_EN = 0x10, 0x28, 0x400
L1SS_ID, L1SS_CAP, L1SS_CTL1, L1SS_CTL2 = 0x1E, 0x04, 0x08, 0x0C
ASPM_L11, ASPM_L12 = 8, 4  # L1SS Control 1 enables
# mode: (ASPM Control, L1 PM Substates Control 1 enables)
ASPM = {"off": (0, 0), "l0s": (1, 0), "l1": (2, 0), "l1.1": (2, ASPM_L11),
        "l1.2": (2, ASPM_L11 | ASPM_L12)}
N, BIG = 64 << 10, 1 << 20
NAMES = ("L0S_EXITS", "L0S_TICKS", "L1_EXITS", "L1_TICKS", "EXIT_TICKS", "L11_TICKS",
         "L12_TICKS")
ENDS = [(0, Tacc.RP_DEVFN), (1, 0)]  # the root port (upstream end), the PF


def l12_timing(d: Tacc) -> tuple[int, int, int]:
    """(Control 1 timing of the root port, of the PF, Control 2) as Linux's
    aspm_calc_l12_info computes them from both ends' L1SS Capabilities: the larger
    Common_Mode_Restore_Time (root port only) and T_POWER_ON, LTR_L1.2_THRESHOLD =
    2 + 4 + both us, rounded up in the smallest scale that holds it."""
    caps = [d.qt.cfg_read(b, f, d.qt.find_ext_cap(b, f, L1SS_ID) + L1SS_CAP) for b, f in ENDS]
    cmrt = max((c >> 8) & 0xFF for c in caps)
    tpon = max(((c >> 19) & 0x1F) * (2, 10, 100, 0)[(c >> 16) & 3] for c in caps)
    tp = max(caps, key=lambda c: ((c >> 19) & 0x1F) * (2, 10, 100, 0)[(c >> 16) & 3])
    ns, scale = (2 + 4 + cmrt + tpon) * 1000, 0
    while -(-ns // 32**scale) > 0x3FF:
        scale += 1
    th = (-(-ns // 32**scale)) << 16 | scale << 29
    return th | cmrt << 8, th, ((tp >> 16) & 3) | ((tp >> 19) & 0x1F) << 3


def set_l1ss(d: Tacc, enables: int) -> None:
    """LTR enable (root port first) and L1 PM Substates on both ends, in Linux's order:
    enables cleared child first, timing programmed, enables set parent first."""
    for bus, devfn in ENDS:
        cap = d.qt.find_cap(bus, devfn, 0x10)
        v = d.qt.cfg_read(bus, devfn, cap + DEVCTL2, 2)
        d.qt.cfg_write(bus, devfn, cap + DEVCTL2, v | LTR_EN if enables else v & ~LTR_EN, 2)
    ss = [d.qt.find_ext_cap(b, f, L1SS_ID) for b, f in ENDS]
    for (bus, devfn), s in reversed(list(zip(ENDS, ss, strict=True))):
        d.qt.cfg_write(bus, devfn, s + L1SS_CTL1, 0)
    rp1, pf1, ctl2 = l12_timing(d)
    for (bus, devfn), s, ctl1 in zip(ENDS, ss, (rp1, pf1), strict=True):
        d.qt.cfg_write(bus, devfn, s + L1SS_CTL2, ctl2)
        d.qt.cfg_write(bus, devfn, s + L1SS_CTL1, ctl1 | enables)


def set_aspm(d: Tacc, bits: int) -> None:
    """ASPM Control of both ends, in Linux's order (root port first when enabling L1)."""
    for bus, devfn in ENDS if bits & 2 else ENDS[::-1]:
        cap = d.qt.find_cap(bus, devfn, 0x10)
        v = d.qt.cfg_read(bus, devfn, cap + LNKCTL, 2)
        d.qt.cfg_write(bus, devfn, cap + LNKCTL, (v & ~3) | bits, 2)


def lpm(pf) -> dict[str, int]:
    return {n.lower(): pf.r64(getattr(hw, "TACC_REG_LINKPM_" + n)) for n in NAMES}


def copy_at(d: Tacc, pf, src: int, n: int, count: int = 1) -> tuple[int, object]:
    """Submit a job of ``count`` COPY_H2D of ``n`` bytes now: (doorbell time, CQE)."""
    _, ds = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)] * count)
    t0 = d.qt.clock()
    pf.submit(0, ds)
    step, cqs = max(200, n * count // 32000), []  # ~1/10 of the copy's time per step
    while not cqs:
        d.qt.clock_step(step)
        cqs = pf.cqes(0)
    (cq,) = cqs
    assert cq.status == hw.TACC_ST_OK
    return t0, cq


def mode_row(d: Tacc, pf, src: int, mode: str, idle_ns: int, cycles: int) -> dict:
    set_aspm(d, 0)  # L1 off while the substates change (pcie_config_aspm_link)
    set_l1ss(d, ASPM[mode][1])
    set_aspm(d, ASPM[mode][0])
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
                     "l11_pct": 100 * dl["l11_ticks"] / span,
                     "l12_pct": 100 * dl["l12_ticks"] / span,
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
    return {"version": 2, "idle_us": idle_us, "cycles": cycles, "copy_bytes": N,
            "rows": rows, "ratios": ratios}


def table(res: dict) -> str:
    out = [f"ASPM (PF behind a root port; {res['cycles']} x ({res['idle_us']} us idle + "
           f"{res['copy_bytes'] >> 10} KiB COPY_H2D); modelled time, exact)",
           f"{'mode':>5} {'1st copy ns':>11} {'exit ns':>8} {'x off':>6} {'steady GB/s':>11} "
           f"{'L0 %':>6} {'L0s %':>6} {'L1 %':>6} {'L1.1 %':>6} {'L1.2 %':>6} {'exits':>6}"]
    for r in res["rows"]:
        u = r["duty"]
        out.append(f"{r['mode']:>5} {r['first_copy_ns']:>11} {r['exit_ns']:>8} "
                   f"{res['ratios'][r['mode']]['first_copy']:>6.3f} {r['steady_gbps']:>11.2f} "
                   f"{u['l0_pct']:>6.1f} {u['l0s_pct']:>6.1f} {u['l1_pct']:>6.1f} "
                   f"{u['l11_pct']:>6.1f} {u['l12_pct']:>6.1f} {u['exits']:>6}")
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
