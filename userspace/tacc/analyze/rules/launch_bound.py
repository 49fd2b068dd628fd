"""The device idle between dependent commands while the host is in the submit path: one
submit (and often a host sync) per operation where a captured command list would submit
them at once (docs/analysis.md "launch_bound")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, runs
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import api_covered, jobs, range_names

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class LaunchBoundThresholds:
    launch_min_jobs: int = 32  # single-command device-local jobs in runs
    launch_min_run: int = 4  # consecutive ones on a queue make a run
    launch_api_share: float = 0.5  # of a gap the host spent in runtime API calls
    launch_min_share: float = 0.05  # time lost / the runs' span (first start, last end)


def launch_bound(d: Data, th: Thresholds) -> list[Finding]:
    """Runs of consecutive single-command device-local jobs (GEMM, element-wise and
    inference ops, D2D copies) on a queue; within a run, each job the host submitted only
    after the previous one had ended left the device idle for the gap.  A command list
    replayed per run would submit the run at once: the time lost is the starved gaps of
    each run but its first (the one launch gap a list keeps).  A gap counts when the host
    spent at least ``launch_api_share`` of it inside runtime API calls (the submit path,
    a synchronize): a host computing between the jobs is idle_gaps' finding."""
    j = jobs(d)
    prev_te = np.r_[0, j.te[:-1]]
    in_api = api_covered(d, prev_te, j.ts)
    j.starved = np.where(in_api >= th.launch_api_share * np.maximum(j.starved, 1),
                         j.starved, 0)
    out = []
    for f in d.functions:
        m = (j.fid == f.fid) & j.local & (j.ncmds == 1)
        if not m.any():
            continue
        # runs break at another queue, a multi-command job, a host transfer, a NOP/timestamp
        q = np.r_[False, j.queue[1:] == j.queue[:-1]]
        rs, re = runs(m)
        lost, njobs, nruns, starts, ends, gaps = 0, 0, 0, [], [], []
        for a, b in zip(rs.tolist(), re.tolist(), strict=True):
            # split at queue changes inside the run
            cut = [a] + [i for i in range(a + 1, b) if not q[i]] + [b]
            for x, y in zip(cut[:-1], cut[1:], strict=True):
                if y - x < th.launch_min_run:
                    continue
                g = j.starved[x + 1:y]
                lost += int(g.sum())
                gaps.append(g)
                njobs += y - x
                nruns += 1
                starts.append(int(j.ts[x]))
                ends.append(int(j.te[y - 1]))
        if njobs < th.launch_min_jobs or lost < th.min_time_lost_ns or \
                lost < th.launch_min_share * (max(ends) - min(starts)):
            continue
        allg = np.concatenate(gaps)
        starved = allg[allg > 0]
        busy = int((j.te[m] - j.ts[m]).sum())
        st, en = np.array(starts, np.int64), np.array(ends, np.int64)
        out.append(Finding(
            rule="launch_bound",
            title=f"{njobs} operations submitted one job each on {f.name}: the device "
                  f"waits for the host between them",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"jobs": njobs, "runs": nruns, "starved_gaps": int(len(starved)),
                      "median_gap_ns": int(np.median(starved)) if len(starved) else 0,
                      "device_busy_ns": busy,
                      "ranges": range_names(d, st, en)},
            time_lost_ns=lost,
            suggestion="capture the step's commands once as a command list (with "
                       "stream.capture() as g: ...; g.launch(params)) and replay it: one "
                       "submit per step; do not synchronize the host per layer",
            functions=[f.pci],
        ))
    return out
