"""Host buffers that cost extra TLPs or bounce copies (docs/analysis.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Cmds, Data, merged
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
    top_tags,
)
from tacc.capture.devinfo import Function
from tacc.capture.schema import DriverFlag, DriverKind, Opcode
from tacc.model.link import D2H, H2D, LINK_RATE_GTS, copy_link_ps, copy_tlps, link_prefix

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class HostMemoryThresholds:
    extra_tlp_share: float = 0.01
    bounce_bw: float = 8e9


_PAGE = 4096
_WALK_READS_4K = 3  # a 4 KiB leaf: one PTE read per level of the device's page table
# "u2+64->d4 4194304" (tacc.runtime.stream._args): source, destination, bytes; then
# key=value words (copy_h2d's "fp=1a2b3c4d doff=4096", redundant_upload's)
_COPY_ARGS = re.compile(r"^(\S+?)->(\S+) \d+(?: \w+=\S*)*$")


def _side_off(name: str) -> int | None:
    """The page offset of one side of a copy's API arguments: a buffer at ``+OFF`` into
    it (buffers start on a page), an ndarray at its address; None when not parseable."""
    if name.startswith("np@"):
        try:
            return int(name[3:], 16) % _PAGE
        except ValueError:
            return None
    m = re.fullmatch(r"[a-z]+\d+(?:\+(\d+))?", name)
    return int(m.group(1) or 0) % _PAGE if m else None


def _infer_host_off(kind: str, n: int, tlps: int, f: Function) -> int:
    """The smallest host offset (mod 4 KiB, device side aligned) whose modelled payload
    TLP count is the record's: 0 when the aligned count matches (a misalignment the
    record cannot show, e.g. 64 B on a 64 B RCB for a host read, is then not seen)."""
    for h in range(0, _PAGE, 16):
        if copy_tlps(n, kind == H2D, f.mps, f.mrrs, f.rcb, h) == tlps:
            return h
    return 0


def _copy_offsets(d: Data, f: Function, s: Cmds) -> tuple[np.ndarray, np.ndarray]:
    """(host, device) page offsets of each copy: from its API call's arguments when the
    runtime recorded them, else the host offset the record's TLP count implies."""
    host = np.zeros(len(s), np.int64)
    dev = np.zeros(len(s), np.int64)
    args = d.api_args(s.tag)
    cache: dict[tuple[str, int, int], int] = {}
    for i, (a, op, n, t) in enumerate(zip(args, s.opcode.tolist(), s.bytes.tolist(),
                                          s.tlps.tolist(), strict=True)):
        kind = H2D if op == Opcode.COPY_H2D else D2H
        m = _COPY_ARGS.match(a)
        if m:
            src, dst = _side_off(m.group(1)), _side_off(m.group(2))
            h, dv = (src, dst) if kind == H2D else (dst, src)
            if h is not None and dv is not None:
                host[i], dev[i] = h, dv
                continue
        key = (kind, n, t)
        if key not in cache:
            cache[key] = _infer_host_off(kind, n, t, f)
        host[i] = cache[key]
    return host, dev


def _misaligned_cost(f: Function, kind: str, n: int, h: int, dv: int, tlb: int,
                     walk_ns: int) -> tuple[int, int]:
    """(ns lost, extra TLPs) of one copy at host/device page offsets ``h``/``dv`` against
    the same copy aligned, by the device's closed forms (docs/hardware.md section 9):
    its link steps (devinfo.copy_link_ps) and a page walk per extra 4 KiB page the host
    side spans (at most the misses the record counts), time-scaled as the device does."""
    def link(ho: int, do: int) -> int:
        return copy_link_ps(kind, n, f.gen, f.width, f.mps, f.mrrs, f.rcb,
                            host_off=ho, dev_off=do)

    def tlps(ho: int, do: int) -> int:
        return sum(link_prefix(kind, n, f.mps, f.mrrs, f.rcb, ho, do).tlps)
    pages = min(-(-(h + n) // _PAGE) - -(-n // _PAGE), tlb)
    ps = link(h, dv) - link(0, 0) + pages * _WALK_READS_4K * walk_ns * 1000
    return max(int(ps * f.time_scale) // 1000, 0), max(tlps(h, dv) - tlps(0, 0), 0)


def host_memory(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    drv = d.drv
    for f in d.functions:
        m = (c.fid == f.fid) & c.is_copy & (c.bytes > 0)
        if not m.any():
            continue
        s = c.sel(m)
        host_off, dev_off = _copy_offsets(d, f, s)
        cost = np.zeros(len(s), np.int64)
        extra = np.zeros(len(s), np.int64)
        memo: dict[tuple[int, ...], tuple[int, int]] = {}
        known = f.gen in LINK_RATE_GTS and f.width > 0  # a VF seen only by hotplug: no link
        for i in np.flatnonzero(((host_off != 0) | (dev_off != 0)) & known).tolist():
            kind = H2D if s.opcode[i] == Opcode.COPY_H2D else D2H
            key = (int(s.opcode[i]), int(s.bytes[i]), int(host_off[i]), int(dev_off[i]),
                   int(s.tlb[i]))
            if key not in memo:
                memo[key] = _misaligned_cost(f, kind, *key[1:], th.walk_read_ns)
            cost[i], extra[i] = memo[key]
        extra_total = int(extra.sum())
        lost_tlp = int(cost.sum())
        dm = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.DMA_MAP)]
        bounced = dm[(dm["flags"] & int(DriverFlag.BOUNCE)) != 0]
        bounce_bytes = int(bounced["size"].sum())
        lost_bounce = int(bounce_bytes / th.bounce_bw * 1e9)
        bo = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.BO_CREATE)
                 & ((drv["flags"] & int(DriverFlag.USERPTR)) != 0)]
        misaligned = bo[(bo["addr"] % 4096) != 0]
        user = dm[(dm["flags"] & int(DriverFlag.USERPTR)) != 0]
        unpinned = int(((user["flags"] & int(DriverFlag.PINNED)) == 0).sum())
        share = extra_total / max(int(s.tlps.sum()), 1)
        lost = lost_tlp + lost_bounce
        if lost < th.min_time_lost_ns or (share < th.extra_tlp_share and bounce_bytes == 0):
            continue
        bad = cost > 0
        st, en = merged(s.ts[bad], s.te[bad])
        if len(bounced):
            st = np.r_[st, bounced["t_ns"]]
            en = np.r_[en, bounced["t_ns"] + bounced["dur_ns"]]
        kinds = [k for k, v in (("unaligned", extra_total > 0), ("bounced", bounce_bytes > 0))
                 if v]
        out.append(Finding(
            rule="host_memory",
            title=f"{' and '.join(kinds)} host memory in copies on {f.pci}",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"extra_tlps": extra_total, "extra_tlp_share": share,
                      "misaligned_copy_ns": lost_tlp,
                      "host_offsets": sorted({int(x) for x in host_off[bad]})[:5],
                      "affected_transfers": int(bad.sum()),
                      "affected_bytes": int(s.bytes[bad].sum()),
                      "misaligned_userptr_buffers": int(len(misaligned)),
                      "misaligned_addresses": [f"0x{int(a):x}" for a in
                                               np.unique(misaligned["addr"])[:5]],
                      "bounced_maps": int(len(bounced)), "bounced_bytes": bounce_bytes,
                      "userptr_maps_not_pinned": unpinned,
                      "top_tags": top_tags(d, s.tag[bad], s.bytes[bad].astype(np.float64)),
                      "api_calls": d.api_names(s.tag[bad])},
            time_lost_ns=lost,
            suggestion=("Allocate host buffers page-aligned (numpy arrays from the runtime's "
                        "host allocator, or np.empty with 4 KiB alignment) and register them "
                        "once (pinned userptr); a misaligned userptr splits every page into "
                        "an extra TLP, and a bounce buffer adds a CPU copy."),
            functions=[f.pci],
        ))
    return out
