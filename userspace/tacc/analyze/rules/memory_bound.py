"""Memory-bound commands run at a batch that independent work of the same shape could
share (docs/analysis.md "memory_bound"): B sequences decoded one after another at batch 1
where one batch of B would read the weights once."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze import roofline
from tacc.analyze.data import Cmds, Data
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import innermost_range, range_names, range_paths
from tacc.capture.schema import Opcode

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class MemoryBoundThresholds:
    # a command is memory-bound below this share of its ridge point (FLOP/byte)
    memory_bound_ridge_share: float = 1.0
    # memory-bound commands' share of the function's roofline commands' device time
    memory_bound_min_share: float = 0.05


def repeated_groups(d: Data, c: Cmds) -> list[tuple[str, list[np.ndarray]]]:
    """Occurrences of a range at the same place in the program (the same names of the
    ranges enclosing it: ``decode step 2`` of each sequence, not layer ``L0`` of steps 1,
    2 and 3 of one sequence, which depend on each other) whose commands have the same
    shapes, command for command (opcode, dtype, sub-op, FLOPs, bytes): the same work on
    independent inputs (a decode step of another sequence at the same position).  Each
    group: the name and one index array per occurrence, in device order."""
    names, occ = innermost_range(d, c)
    paths = range_paths(d)
    by_occ: dict[int, list[int]] = defaultdict(list)
    for i in np.argsort(c.ts, kind="stable").tolist():
        if occ[i] >= 0:
            by_occ[int(occ[i])].append(i)
    groups: dict[tuple[str, tuple[tuple[int, ...], ...]], list[np.ndarray]] = defaultdict(list)
    for r, idx in by_occ.items():
        ix = np.array(idx, np.int64)
        sig = tuple(zip(c.opcode[ix].tolist(), c.dtype[ix].tolist(), c.subop[ix].tolist(),
                        c.flops[ix].tolist(), c.rd[ix].tolist(), c.wr[ix].tolist(),
                        strict=True))
        groups[(paths[r], sig)].append(ix)
    return [(path[-1], occs) for (path, _), occs in groups.items() if len(occs) >= 2]


def memory_bound(d: Data, th: Thresholds) -> list[Finding]:
    """Commands below their ridge point (FLOPs per device-memory byte < peak of their
    dtype / memory bandwidth) that ran once per occurrence of a range repeated with the
    same shapes: work that one batch could do, reading shared operands (a GEMM's weights)
    once.  Time lost: per command position, the occurrences' measured time less the
    batched command's (the first occurrence's time plus what tacc.model adds for the
    batch's FLOPs and unshared bytes)."""
    out = []
    for f, c in roofline.per_function(d):
        inten, rdg = roofline.intensity(c), roofline.ridge(f, c)
        mb = inten < th.memory_bound_ridge_share * rdg
        busy = int(c.dur.sum())
        mb_ns = int(c.dur[mb].sum())
        if mb_ns < th.memory_bound_min_share * busy:
            continue
        lost, reps, starts, ends = 0, {}, [], []
        # GEMM shape -> (time in repeated ranges, ridge): the suggestion's batch is the
        # one of the shape that took the most
        shapes: dict[roofline.GemmShape, list[float]] = {}
        for name, occs in repeated_groups(d, c):
            k = len(occs)
            ix = np.stack(occs)  # [k, commands]
            for p in range(ix.shape[1]):
                col = ix[:, p]
                i0 = int(col[0])
                if not mb[i0]:
                    continue
                dt = "bf16" if roofline.is_bf16_gemm(c)[i0] else "fp32"
                shp = roofline.shape_of(c, i0)
                nbytes = int(c.rd[i0] + c.wr[i0])
                shared = shp.weight_bytes if shp else 0
                extra = (roofline.model_ns(f, k * int(c.flops[i0]),
                                           k * nbytes - (k - 1) * shared, dt)
                         - roofline.model_ns(f, int(c.flops[i0]), nbytes, dt))
                spent = int(c.dur[col].sum())
                gain = spent - (float(c.dur[col].mean()) + extra)
                if gain <= 0:
                    continue
                lost += int(gain)
                if shp is not None:
                    shapes.setdefault(shp, [0.0, float(rdg[i0])])[0] += spent
            reps[name] = k
            starts += [int(c.ts[o].min()) for o in occs]
            ends += [int(c.te[o].max()) for o in occs]
        if lost < th.min_time_lost_ns:
            continue
        kinds = {}
        for op in np.unique(c.opcode[mb]).tolist():
            m = mb & (c.opcode == op)
            kinds[Opcode(op).name] = {
                "commands": int(m.sum()), "device_ns": int(c.dur[m].sum()),
                "median_flop_per_byte": round(float(np.median(inten[m])), 3)}
        shp = max(shapes, key=lambda k: shapes[k][0]) if shapes else None
        to_ridge = roofline.batch_to_ridge(shp, shapes[shp][1]) if shp else None
        st, en = np.array(starts, np.int64), np.array(ends, np.int64)
        out.append(Finding(
            rule="memory_bound",
            title=f"{int(mb.sum())} memory-bound commands on {f.name} "
                  f"({mb_ns / 1e6:.2f} ms below the ridge); ranges "
                  f"{', '.join(sorted(reps)[:4])} ran {max(reps.values())}x with the same "
                  f"shapes at batch {shp.m if shp else 1}",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"memory_bound_commands": int(mb.sum()), "memory_bound_ns": mb_ns,
                      "roofline_ns": busy,
                      "ridge_flop_per_byte": {"fp32": round(f.ridge("fp32"), 2),
                                              "bf16": round(f.ridge("bf16"), 2)},
                      "by_kind": kinds, "repeated_ranges": reps,
                      "gemm_rows": shp.m if shp else None,
                      "gemm_shape": [shp.m, shp.n, shp.k] if shp else None,
                      "rows_to_reach_ridge": to_ridge,
                      "ranges": range_names(d, st, en)},
            time_lost_ns=lost,
            suggestion="batch the independent sequences (one step for all of them: the "
                       "weights read once per step, not once per sequence)"
                       + (f"; the largest GEMM reaches the ridge at {to_ridge} rows"
                          if to_ridge else ""),
            functions=[f.pci],
        ))
    return out
