"""Device TLB misses, each a page-table walk over the link (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc import model
from tacc.analyze.data import Data, merged
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
    top_tags,
)
from tacc.capture.schema import DriverKind

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class TlbThrashThresholds:
    # a miss walks the page table, one PTE read per level (3 for 4 KiB pages, 2 for
    # 2 MiB), each read a host round trip: the device's `walk-latency-ns` (docs/
    # hardware.md section 1); reads per miss come from the tlb_walk_reads counter.
    # walk_read_ns is also read by host_memory and iommu_churn.
    walk_read_ns: int = model.DEFAULT.walk_latency_ns
    walk_reads_per_miss: float = float(model.walk_reads(4096))  # without counters: 4 KiB pages
    tlb_lost_share: float = 0.05


def small_page_walk_share(reads_per_miss: float) -> float:
    """The share of walk time spent on 4 KiB pages when misses walk ``reads_per_miss``
    PTE reads on average: a fraction f of the misses on 4 KiB pages (3 reads) and 1 - f
    on 2 MiB pages (2 reads) give 2 + f reads per miss, of which 3f are the 4 KiB ones."""
    f = min(max(reads_per_miss - 2.0, 0.0), 1.0)
    return 3 * f / (2 + f)


def tlb_thrash(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    drv = d.drv
    for f in d.functions:
        # walks of compute commands (operands in device memory, what 2 MiB device pages
        # fix), against compute time; copies walk the pinned host pages (4 KiB whatever
        # the device pages are)
        m = (c.fid == f.fid) & c.is_compute
        misses = int(c.tlb[m].sum())
        if misses == 0:
            continue
        binds = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.VM_BIND)]
        ps, cnt = np.unique(binds["page_size"], return_counts=True)
        small = binds["page_size"] == 4096
        small_bytes = int(binds["size"][small].sum())
        if len(binds) and not small.any():
            continue
        busy = int(c.dur[m].sum())
        hits, cmiss, creads = d.tlb_counts.get(f.fid, (0, 0, 0))
        if len(binds):
            per_miss = creads / cmiss if cmiss and creads else th.walk_reads_per_miss
            share = small_bytes / max(int(binds["size"].sum()), 1)
        else:
            # attached after the buffers were bound: the walks tell the page size.  The
            # counters' walks less the other commands' misses (copies walk the host's
            # 4 KiB pages: 3 reads each) are the compute commands'.
            other = max(cmiss - misses, 0)
            if not creads or creads <= 3 * other:
                continue
            per_miss = (creads - 3 * other) / misses
            share = small_page_walk_share(per_miss)
            if share == 0:
                continue
        miss_ns = per_miss * th.walk_read_ns * f.time_scale  # modelled time is scaled
        walk = int(misses * miss_ns)
        if walk < th.tlb_lost_share * max(busy, 1):
            continue
        # walks are inside the commands' time: never more than that
        lost = min(int(walk * share * (1 - 1 / 512)), busy)
        if lost < th.min_time_lost_ns:
            continue
        rate = cmiss / (hits + cmiss) if hits + cmiss else None
        hot = m & (c.tlb > 0)
        st, en = merged(c.ts[hot], c.te[hot])
        what = (f"the {small_bytes >> 20} MiB of device buffers" if len(binds) else
                "the device buffers these commands read (bound before the capture)")
        out.append(Finding(
            rule="tlb_thrash",
            title=f"device TLB thrash on {f.pci}: {misses} misses, 4 KiB pages",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"tlb_misses": misses, "miss_rate": rate,
                      "page_sizes": {str(int(p)): int(n) for p, n in zip(ps, cnt, strict=True)},
                      "bytes_in_4k_pages": small_bytes, "walk_ns_estimate": walk,
                      "walk_reads_per_miss": per_miss, "miss_cost_ns": miss_ns,
                      "share_of_walks_on_4k_pages": round(share, 6),
                      "busy_ns": busy,
                      "top_tags": top_tags(d, c.tag[hot], c.tlb[hot].astype(np.float64)),
                      "api_calls": d.api_names(c.tag[hot])},
            time_lost_ns=lost,
            suggestion=(f"Map {what} with 2 MiB pages (sizes and device addresses 2 MiB "
                        "aligned: the runtime's page_size=HUGE): 512x fewer TLB entries, "
                        f"so the {misses} page walks would nearly vanish."),
            functions=[f.pci],
        ))
    return out
