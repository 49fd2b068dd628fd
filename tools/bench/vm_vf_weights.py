#!/usr/bin/env python3
"""Per-VF arbitration weights, run inside the test VM (`make bench BENCH=vf_weights`):
the victim's share of the link against its weight share.

For each weight pair (victim VF1 : neighbour VF2; default 1:1 and 1:3) the PF's policy
is set through sysfs (sriov_policy/vfN_weight, VFs disabled), two VFs are enabled and
two processes, one per VF, saturate the H2D link through the tacc runtime: each queues
``--rounds`` uploads of 4 MiB on each of 4 streams before the measurement starts, the
device's time stretched 50x (QOM time-scale) so the uploads outlast the host's time to
queue them. The link bytes of each VF (sysfs counters/h2d_link_bytes) are sampled once
both have queued everything and again once the victim moved about a quarter of its work;
the sample is valid only if neither VF had completed all its jobs by then (both
saturating the whole window). share = victim / (victim + neighbour) bytes; the figure is
its relative error against w_v / (w_v + w_n). The boot's VF count and policy are
restored at the end.

    tools/bench/vm_vf_weights.py [--json out.json] [--weights 1:1,1:3] [--rounds 12]

Prints a table; exits 1 if a pair's share is more than 10 % (relative) off.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/vm"))
sys.path.insert(0, str(ROOT / "userspace"))

from test_driver_basic import pf_sysfs, wait_accel_node  # noqa: E402

MiB = 1 << 20
CHUNK = 4 * MiB
LANES = 4


def cnt(pci: Path, name: str) -> int:
    return int((pci / "counters" / name).read_text())


def set_numvfs(pf: Path, n: int) -> list[Path]:
    (pf / "sriov_numvfs").write_text("0")
    if n:
        (pf / "sriov_numvfs").write_text(str(n))
    vfs = sorted(p.resolve() for p in pf.glob("virtfn*"))
    for vf in vfs:
        wait_accel_node(vf)
    return vfs


def worker(pci: str, rounds: int, conn) -> None:  # noqa: ANN001
    """Queue rounds x LANES uploads on this VF, report, wait for them, report."""
    from tacc.runtime import Context

    with Context(pci) as ctx:
        lanes = []
        for _ in range(LANES):
            h = ctx.host_buffer(CHUNK // 4)
            h.array[:] = 1.0
            lanes.append((ctx.stream(), h, ctx.device_buffer(CHUNK // 4)))
        for s, h, d in lanes:  # warm: pinned, mapped, TLB
            s.copy_h2d(d, h)
        ctx.synchronize()
        jobs0 = cnt(Path("/sys/bus/pci/devices") / pci, "jobs_completed")
        for _ in range(rounds):
            for s, h, d in lanes:
                s.copy_h2d(d, h)
        conn.send(("queued", jobs0, rounds * LANES))
        ctx.synchronize()
        conn.send(("done",))


def measure(pf: Path, wv: int, wn: int, rounds: int) -> dict:
    set_numvfs(pf, 0)
    (pf / "sriov_policy/vf1_weight").write_text(str(wv))
    (pf / "sriov_policy/vf2_weight").write_text(str(wn))
    victim, neighbour = set_numvfs(pf, 2)[:2]
    mpc = mp.get_context("fork")
    pipes, procs = [], []
    for vf in (victim, neighbour):
        a, b = mpc.Pipe()
        p = mpc.Process(target=worker, args=(vf.name, rounds, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    queued = [c.recv() for c in pipes]
    t0 = time.monotonic()
    a = [cnt(vf, "h2d_link_bytes") for vf in (victim, neighbour)]
    target = a[0] + rounds * LANES * CHUNK // 4
    while cnt(victim, "h2d_link_bytes") < target and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    b = [cnt(vf, "h2d_link_bytes") for vf in (victim, neighbour)]
    jobs = [cnt(vf, "jobs_completed") for vf in (victim, neighbour)]
    t1 = time.monotonic()
    valid = all(j - q[1] < q[2] for j, q in zip(jobs, queued, strict=True))
    for c in pipes:
        c.recv()
    for p in procs:
        p.join()
    dv, dn = b[0] - a[0], b[1] - a[1]
    share = dv / (dv + dn) if dv + dn else 0.0
    expect = wv / (wv + wn)
    return {"weights": f"{wv}:{wn}", "victim": victim.name, "neighbour": neighbour.name,
            "victim_link_bytes": dv, "neighbour_link_bytes": dn, "share": share,
            "weight_share": expect, "rel_err": abs(share - expect) / expect,
            "both_backlogged": valid, "window_s": t1 - t0,
            "victim_jobs_done": jobs[0] - queued[0][1], "jobs_queued": queued[0][2]}


def table(rows: list[dict]) -> str:
    L = ["victim VF1 : neighbour VF2, both saturating H2D (4 streams x 4 MiB uploads each)",
         f"{'weights':>8} {'victim MiB':>11} {'neighb. MiB':>12} {'share':>7} "
         f"{'weight sh.':>10} {'rel err':>8} {'valid':>6}"]
    for r in rows:
        L.append(f"{r['weights']:>8} {r['victim_link_bytes'] / MiB:11.1f} "
                 f"{r['neighbour_link_bytes'] / MiB:12.1f} {r['share']:7.3f} "
                 f"{r['weight_share']:10.3f} {100 * r['rel_err']:7.1f}% "
                 f"{'yes' if r['both_backlogged'] else 'NO':>6}")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--weights", default="1:1,1:3")
    ap.add_argument("--rounds", type=int, default=12, help="uploads per stream")
    ap.add_argument("--time-scale", type=int, default=50_000, help="device time-scale x 1000")
    args = ap.parse_args()
    if not os.environ.get("TACC_IN_VM"):
        print("vm_vf_weights.py runs inside the test VM: `make bench BENCH=vf_weights`",
              file=sys.stderr)
        return 2
    pf = pf_sysfs()
    if int((pf / "sriov_totalvfs").read_text()) < 2 or not (pf / "sriov_policy").is_dir():
        print("vm_vf_weights: no SR-IOV with per-VF policy on this PF", file=sys.stderr)
        return 2
    before = (pf / "sriov_numvfs").read_text().strip()
    saved = {f: (pf / "sriov_policy" / f).read_text().strip() for f in ("vf1_weight",
                                                                       "vf2_weight")}
    from tacc.guest_qmp import device_time_scale

    rows = []
    try:
        # device time x scale (QOM time-scale, as tests/vm/test_e2e_real.py does): the
        # uploads then outlast the host's time to queue them (TCG guest, ~0.25 ms a call)
        with device_time_scale(args.time_scale):
            for pair in args.weights.split(","):
                wv, wn = (int(x) for x in pair.split(":"))
                rows.append(measure(pf, wv, wn, args.rounds) | {"time_scale": args.time_scale})
    finally:
        set_numvfs(pf, 0)
        for f, v in saved.items():
            (pf / "sriov_policy" / f).write_text(v)
        if before != "0":
            set_numvfs(pf, int(before))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"kernel": os.uname().release, "rows": rows},
                                              indent=1) + "\n")
    return 0 if all(r["rel_err"] <= 0.10 and r["both_backlogged"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
