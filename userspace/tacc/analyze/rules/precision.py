"""fp32 GEMM operands on a device that runs bf16 GEMMs (docs/analysis.md "precision"):
weights stored in bf16 move half the bytes (and run at the bf16 peak)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc import hw
from tacc.analyze import roofline
from tacc.analyze.data import Cmds, Data
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import range_names
from tacc.capture.schema import Opcode

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


SUGGESTION = ("store the GEMM weights in bf16 (tacc run decode --dtype bf16: the activations "
              "cast to bf16 in front, the output kept fp32); check the outputs against the "
              "fp32 reference within the stated bound")


PAGE = 4096  # the device's small page: tensors under 2 MiB are mapped with it


@dataclass
class PrecisionThresholds:
    # time saved / the device time of the function's roofline commands
    precision_min_share: float = 0.05


def weight_gemms(c: Cmds) -> np.ndarray:
    """fp32 GEMMs but those over a KV cache: a listed GEMM whose FLOPs or bytes differ
    between launches of its list (the same list id and index: attention over a cache that
    grows by a token each step) reads activations, not weights, and stays fp32."""
    g = np.flatnonzero((c.opcode == Opcode.GEMM) & (c.dtype == hw.TACC_DT_FP32))
    sigs: dict[tuple[int, int], set[tuple[int, int, int]]] = {}
    for i in g.tolist():
        if c.list_id[i]:
            sigs.setdefault((int(c.list_id[i]), int(c.index[i])), set()).add(
                (int(c.flops[i]), int(c.rd[i]), int(c.wr[i])))
    return np.array([i for i in g.tolist() if not c.list_id[i]
                     or len(sigs[(int(c.list_id[i]), int(c.index[i]))]) == 1], np.int64)


def precision(d: Data, th: Thresholds) -> list[Finding]:
    """fp32 weight GEMMs (:func:`weight_gemms`) on a function reporting a bf16 peak.  Time
    saved per GEMM, from tacc.model: its fp32 time less the bf16 GEMM's (A and B in bf16:
    the bytes read halved but a bias's, the output as before, at the bf16 peak), plus the
    page walks of the bytes gone (its TLB misses in proportion, each the model's walk
    latency x the capture's PTE reads per miss), less the cast of its activations to
    bf16 in front of it (one more command: its modelled time and the walks of its pages
    at the capture's TLB misses per page); a GEMM that would not gain is left fp32."""
    out = []
    for f, c in roofline.per_function(d):
        if f.peak_bf16_gflops <= 0:
            continue
        busy = int(c.dur.sum())
        _, cmiss, creads = d.tlb_counts.get(f.fid, (0, 0, 0))
        per_miss = creads / cmiss if cmiss and creads else th.walk_reads_per_miss
        walk_ns = f.model_params().walk_latency_ns * f.time_scale * per_miss
        # TLB misses per 4 KiB page the capture's commands touched: an added cast walks
        # as many of its pages
        pages = (-(-c.rd // PAGE) - (-c.wr // PAGE)).sum()
        miss_ratio = float(c.tlb.sum()) / max(int(pages), 1)
        saved_ns, saved_bytes, n, sel = 0.0, 0, 0, []
        for i in weight_gemms(c).tolist():
            s = roofline.shape_of(c, i)
            fl, rd, wr = int(c.flops[i]), int(c.rd[i]), int(c.wr[i])
            bias = s.n * s.s_c if s is not None and s.bias else 0
            cut = (rd - bias) // 2  # bf16 halves A and B
            # the activations cast: A of a solved shape, else as many as the output's
            act = s.act_elems if s is not None else wr // 4
            t32 = roofline.model_ns(f, fl, rd + wr, "fp32")
            t16 = roofline.model_ns(f, fl, rd - cut + wr, "bf16")
            # the page walks of the bytes gone (the command's walks in proportion)
            walks = int(c.tlb[i]) * cut / max(rd + wr, 1) * walk_ns
            # the cast fp32 -> bf16: read 4, write 2 bytes an element
            a4, a2 = act * 4, act * 2
            cast = (roofline.model_ns(f, 0, a4 + a2, "fp32")
                    + miss_ratio * (-(-a4 // PAGE) - (-a2 // PAGE)) * walk_ns)
            gain = t32 - t16 + walks - cast
            if gain <= 0:
                continue
            saved_ns += gain
            saved_bytes += cut - act * 2
            n += 1
            sel.append(i)
        lost = int(saved_ns)
        if not n or lost < th.min_time_lost_ns or lost < th.precision_min_share * busy:
            continue
        ix = np.array(sel, np.int64)
        st, en = c.ts[ix], c.te[ix]
        out.append(Finding(
            rule="precision",
            title=f"{n} GEMMs on {f.name} read fp32 weights: bf16 would read "
                  f"{saved_bytes / (1 << 20):.1f} MiB less",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"fp32_gemms": n, "fp32_gemm_ns": int(c.dur[ix].sum()),
                      "weight_bytes_saved": saved_bytes,
                      "peak_gflops": {"fp32": f.model_params().peak_gflops["fp32"],
                                      "bf16": f.model_params().peak_gflops["bf16"]},
                      "tlb_misses_per_page": round(miss_ratio, 3),
                      "walk_reads_per_miss": round(per_miss, 3), "roofline_ns": busy,
                      "ranges": range_names(d, st, en)},
            time_lost_ns=lost,
            suggestion=SUGGESTION,
            functions=[f.pci],
        ))
    return out
