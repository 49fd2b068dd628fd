"""What the HTML view adds for a model's capture (trace records of version 3): the
commands on the device's roofline and a per-step breakdown of the tacc.range steps.

Empty (and the HTML view unchanged) for a capture without version-3 records."""

from __future__ import annotations

from typing import Any

import numpy as np

from tacc.analyze import roofline
from tacc.analyze.data import Data, load, union_length
from tacc.analyze.rules.jobs import api_covered, range_records
from tacc.capture import Capture
from tacc.capture.schema import HostKind, Opcode

MAX_POINTS = 5000  # roofline points kept (the most device time first)
# a step: a tacc.range named so (tacc run decode's prefill and decode steps)
STEP_PREFIXES = ("prefill", "decode step")


def report(cap: Capture) -> dict[str, Any]:
    """``{"roofline": [...per function...], "steps": [...]}``, or {} without version-3
    records."""
    d = load(cap)
    if not np.any(roofline.on_roof(d.cmds)):
        return {}
    return {"roofline": _roofline(d), "steps": steps(d)}


def _roofline(d: Data) -> list[dict[str, Any]]:
    out = []
    for f, c in roofline.per_function(d):
        o = np.argsort(-c.dur, kind="stable")[:MAX_POINTS]
        c = c.sel(o)
        inten = roofline.intensity(c)
        gflops = c.flops / np.maximum(c.dur, 1)  # FLOP/ns = GFLOP/s
        p = f.model_params()
        out.append({
            "function": f.name,
            # the device's roofs, in the capture's time (a time-scaled device is slower)
            "peak_gflops": {k: v / f.time_scale for k, v in p.peak_gflops.items()},
            "devmem_gbps": p.devmem_gbps / f.time_scale,
            "reported": f.has_roofline,
            "points": [[round(float(a), 4), round(float(g), 4), int(op), int(dt), int(ns)]
                       for a, g, op, dt, ns in zip(inten.tolist(), gflops.tolist(),
                                                   c.opcode.tolist(), c.dtype.tolist(),
                                                   c.dur.tolist(), strict=True)],
            "ops": {int(o): Opcode(int(o)).name for o in np.unique(c.opcode).tolist()},
        })
    return out


def steps(d: Data) -> list[dict[str, Any]]:
    """One row per step range (prefill, decode step N), in time order: its wall time;
    the host's (no device command running), of which in runtime API calls (submit);
    the device's roofline commands split into compute-bound and memory-bound time (at or
    above / below their ridge point); host link transfers (union of the copies); storage
    (block I/O completed in the step)."""
    names, ra, rb = range_records(d)
    rows: list[dict[str, Any]] = []
    c = d.cmds
    fn = {f.fid: f for f in d.functions}
    rdg = np.zeros(len(c))
    for fid, f in fn.items():
        m = c.fid == fid
        rdg[m] = roofline.ridge(f, c.sel(m))
    roof = roofline.on_roof(c)
    memb = roof & (roofline.intensity(c) < rdg)
    blk = d.host[d.host["kind"] == HostKind.BLOCK_COMPLETE] if len(d.host) else d.host
    for a, b, nm in sorted(zip(ra.tolist(), rb.tolist(), names, strict=True)):
        if not nm.startswith(STEP_PREFIXES):
            continue
        inside = (c.ts >= a) & (c.te <= b)
        dev = union_length(c.ts[inside], c.te[inside])
        copies = inside & c.is_copy
        storage = 0
        if len(blk):
            t = blk["t_ns"].astype(np.int64)
            storage = int(blk["dur_ns"][(t >= a) & (t <= b)].astype(np.int64).sum())
        rows.append({
            "name": nm, "start_ns": a, "wall_ns": b - a, "host_ns": max(b - a - dev, 0),
            "submit_ns": int(api_covered(d, np.array([a]), np.array([b]))[0]),
            "compute_ns": int(c.dur[inside & roof & ~memb].sum()),
            "memory_ns": int(c.dur[inside & memb].sum()),
            "link_ns": union_length(c.ts[copies], c.te[copies]),
            "storage_ns": storage,
            "flops": int(c.flops[inside].sum()),
            "bytes": int((c.rd + c.wr)[inside & roof].sum()),
        })
    return rows
