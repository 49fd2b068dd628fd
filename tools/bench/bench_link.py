#!/usr/bin/env python3
"""Sweep copy sizes 64 B .. 64 MiB through the tacc device model (qtest, no
guest) and compare the bandwidth the device reports (payload counters / CQE
timestamps) with the PCIe link formula of docs/hardware.md, then the model's
error against measured real hardware (the reference table of issue 19).

    tools/bench/bench_link.py [--json out.json] [--props link-gen=5,...] [--max 64M]
    tools/bench/bench_link.py --no-reference --props rcb=128     # the curve only

Prints two tables; exits 1 if any size deviates from the formula by more than 1 %.

JSON (``version`` 2; h18's report plots ``rows``): ``rows``: one per (size, dir):
``size`` bytes, ``dir`` "h2d"/"d2h", ``bw_gbps`` (device: payload / CQE time),
``formula_gbps`` (tacc.testing.taccdev.LinkModel.formula_bw), ``err_pct``, ``ticks``,
``payload_bytes``, ``link_bytes``, ``tlps``, ``link_efficiency`` (payload / link bytes);
``model``: the link parameters; ``reference``: one per reference row: ``link``,
``dir``, ``real_gbps``, ``source``, ``points`` [{``size``, ``model_gbps``, ``err_pct``}]
(device-measured, sizes >= 1 MiB), ``worst_err_pct``.
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
from tacc.testing.taccdev import DEVMEM_VA, LinkModel, Tacc  # noqa: E402


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


# Measured on real hardware, large pinned transfers (issue 19's reference table)
REFERENCE = [
    {"link": "Gen4 x16", "gen": 4, "width": 16, "dir": "h2d", "real_gbps": 25.13,
     "source": "A100, nvbandwidth host_to_device_memcpy_sm, 512 MiB-1 GiB (NVIDIA/nvbandwidth#42)"},
    {"link": "Gen3 x16", "gen": 3, "width": 16, "dir": "h2d", "real_gbps": 12.15,
     "source": "P100, CUDA bandwidthTest, pinned, 32 MiB (mpicbg-scicomp/gearshifft#82)"},
    {"link": "Gen3 x16", "gen": 3, "width": 16, "dir": "d2h", "real_gbps": 12.89,
     "source": "P100, CUDA bandwidthTest, pinned, 32 MiB (mpicbg-scicomp/gearshifft#82)"},
    # the same row with 128-byte write TLPs: the MPS that explains the P100 host's D2H
    # (docs/hardware.md section 9, "Against real hardware"; the post gives no lspci)
    {"link": "Gen3 x16 MPS 128", "gen": 3, "width": 16, "dir": "d2h", "real_gbps": 12.89,
     "props": "mps=128",
     "source": "P100, CUDA bandwidthTest, pinned, 32 MiB (mpicbg-scicomp/gearshifft#82)"},
]


def props_dict(props: str) -> dict[str, int]:
    out = {}
    for kv in filter(None, props.split(",")):
        k, v = kv.split("=")
        if v.isdigit():
            out[k] = int(v)
    return out


def link_model(props: str) -> LinkModel:
    p = props_dict(props)
    return LinkModel(gen=p.get("link-gen", 4), width=p.get("link-width", 16),
                     mps=p.get("mps", 256), mrrs=p.get("mrrs", 512), rcb=p.get("rcb", 64),
                     tags=p.get("tags", 32), posted_credits=p.get("posted-credits", 1024),
                     posted_hdr_credits=p.get("posted-hdr-credits", 64),
                     cmd_ns=p.get("cmd-latency-ns", 100), rd_ns=p.get("read-latency-ns", 600),
                     wr_ns=p.get("write-latency-ns", 200))


def run(props: str, max_size: int, min_size: int = 64, dirs=(True, False)) -> dict:
    lm = link_model(props)
    dev = Tacc(",".join(filter(None, ["sriov-max-vfs=0", props])))
    rows = []
    try:
        root = dev.map_default()
        pf = dev.pf
        pf.reset()
        pf.set_ptbr(0, root)
        host = dev.alloc(max_size)
        n = min_size
        while n <= max_size:
            for h2d in dirs:
                op = hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H
                src, dst = (host, DEVMEM_VA) if h2d else (DEVMEM_VA, host)
                pf.run_job(0, [d_copy(op, src, dst, n)])  # warm the TLB
                c0 = pf.counters()
                lb0 = pf.gcnt("link_h2d_busy_ticks" if h2d else "link_d2h_busy_ticks")
                cq = pf.run_job(0, [d_copy(op, src, dst, n)], step=10**10)
                c1 = pf.counters()
                lb1 = pf.gcnt("link_h2d_busy_ticks" if h2d else "link_d2h_busy_ticks")
                d = {k: c1[k] - c0[k] for k in c1}
                ticks = cq.end - cq.start
                payload = d["h2d_bytes" if h2d else "d2h_bytes"]
                link = d["h2d_link_bytes" if h2d else "d2h_link_bytes"]
                bw = payload / (ticks * 1e-9)
                fbw = lm.formula_bw(n, h2d)
                rows.append({
                    "size": n, "dir": "h2d" if h2d else "d2h", "status": cq.status,
                    "ticks": ticks, "payload_bytes": payload, "link_bytes": link,
                    "tlps": d["h2d_tlps" if h2d else "d2h_tlps"],
                    "walks": d["tlb_walk_reads"], "link_busy_ticks": lb1 - lb0,
                    "bw_gbps": bw / 1e9, "formula_gbps": fbw / 1e9,
                    "err_pct": 100 * (bw - fbw) / fbw,
                    "link_efficiency": payload / link if link else 0.0,
                })
            n *= 2
    finally:
        dev.close()
    return {"version": 2, "props": props or "defaults", "link_peak_gbps": lm.bw / 1e9,
            "model": {"gen": lm.gen, "width": lm.width, "mps": lm.mps, "mrrs": lm.mrrs,
                      "rcb": lm.rcb, "tags": lm.tags, "posted_credits": lm.posted_credits,
                      "posted_hdr_credits": lm.posted_hdr_credits,
                      "cmd_ns": lm.cmd_ns, "read_ns": lm.rd_ns, "write_ns": lm.wr_ns},
            "rows": rows}


def reference(props: str, max_size: int) -> list[dict]:
    """The device's bandwidth (1 MiB .. max_size) against each reference row."""
    out = []
    for ref in REFERENCE:
        extra = f"link-gen={ref['gen']},link-width={ref['width']}"
        extra = ",".join(filter(None, [extra, ref.get("props", "")]))
        res = run(",".join(filter(None, [props, extra])), max_size, 1 << 20,
                  (ref["dir"] == "h2d",))
        pts = [{"size": r["size"], "model_gbps": r["bw_gbps"],
                "err_pct": 100 * (r["bw_gbps"] - ref["real_gbps"]) / ref["real_gbps"]}
               for r in res["rows"]]
        out.append({k: v for k, v in ref.items() if k not in ("gen", "width", "props")}
                   | {"points": pts, "worst_err_pct": max((p["err_pct"] for p in pts), key=abs)})
    return out


def ref_table(refs: list[dict]) -> str:
    out = ["model vs real hardware (device-measured, transfers >= 1 MiB; goal within 10 %)",
           f"{'link':>16} {'dir':>4} {'real':>7} {'1 MiB':>7} {'largest':>8} {'worst err %':>11}"]
    for r in refs:
        p = r["points"]
        out.append(f"{r['link']:>16} {r['dir']:>4} {r['real_gbps']:>7.2f} "
                   f"{p[0]['model_gbps']:>7.2f} {p[-1]['model_gbps']:>8.2f} "
                   f"{r['worst_err_pct']:>+11.1f}")
    return "\n".join(out)


def human(n: int) -> str:
    for unit, sh in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << sh:
            return f"{n >> sh} {unit}"
    return f"{n} B"


def table(res: dict) -> str:
    out = [f"tacc link sweep ({res['props']}; peak {res['link_peak_gbps']:.2f} GB/s per direction)",
           f"{'size':>8} {'dir':>4} {'ticks':>10} {'TLPs':>7} {'GB/s':>8} {'formula':>8} "
           f"{'err %':>7} {'eff':>5}"]
    for r in res["rows"]:
        out.append(f"{human(r['size']):>8} {r['dir']:>4} {r['ticks']:>10} {r['tlps']:>7} "
                   f"{r['bw_gbps']:>8.3f} {r['formula_gbps']:>8.3f} {r['err_pct']:>7.3f} "
                   f"{r['link_efficiency']:>5.3f}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--props", default="", help="extra -device tacc properties")
    ap.add_argument("--max", default="64M", help="largest size (default 64M)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the comparison with the real-hardware reference table")
    a = ap.parse_args()
    t0 = time.monotonic()
    res = run(a.props, parse_size(a.max))
    if not a.no_reference:
        res["reference"] = reference(a.props, parse_size(a.max))
    res["wall_s"] = round(time.monotonic() - t0, 2)
    print(table(res))
    if "reference" in res:
        print(ref_table(res["reference"]))
    worst = max(abs(r["err_pct"]) for r in res["rows"])
    bad = [r for r in res["rows"] if r["status"] != 0]
    print(f"worst deviation from the formula: {worst:.3f} % ({res['wall_s']} s wall)")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 1 if worst > 1.0 or bad else 0


if __name__ == "__main__":
    sys.exit(main())
