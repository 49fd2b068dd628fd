"""From capture streams to timeline batches (tracks, slices, instants, counters).

Everything here is numpy per chunk: a stream chunk becomes one or a few batches of
equal-length arrays.  Per-track state that crosses chunks (last slice end, last counter
sample, memory in use, unpaired scheduler switches) is kept in small dicts, so memory
does not grow with the capture's length.  The writers (Perfetto, JSON, HTML, summary)
consume the same batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tacc.capture import Capture, LinearClock
from tacc.capture.clock import IDENTITY, compose
from tacc.capture.schema import (
    NO_FID,
    TRACE_EV_BASE,
    TRACE_EV_VIRTIO_DISPATCH,
    TRACE_EV_VIRTIO_KICK,
    TRACE_REC3_VERSION,
    BlockOp,
    DeviceEventKind,
    DriverFlag,
    DriverKind,
    HostKind,
    Opcode,
)

ENGINE_NAMES = ("PCIe H2D", "PCIe D2H", "compute0", "compute1", "compute2", "compute3")
OPCODE_NAMES = {int(o): o.name.lower() for o in Opcode}
# virtio-tacc's event records (docs/virtio.md section 10), each on its own track
OPCODE_NAMES.update({TRACE_EV_VIRTIO_KICK: "virtio kick",
                     TRACE_EV_VIRTIO_DISPATCH: "virtio dispatch"})
DRIVER_NAMES = {int(k): k.name.lower() for k in DriverKind}
DEVICE_EVENT_NAMES = {int(k): k.name.lower() for k in DeviceEventKind}
DEVICE_EVENT_ARGS = ("ctx", "queue", "tag", "addr", "arg", "status")
FLOW_NODE_SHIFT = 56
TAG_MASK = np.uint64((1 << FLOW_NODE_SHIFT) - 1)


def link_pm_series(s: np.ndarray, ok: np.ndarray, dt: np.ndarray
                   ) -> list[tuple[str, str, np.ndarray]]:
    """The link power-state tracks of a PF's counter samples (capture minor 8, global
    counters link_l0s/l1_*, docs/hardware.md "Link power management"): the share of each
    sample interval the link spent in L0s and in L1, and the L1 exits per interval; with
    the L1 PM Substates counters (capture minor 10, link_l11/l12_*) and a link that used
    them, also the shares in L1.1 and L1.2 (parts of L1's).  None when the capture has no
    such columns or the link never left L0 (ASPM off, a VF)."""
    names = s.dtype.names or ()
    if "g_link_l1_ticks" not in names:
        return []

    def d(col: str) -> np.ndarray:
        return np.diff(s[col].astype(np.int64)).astype(np.float64)[ok]

    def share(v: np.ndarray) -> np.ndarray:
        return np.minimum(100.0 * v / dt, 100.0)

    l0s, l1, ex = d("g_link_l0s_ticks"), d("g_link_l1_ticks"), d("g_link_l1_exits")
    if not (l0s.any() or l1.any()):
        return []
    out = [("link in L1 %", "%", share(l1)), ("link in L0s %", "%", share(l0s)),
           ("link L1 exits", "exits", ex)]
    for col, name in (("g_link_l11_ticks", "link in L1.1 %"),
                      ("g_link_l12_ticks", "link in L1.2 %")):
        if col in names and (v := d(col)).any():
            out.append((name, "%", share(v)))
    return out


@dataclass
class Track:
    idx: int
    uuid: int
    name: str
    parent: int | None  # idx of parent track
    kind: str  # "group", "slice", "counter"
    unit: str = ""
    node: int = 0
    # an OS process or thread (Perfetto ProcessDescriptor / ThreadDescriptor): "process"
    # or "thread", with its pid (tgid), tid and name (comm); "" for other tracks
    os_kind: str = ""
    pid: int = 0
    tid: int = 0
    os_name: str = ""
    # the device function (capture fid) of a "device"/"driver" group, -1 elsewhere; a
    # track's function is its nearest group's (Chrome JSON: one rank per node/function)
    fid: int = -1
    # what the track holds, for the Chrome JSON "cat": "kernel" (a device engine's queue:
    # one slice per command), "" (derived from the track's place)
    cat: str = ""


class Tracks:
    """Track registry: stable keys -> Track; new tracks are reported once via ``pending``."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Any, ...], Track] = {}
        self.tracks: list[Track] = []
        self.pending: list[Track] = []

    def get(self, key: tuple[Any, ...], name: str, parent: Track | None = None,
            kind: str = "slice", unit: str = "", node: int = 0, os_kind: str = "",
            pid: int = 0, tid: int = 0, os_name: str = "") -> Track:
        t = self.by_key.get(key)
        if t is None:
            idx = len(self.tracks)
            t = Track(idx, 0x7ACC_0000 + idx, name, parent.idx if parent else None, kind, unit,
                      node, os_kind, pid, tid, os_name,
                      parent.fid if parent else -1)
            self.by_key[key] = t
            self.tracks.append(t)
            self.pending.append(t)
        return t

    def take_pending(self) -> list[Track]:
        out, self.pending = self.pending, []
        return out


class Names:
    """Interned event / annotation names (iid starts at 1)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pending: list[tuple[int, str]] = []

    def iid(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = len(self.ids) + 1
            self.ids[name] = i
            self.pending.append((i, name))
        return i

    def take_pending(self) -> list[tuple[int, str]]:
        out, self.pending = self.pending, []
        return out

    def lookup(self) -> list[str]:
        out = [""] * (len(self.ids) + 1)
        for k, v in self.ids.items():
            out[v] = k
        return out


@dataclass
class Batch:
    """Slices (dur >= 0) or instants (dur is None) on tracks, in one batch."""

    track: np.ndarray  # int64 track idx
    ts: np.ndarray  # int64 ns
    dur: np.ndarray | None
    name: np.ndarray  # int64 name iid
    flow: np.ndarray | None = None  # uint64, 0 = none
    term: np.ndarray | None = None  # bool: flow ends here
    args: dict[str, np.ndarray] = field(default_factory=dict)  # uint64 or float64 columns
    flow_origin: bool = False  # flows start here (API calls)

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray) -> Batch:
        return Batch(
            self.track[idx], self.ts[idx], None if self.dur is None else self.dur[idx],
            self.name[idx], None if self.flow is None else self.flow[idx],
            None if self.term is None else self.term[idx],
            {k: v[idx] for k, v in self.args.items()}, self.flow_origin,
        )


@dataclass
class CounterBatch:
    track: np.ndarray
    ts: np.ndarray
    value: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class Source:
    """One capture with its place in a merged timeline."""

    cap: Capture
    node_idx: int
    align: LinearClock  # this capture's CLOCK_MONOTONIC -> reference timeline
    clocks: dict[int, LinearClock]  # fid -> device ticks -> reference timeline
    name: str = ""  # node id in a merged view (tacc.timeline.cluster), else the capture's
    cross: np.ndarray | None = None  # tags carried between nodes: one flow id on every node

    @property
    def node(self) -> str:
        return self.name or self.cap.node


def make_sources(caps: list[Capture], view: Any = None) -> list[Source]:
    """Align several captures on the first one's CLOCK_MONOTONIC: through ``view`` (a
    ``tacc.timeline.cluster.ClusterView``: node ids, clock alignment, messages), else via
    the host-clock pairs."""
    if view is not None:
        from .cluster import cross_tags

        tags = cross_tags(view.messages)
        out = []
        for i, (cap, nc) in enumerate(zip(caps, view.clocks, strict=True)):
            clocks = {fn.fid: compose(nc.align, cap.device_clock(fn.fid)) if i else
                      cap.device_clock(fn.fid) for fn in cap.functions}
            out.append(Source(cap, i, nc.align, clocks, view.names[i], tags))
        return out
    out = []
    ref = caps[0].host_clock() if caps else None
    names: dict[str, int] = {}
    for i, cap in enumerate(caps):
        align = IDENTITY
        if i > 0:
            hc = cap.host_clock()
            if ref is not None and hc is not None:
                # mono_k -> host -> mono_ref
                back = LinearClock(x0=ref.y0, y0=ref.x0, drift=1.0 / ref.drift)
                align = compose(back, hc)
            else:
                cap.problems.append("no host-clock pairs: node timelines not aligned")
        node = cap.node
        if node in names:
            node = f"{node}#{i}"
        names[node] = i
        clocks = {fn.fid: compose(align, cap.device_clock(fn.fid)) if i else
                  cap.device_clock(fn.fid) for fn in cap.functions}
        out.append(Source(cap, i, align, clocks))
    return out


def flow_ids(node_idx: int, tag: np.ndarray, cross: np.ndarray | None = None) -> np.ndarray:
    """Flow id of each tag: per node, except tags carried to another node (``cross``),
    whose flows continue across nodes (send -> packets -> receive -> API -> device)."""
    tag = np.asarray(tag, np.uint64)
    f = (tag & TAG_MASK) | np.uint64((node_idx + 1) << FLOW_NODE_SHIFT)
    if cross is not None and len(cross):
        f = np.where(np.isin(tag, cross), (tag & TAG_MASK) | CROSS_FLOW, f)
    return np.where(tag != 0, f, np.uint64(0))


CROSS_FLOW = np.uint64(0xFF << FLOW_NODE_SHIFT)  # tacc.timeline.cluster.CROSS_FLOW
TLP_FLOW = 0xFE << FLOW_NODE_SHIFT  # read request -> completions (node << 48 | number)


# tacc.range names of a load's steps (tacc.workloads.load): one flow per tensor
TENSOR_RANGE = re.compile(r"tensor (.+): (read|copy|upload)")


@dataclass
class TensorFlows:
    """A load's flows, one per tensor (ranges named ``tensor NAME: read|copy|upload``):
    each tensor's flow id is the one of the first tagged API call inside its upload range
    on that range's thread (so the flow runs on through that call's submit and device
    commands); ``args_flow`` maps a range name's string id to it, ``reads`` holds the read
    ranges (tid, start, end, flow id) that the block I/O issued inside them joins."""

    args_flow: dict[int, int]
    reads: np.ndarray  # rows of (tid, t_start, t_end, flow) int64 / uint64 as int64


@dataclass
class RangeProjection:
    """What projecting a capture's ranges onto its devices needs, gathered while the API
    and device streams are converted: ranges (thread key, start, end, name iid), API calls
    with a tag (thread key, start, end, tag) and tagged device commands (fid, tag, start,
    end), as per-chunk arrays."""

    ranges: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    calls: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    cmds: list[tuple[np.ndarray, ...]] = field(default_factory=list)


class NoOverlap:
    """Keeps slices of a track non-overlapping and in order across batches."""

    def __init__(self) -> None:
        self.last_end: dict[int, int] = {}

    def fix(self, b: Batch) -> Batch:
        """Sort by (track, ts), clamp starts to the previous end on the track, then order by ts."""
        assert b.dur is not None
        if len(b) == 0:
            return b
        o = np.lexsort((b.ts, b.track))
        b = b.take(o)
        end = b.ts + np.maximum(b.dur, 0)
        base = int(b.ts.min())
        span = int(end.max() - base) + 1
        _, rank = np.unique(b.track, return_inverse=True)
        key = (end - base) + rank.astype(np.int64) * span
        run = np.maximum.accumulate(key)
        prev = np.r_[np.int64(-1), run[:-1]]
        first = np.r_[True, b.track[1:] != b.track[:-1]]
        prev_end = np.where(first, np.iinfo(np.int64).min, prev - rank * span + base)
        carry = np.array([self.last_end.get(int(t), np.iinfo(np.int64).min) for t in
                          b.track[first].tolist()], dtype=np.int64)
        prev_end[first] = carry
        start = np.maximum(b.ts, prev_end)
        b.dur = np.maximum(end, start) - start
        b.ts = start
        last = np.r_[b.track[1:] != b.track[:-1], True]
        for t, e in zip(b.track[last].tolist(), (b.ts + b.dur)[last].tolist(), strict=True):
            self.last_end[int(t)] = max(int(e), self.last_end.get(int(t), int(e)))
        return b.take(np.argsort(b.ts, kind="stable"))


class Extractor:
    """Turns the streams of the sources into batches; owns the track and name registries."""

    def __init__(self, sources: list[Source], view: Any = None) -> None:
        self.sources = sources
        self.view = view  # tacc.timeline.cluster.ClusterView of a merge, else None
        self.messages: np.ndarray | None = view.messages if view is not None else None
        self.tracks = Tracks()
        self.names = Names()
        self.nooverlap = NoOverlap()
        self.counter_carry: dict[tuple[Any, ...], Any] = {}
        self.device_event_counts: dict[str, int] = {}  # kind name -> instants (--summary)
        self._os: dict[int, tuple[dict[int, str], dict[int, int]]] = {}  # node -> names
        self._ctr: dict[int, dict[int, str]] = {}  # node -> pid -> container label
        self._proj: dict[int, RangeProjection] = {}  # node -> ranges, calls, commands
        self._tflows: dict[int, TensorFlows | None] = {}  # node -> a load's tensor flows

    # ------------------------------------------------------- OS names -------
    def os_names(self, src: Source) -> tuple[dict[int, str], dict[int, int]]:
        """(tid -> comm, tid -> pid) of the capture, from the host stream's records
        (sched_switch prev/next, wakeups, block and net: the kernel's task comm) and the
        API calls' pid/tid.  One pass over four small columns, cached per source."""
        got = self._os.get(src.node_idx)
        if got is not None:
            return got
        comm: dict[int, str] = {}
        tgid: dict[int, int] = {}
        cols = ["kind", "pid", "tid", "next_pid", "comm", "next_comm"]
        for ch in src.cap.chunks("host", cols):
            sw = ch["kind"] == HostKind.SCHED_SWITCH
            tids = np.concatenate([ch["tid"], ch["next_pid"][sw]]).astype(np.int64)
            names = np.concatenate([ch["comm"], ch["next_comm"][sw]])
            ok = (tids != 0) & (names != b"")
            u, i = np.unique(tids[ok][::-1], return_index=True)  # the last name of a tid
            for t, n in zip(u.tolist(), names[ok][::-1][i].tolist(), strict=True):
                comm[int(t)] = n.decode(errors="replace")
            # pid (tgid) of a record's task: every kind but wakeups (pid 0 there)
            m = (ch["kind"] != HostKind.SCHED_WAKEUP) & (ch["pid"] != 0) & (ch["tid"] != 0)
            pairs = np.unique((ch["tid"][m].astype(np.int64) << 32) | ch["pid"][m])
            for k in pairs.tolist():
                tgid[k >> 32] = k & 0xFFFFFFFF
        for ch in src.cap.chunks("api", ["pid", "tid"]):
            pairs = np.unique((ch["tid"].astype(np.int64) << 32) | ch["pid"])
            for k in pairs.tolist():
                tgid.setdefault(k >> 32, k & 0xFFFFFFFF)
        self._os[src.node_idx] = (comm, tgid)
        return comm, tgid

    def process_name(self, src: Source, pid: int) -> str:
        """The process's name: its main thread's comm, else that of any thread seen."""
        comm, tgid = self.os_names(src)
        if pid in comm:
            return comm[pid]
        return next((comm[t] for t, p in sorted(tgid.items()) if p == pid and t in comm), "")

    def containers(self, src: Source) -> dict[int, str]:
        """pid -> ``[<container> pid <pid inside>]`` from the capture's processes stream
        (docs/containers.md); processes outside containers are absent."""
        got = self._ctr.get(src.node_idx)
        if got is None:
            got = {}
            strings = src.cap.strings
            for ch in src.cap.chunks("processes", ["pid", "ns_pid", "container_name_id"]):
                for pid, nspid, cid in zip(ch["pid"].tolist(), ch["ns_pid"].tolist(),
                                           ch["container_name_id"].tolist(), strict=True):
                    if cid:
                        got[int(pid)] = f"[{strings.get(int(cid), '?')} pid {nspid}]"
            self._ctr[src.node_idx] = got
        return got

    def proc_track(self, src: Source, pid: int) -> Track:
        name = self.process_name(src, pid)
        ctr = self.containers(src).get(pid)
        if ctr:  # the container in the track's and the Perfetto process's name
            name = f"{name} {ctr}" if name else ctr
        return self.tracks.get(("proc", src.node_idx, pid),
                               f"{name} pid {pid}" if name else f"pid {pid}",
                               self.node_track(src), "group", node=src.node_idx,
                               os_kind="process", pid=pid, os_name=name)

    def thread_track(self, src: Source, pid: int, tid: int) -> Track:
        """The thread's group (under its process): API, CPU and wakeup tracks go in it."""
        name = self.os_names(src)[0].get(tid, "")
        return self.tracks.get(("tgroup", src.node_idx, pid, tid),
                               f"{name} tid {tid}" if name else f"tid {tid}",
                               self.proc_track(src, pid), "group", node=src.node_idx,
                               os_kind="thread", pid=pid, tid=tid, os_name=name)

    def thread_label(self, src: Source, tid: int) -> str:
        name = self.os_names(src)[0].get(tid, "")
        return f"{name} tid {tid}" if name else f"tid {tid}"

    # -------------------------------------------------------------- tracks --
    def node_track(self, src: Source) -> Track:
        return self.tracks.get(("node", src.node_idx), f"{src.node}", None, "group",
                               node=src.node_idx)

    def _lookup_tracks(self, keys: np.ndarray, make: Any) -> np.ndarray:
        """Map an array of integer keys to track idx; ``make(key) -> Track`` for new ones."""
        uniq, inv = np.unique(keys, return_inverse=True)
        idx = np.array([make(int(k)).idx for k in uniq.tolist()], dtype=np.int64)
        return idx[inv]

    # -------------------------------------------------------------- api -----
    def api(self, src: Source) -> Iterator[Batch]:
        cap = src.cap
        strings = cap.strings
        name_iid = {sid: self.names.iid(s or "?") for sid, s in strings.items()}
        iid_of = np.zeros(max(name_iid) + 1, np.int64)
        for sid, i in name_iid.items():
            iid_of[sid] = i

        def make(key: int) -> Track:
            pid, tid = key >> 32, key & 0xFFFFFFFF
            return self.tracks.get(("thread", src.node_idx, pid, tid),
                                   f"{self.thread_label(src, tid)} API",
                                   self.thread_track(src, pid, tid), node=src.node_idx)

        range_sids = np.array([sid for sid, s in strings.items() if s == "range"], np.int64)
        proj = self._projection(src)
        ranges = []
        for ch in cap.chunks("api"):
            is_range = np.isin(ch["name_id"], range_sids)
            if is_range.any():
                ranges.append(ch[is_range])  # one batch at the end: a range is written
                ch = ch[~is_range]  # when it ends, after the ranges nested in it
            key = (ch["pid"].astype(np.int64) << 32) | ch["tid"].astype(np.int64)
            ts = src.align.convert(ch["t_start"].view(np.uint64)) if src.node_idx else \
                ch["t_start"].astype(np.int64)
            dur = np.maximum(ch["t_end"] - ch["t_start"], 0).astype(np.int64)
            called = ch["tag"] != 0
            if len(range_sids) and called.any():
                proj.calls.append((key[called], ts[called], ts[called] + dur[called],
                                   ch["tag"][called].astype(np.uint64)))
            names = iid_of[np.minimum(ch["name_id"], len(iid_of) - 1)]
            flow = flow_ids(src.node_idx, ch["tag"], src.cross)
            if src.cross is not None and len(src.cross):
                # a receive starts waiting before its message was sent: its flow step is
                # the "received" instant on the network track (network()), at its end
                recv = np.isin(ch["name_id"], self._recv_ids(src))
                flow[recv] = 0
            b = Batch(self._lookup_tracks(key, make), ts, dur, names, flow, None,
                      {"tag": ch["tag"].astype(np.uint64), "bytes": ch["bytes"].astype(np.uint64)})
            b.term = np.zeros(len(b), bool)
            b.flow_origin = True
            yield self.nooverlap.fix(b)
        if ranges:
            yield self._range_batch(src, np.concatenate(ranges), iid_of, proj)

    # ------------------------------------------------------------ ranges ----
    def tensor_flows(self, src: Source) -> TensorFlows | None:
        """The capture's tensor flows (TensorFlows), None without tensor ranges; one pass
        over the API stream's range and tagged records, cached per source."""
        if src.node_idx in self._tflows:
            return self._tflows[src.node_idx]
        strings = src.cap.strings
        steps = {sid: m.groups() for sid, s in strings.items()
                 if s and (m := TENSOR_RANGE.fullmatch(s))}
        range_sids = [sid for sid, s in strings.items() if s == "range"]
        out: TensorFlows | None = None
        if steps and range_sids:
            rng, calls = [], []
            for ch in src.cap.chunks("api", ["t_start", "t_end", "tid", "tag", "name_id",
                                             "args_id"]):
                m = np.isin(ch["name_id"], range_sids) & np.isin(ch["args_id"], list(steps))
                rng.append(ch[m])
                calls.append(ch[ch["tag"] != 0])
            r = np.concatenate(rng)
            c = np.concatenate(calls)
            c = c[np.argsort(c["t_start"], kind="stable")]
            tag_of: dict[str, int] = {}
            for row in r[np.argsort(r["t_start"], kind="stable")]:
                name, step = steps[int(row["args_id"])]
                if step != "upload" or name in tag_of:
                    continue
                i = np.searchsorted(c["t_start"], row["t_start"], "left")
                j = np.searchsorted(c["t_start"], row["t_end"], "right")
                inside = c[i:j]
                inside = inside[inside["tid"] == row["tid"]]
                if len(inside):
                    tag_of[name] = int(inside["tag"][0])
            flow = {n: int(flow_ids(src.node_idx, np.array([t], np.uint64), src.cross)[0])
                    for n, t in tag_of.items()}
            args_flow = {sid: flow[n] for sid, (n, _) in steps.items() if n in flow}
            reads = [(int(x["tid"]), int(x["t_start"]), int(x["t_end"]),
                      args_flow[int(x["args_id"])]) for x in r
                     if steps[int(x["args_id"])][1] == "read" and int(x["args_id"]) in args_flow]
            out = TensorFlows(args_flow, np.array(reads, np.uint64).reshape(-1, 4)
                              .astype(np.int64))
        self._tflows[src.node_idx] = out
        return out

    def _projection(self, src: Source) -> RangeProjection:
        p = self._proj.get(src.node_idx)
        if p is None:
            p = self._proj[src.node_idx] = RangeProjection()
        return p

    def _range_batch(self, src: Source, r: np.ndarray, iid_of: np.ndarray,
                     proj: RangeProjection) -> Batch:
        """``tacc.range`` records (API records named ``range``, the name in ``args``): on
        the thread's ``ranges`` track, nested by time (not made disjoint as API calls are:
        a range contains the ranges opened inside it)."""
        key = (r["pid"].astype(np.int64) << 32) | r["tid"].astype(np.int64)

        def make(k: int) -> Track:
            pid, tid = k >> 32, k & 0xFFFFFFFF
            return self.tracks.get(("ranges", src.node_idx, pid, tid),
                                   f"{self.thread_label(src, tid)} ranges",
                                   self.thread_track(src, pid, tid), node=src.node_idx)

        ts = src.align.convert(r["t_start"].view(np.uint64)) if src.node_idx else \
            r["t_start"].astype(np.int64)
        dur = np.maximum(r["t_end"] - r["t_start"], 0).astype(np.int64)
        names = iid_of[np.minimum(r["args_id"], len(iid_of) - 1)]
        proj.ranges.append((key, ts, ts + dur, names))
        o = np.lexsort((-dur, ts))  # outer ranges begin first
        flow = None
        tf = self.tensor_flows(src)
        if tf is not None and tf.args_flow:
            flow = np.array([tf.args_flow.get(int(a), 0) for a in r["args_id"][o].tolist()],
                            np.uint64)
        return Batch(self._lookup_tracks(key, make)[o], ts[o], dur[o], names[o], flow,
                     None if flow is None else np.zeros(len(o), bool),
                     {"status": (r["status"][o].astype(np.int64) != 0).astype(np.uint64)})

    def _range_projection(self, src: Source) -> Iterator[Batch]:
        """Each range projected onto each device that ran its work: a slice on the
        function's ``ranges`` track from the first device start to the last device end
        of the commands submitted by the API calls inside the range (nsys's projection
        of NVTX ranges onto the GPU)."""
        proj = self._proj.pop(src.node_idx, None)
        if proj is None or not proj.ranges or not proj.calls or not proj.cmds:
            return
        cidx, ct0, ct1, ctag = (np.concatenate(c) for c in zip(*proj.calls, strict=True))
        o = np.lexsort((ct0, cidx))
        cidx, ct0, ct1, ctag = cidx[o], ct0[o], ct1[o], ctag[o]
        fid, tag, d0, d1 = (np.concatenate(c) for c in zip(*proj.cmds, strict=True))
        # per (fid, tag): first start, last end
        k = (fid.astype(np.uint64) << np.uint64(48)) ^ tag
        uk, inv = np.unique(k, return_inverse=True)
        first = np.full(len(uk), np.iinfo(np.int64).max, np.int64)
        last = np.full(len(uk), np.iinfo(np.int64).min, np.int64)
        np.minimum.at(first, inv, d0)
        np.maximum.at(last, inv, d1)
        ufid = (uk >> np.uint64(48)).astype(np.int64)
        utag = uk ^ (ufid.astype(np.uint64) << np.uint64(48))
        rows: list[tuple[int, int, int, int]] = []
        for rk, r0, r1, nm in zip(*(np.concatenate(c) for c in zip(*proj.ranges,
                                                                   strict=True)),
                                  strict=True):
            lo = np.searchsorted(cidx, rk, "left")
            hi = np.searchsorted(cidx, rk, "right")
            a = lo + np.searchsorted(ct0[lo:hi], r0, "left")
            b = lo + np.searchsorted(ct0[lo:hi], r1, "right")
            inside = ctag[a:b][ct1[a:b] <= r1]
            if not len(inside):
                continue
            sel = np.isin(utag, inside)
            for f in np.unique(ufid[sel]).tolist():
                m = sel & (ufid == f)
                rows.append((int(f), int(first[m].min()), int(last[m].max()), int(nm)))
        if not rows:
            return
        arr = np.array(rows, np.int64)
        dur = np.maximum(arr[:, 2] - arr[:, 1], 0)
        o = np.lexsort((-dur, arr[:, 1]))
        arr, dur = arr[o], dur[o]
        tr = self._lookup_tracks(arr[:, 0], lambda f: self._device_track(src, f, "ranges"))
        yield Batch(tr, arr[:, 1], dur, arr[:, 3])

    # -------------------------------------------------------------- driver --
    CATEGORY = {
        DriverKind.IOCTL: "ioctl", DriverKind.SUBMIT: "submit", DriverKind.DOORBELL: "doorbell",
        DriverKind.IRQ: "irq", DriverKind.JOB_START: "jobs", DriverKind.JOB_DONE: "completion",
        DriverKind.BO_CREATE: "bo", DriverKind.BO_DESTROY: "bo free",
        DriverKind.DMA_MAP: "dma map/unmap", DriverKind.DMA_UNMAP: "dma map/unmap",
        DriverKind.VM_BIND: "vm bind/unbind", DriverKind.VM_UNBIND: "vm bind/unbind",
        DriverKind.MMU_FAULT: "faults", DriverKind.PM: "pm", DriverKind.RESET: "reset",
        DriverKind.TRACE_DROP: "trace drops",
    }
    SPAN_KINDS = (DriverKind.IOCTL, DriverKind.DMA_MAP, DriverKind.DMA_UNMAP,
                  DriverKind.VM_BIND, DriverKind.VM_UNBIND, DriverKind.BO_CREATE)
    DRIVER_ARGS: dict[str, tuple[str, ...]] = {
        "ioctl": ("tag", "job", "arg", "status"),
        "submit": ("tag", "job", "ncmds", "size"),
        "doorbell": ("tag", "job"),
        "irq": ("arg",),
        "jobs": ("tag", "job"),
        "completion": ("tag", "job", "status", "dev_start", "dev_end"),
        "bo": ("arg", "size", "addr", "flags"),
        "bo free": ("arg", "size", "addr", "flags"),
        "dma map/unmap": ("addr", "size", "nsegs", "dir", "flags"),
        "vm bind/unbind": ("addr", "size", "page_size"),
        "faults": ("addr", "status", "tag"),
        "pm": ("arg",),
        "reset": ("arg",),
        "trace drops": ("arg",),
    }

    def _fn_name(self, src: Source, fid: int) -> str:
        fns = src.cap.functions
        return fns[fid].name if 0 <= fid < len(fns) else f"function {fid}"

    def driver(self, src: Source) -> Iterator[Batch | CounterBatch]:
        node = self.node_track(src)
        kind_iid = {k: self.names.iid(DRIVER_NAMES[k]) for k in DRIVER_NAMES}
        for ch in src.cap.chunks("driver"):
            ts_all = src.align.convert(ch["t_ns"].view(np.uint64)) if src.node_idx else \
                ch["t_ns"].astype(np.int64)
            kinds = ch["kind"]
            # one batch per (category, span or instant): a track holds slices or instants,
            # never both (BO_CREATE is a slice on "bo", BO_DESTROY an instant on "bo free"),
            # whatever kinds a chunk happens to hold
            span_kinds = {int(x) for x in self.SPAN_KINDS}
            cats: dict[tuple[str, bool], list[int]] = {}
            for k in np.unique(kinds).tolist():
                if k in DRIVER_NAMES:
                    cats.setdefault((self.CATEGORY[DriverKind(k)], k in span_kinds),
                                    []).append(k)
            for (cat, span), ks in cats.items():
                sel = np.flatnonzero(np.isin(kinds, ks))
                sub = ch[sel]
                per_tid = cat in ("ioctl", "dma map/unmap", "vm bind/unbind", "bo", "bo free")
                key = sub["fid"].astype(np.int64) << 32
                if per_tid:
                    key = key | sub["tid"].astype(np.int64)

                def make(k: int, cat: str = cat, per_tid: bool = per_tid) -> Track:
                    fid, tid = k >> 32, k & 0xFFFFFFFF
                    grp = self.tracks.get(("driver", src.node_idx, fid),
                                          f"driver {self._fn_name(src, fid)}", node, "group",
                                          node=src.node_idx)
                    grp.fid = fid
                    nm = f"{cat} tid {tid}" if per_tid else cat
                    return self.tracks.get(("drv", src.node_idx, fid, cat, tid), nm, grp,
                                           node=src.node_idx)

                tr = self._lookup_tracks(key, make)
                names = np.array([kind_iid.get(k, 0) for k in range(256)],
                                 np.int64)[sub["kind"]]
                args = {a: sub[a].astype(np.uint64) for a in self.DRIVER_ARGS[cat]}
                flow = None
                term = None
                if cat in ("submit", "completion"):
                    flow = flow_ids(src.node_idx, sub["tag"], src.cross)
                    term = np.full(len(sub), cat == "completion")
                b = Batch(tr, ts_all[sel], sub["dur_ns"].astype(np.int64) if span else None,
                          names, flow, term, args)
                yield self.nooverlap.fix(b) if span else b
            yield from self._memory_counters(src, ch, ts_all)

    def _memory_counters(self, src: Source, ch: np.ndarray, ts: np.ndarray
                         ) -> Iterator[CounterBatch]:
        kinds = ch["kind"]
        for what, plus, minus, flag in (
            ("device memory in use", DriverKind.BO_CREATE, DriverKind.BO_DESTROY,
             DriverFlag.DEVMEM),
            ("pinned host memory", DriverKind.DMA_MAP, DriverKind.DMA_UNMAP, DriverFlag.USERPTR),
        ):
            sel = ((kinds == plus) | (kinds == minus)) & ((ch["flags"] & int(flag)) != 0)
            if not sel.any():
                continue
            sub = ch[sel]
            delta = np.where(sub["kind"] == plus, 1, -1) * sub["size"].astype(np.int64)
            for fid in np.unique(sub["fid"]).tolist():
                m = sub["fid"] == fid
                key = ("mem", src.node_idx, fid, what)
                base = self.counter_carry.get(key, 0)
                vals = base + np.cumsum(delta[m])
                self.counter_carry[key] = int(vals[-1])
                tr = self._device_track(src, fid, what, kind="counter", unit="bytes")
                yield CounterBatch(np.full(int(m.sum()), tr.idx), ts[sel][m],
                                   vals.astype(np.float64))

    # -------------------------------------------------------------- device --
    def _device_group(self, src: Source, fid: int) -> Track:
        node = self.node_track(src)
        t = self.tracks.get(("dev", src.node_idx, fid), f"device {self._fn_name(src, fid)}",
                            node, "group", node=src.node_idx)
        t.fid = fid
        return t

    def _device_track(self, src: Source, fid: int, name: str, kind: str = "slice",
                      unit: str = "") -> Track:
        grp = self._device_group(src, fid)
        return self.tracks.get(("devtrack", src.node_idx, fid, name), name, grp, kind, unit,
                               node=src.node_idx)

    def device(self, src: Source) -> Iterator[Batch]:
        op_iid = np.array([self.names.iid(OPCODE_NAMES.get(i, f"op{i}")) for i in range(256)],
                          np.int64)
        for ch in src.cap.chunks("device_trace"):
            ts = np.empty(len(ch), np.int64)
            te = np.empty(len(ch), np.int64)
            tf = np.empty(len(ch), np.int64)
            for fid in np.unique(ch["fid"]).tolist():
                m = ch["fid"] == fid
                clk = src.clocks.get(int(fid))
                if clk is None:
                    clk = LinearClock(0, 0, 1.0)
                ts[m] = clk.convert(ch["t_start"][m])
                te[m] = clk.convert(ch["t_end"][m])
                tf[m] = clk.convert(ch["t_fetch"][m])
            # an event record's track is its kind's (the opcode in the engine's place)
            eng = np.where(ch["opcode"] >= TRACE_EV_BASE, ch["opcode"], ch["engine"])
            key = (ch["fid"].astype(np.int64) << 16) | (eng.astype(np.int64) << 8) \
                | ch["queue"].astype(np.int64)

            def make(k: int) -> Track:
                fid, eng, q = k >> 16, (k >> 8) & 0xFF, k & 0xFF
                if eng == TRACE_EV_VIRTIO_KICK:  # a submit buffer: no queue (0xff)
                    return self._device_track(src, fid, "virtio kicks")
                if eng == TRACE_EV_VIRTIO_DISPATCH:
                    return self._device_track(src, fid, f"virtio dispatch q{q}")
                en = (ENGINE_NAMES[eng] if eng < len(ENGINE_NAMES) else
                      "control" if eng == 255 else f"engine{eng}")  # 255: fence/timestamp/nop
                t = self._device_track(src, fid, f"{en} q{q}")
                t.cat = "kernel"  # a device queue on an engine: HTA's GPU stream
                return t

            dur = np.maximum(te - ts, 0)
            nbytes = ch["bytes"].astype(np.uint64)
            gbps = np.where(dur > 0, nbytes.astype(np.float64) / np.maximum(dur, 1), 0.0)
            proj = self._proj.get(src.node_idx)
            if proj is not None and proj.ranges:
                tagged = (ch["tag"] != 0) & (ch["opcode"] < TRACE_EV_BASE)
                proj.cmds.append((ch["fid"][tagged].astype(np.int64),
                                  ch["tag"][tagged].astype(np.uint64), ts[tagged], te[tagged]))
            b = Batch(self._lookup_tracks(key, make), ts, dur, op_iid[ch["opcode"]],
                      flow_ids(src.node_idx, ch["tag"], src.cross), np.zeros(len(ch), bool),
                      {"bytes": nbytes, "GB/s": gbps, "tag": ch["tag"].astype(np.uint64),
                       "job": ch["job"].astype(np.uint64),
                       "queue_wait_ns": np.maximum(ts - tf, 0).astype(np.uint64),
                       "tlps": ch["tlps"].astype(np.uint64),
                       "tlb_misses": ch["tlb_misses"].astype(np.uint64),
                       "status": ch["status"].astype(np.uint64)})
            if np.any(ch["version"] >= TRACE_REC3_VERSION):
                # version-3 records (capture minor 12): each command's FLOPs, device-memory
                # bytes and list; chunks without them keep the arguments above only
                for k in ("flops", "bytes_read", "bytes_written", "list_id", "dtype",
                          "subop"):
                    b.args[k] = ch[k].astype(np.uint64)
            yield self.nooverlap.fix(b)

    # ------------------------------------------------------------ TLPs ------
    def tlp(self, src: Source) -> Iterator[Batch]:
        """The TLP stream (format minor 7) on two tracks of each PF, "TLPs down (H2D)"
        and "TLPs up (D2H)": one slice per TLP as long as its link time, each read
        request a flow to its completions (tacc.pcie.perfetto, as ``tacc pcie
        timeline``)."""
        from tacc.pcie import F_CTRL
        from tacc.pcie import perfetto as tp

        fns = src.cap.functions
        pf_of = {f.pci: f.fid for f in fns if f.vf == 0}
        flows = tp.ReadFlows()
        base = np.uint64(TLP_FLOW | (src.node_idx << 48))
        for ch in src.cap.chunks("tlp"):
            # the PF whose link (and clock) a record is on: its function's PF
            pf = np.array([pf_of.get(f.pf, f.fid) for f in fns] + [0], np.int64)[
                np.minimum(ch["fid"].astype(np.int64), len(fns))]
            ticks = ch["t_ps"] // 1000
            ts = np.empty(len(ch), np.int64)
            for fid in np.unique(pf).tolist():
                m = pf == fid
                clk = src.clocks.get(int(fid)) or LinearClock(0, 0, 1.0)
                ts[m] = clk.convert(ticks[m])
            link = fns[int(pf[0])] if len(ch) and len(fns) else None
            up, dur_ps, labels = tp.slices(ch, link.gen if link else 4,
                                           link.width if link else 16)
            flow, last = flows.feed(ch)
            fl = np.where(flow > 0, base | flow.astype(np.uint64), np.uint64(0))
            names = np.array([self.names.iid(n) for n in labels], np.int64)
            key = pf * 2 + up

            def make(k: int) -> Track:
                return self._device_track(src, k // 2, "TLPs up (D2H)" if k % 2 else
                                          "TLPs down (H2D)")

            args = {"addr": ch["addr"].astype(np.uint64), "tag": ch["tag"].astype(np.uint64),
                    "func": ch["func"].astype(np.uint64), "seq": ch["seq"].astype(np.uint64),
                    "cmd_tag": ch["cmd_tag"].astype(np.uint64),
                    "link_bytes": ch["link_bytes"].astype(np.uint64),
                    "ctrl": ((ch["flags"] & F_CTRL) != 0).astype(np.uint64)}
            b = Batch(self._lookup_tracks(key, make), ts, (dur_ps + 999) // 1000, names, fl,
                      last, args)
            # requests go up (flows start there), completions come down
            for part, origin in ((up, True), (~up, False)):
                sub = b.take(np.flatnonzero(part))
                sub.flow_origin = origin
                yield self.nooverlap.fix(sub)

    # ------------------------------------------------------- device events --
    def device_events(self, src: Source) -> Iterator[Batch]:
        """Netlink device events and hot-plug: instants on ``device <pci>`` / ``events``
        (name = kind, args = ctx, queue, tag, addr, arg, status); events of a function
        the capture does not describe go on the node's ``device events`` track.  The
        stream is in arrival order: each chunk is sorted, and an instant earlier than the
        last one of its track (previous chunk) is moved to that time, so per-track times
        stay monotonic."""
        node = self.node_track(src)
        kind_iid = np.zeros(256, np.int64)

        def make(fid: int) -> Track:
            if fid == NO_FID:
                return self.tracks.get(("devevents", src.node_idx), "device events", node,
                                       node=src.node_idx)
            return self._device_track(src, fid, "events")

        for ch in src.cap.chunks("device_events"):
            if not len(ch):
                continue
            ts = src.align.convert(ch["t_ns"].view(np.uint64)) if src.node_idx else \
                ch["t_ns"].astype(np.int64)
            # a fid added mid-capture (beyond meta.json's devices) gets its own group too
            tr = self._lookup_tracks(ch["fid"].astype(np.int64), make)
            o = np.lexsort((ts, tr))
            tr, ts, sub = tr[o], ts[o], ch[o]
            carry = self.counter_carry.setdefault(("devevents", src.node_idx), {})
            floor = np.array([carry.get(int(t), np.iinfo(np.int64).min) for t in tr.tolist()],
                             np.int64)
            ts = np.maximum(ts, floor)
            last = np.r_[tr[1:] != tr[:-1], True]
            for t, v in zip(tr[last].tolist(), ts[last].tolist(), strict=True):
                carry[int(t)] = int(v)
            kinds, cnt = np.unique(sub["kind"], return_counts=True)
            for k, c in zip(kinds.tolist(), cnt.tolist(), strict=True):
                n = DEVICE_EVENT_NAMES.get(k, f"event{k}")
                kind_iid[k] = self.names.iid(n)
                self.device_event_counts[n] = self.device_event_counts.get(n, 0) + c
            names = kind_iid[sub["kind"]]
            args = {a: sub[a].astype(np.uint64) for a in DEVICE_EVENT_ARGS}
            b = Batch(tr, ts, None, names, None, None, args)
            yield b.take(np.argsort(ts, kind="stable"))

    # ------------------------------------------------------------ counters --
    def counters(self, src: Source) -> Iterator[CounterBatch]:
        for ch in src.cap.chunks("counters"):
            for fid in np.unique(ch["fid"]).tolist():
                yield from self._counter_fid(src, int(fid), ch[ch["fid"] == fid])

    def _counter_fid(self, src: Source, fid: int, s: np.ndarray) -> Iterator[CounterBatch]:
        key = ("cnt", src.node_idx, fid)
        prev = self.counter_carry.get(key)
        self.counter_carry[key] = s[-1:].copy()
        if prev is not None:
            s = np.concatenate([prev, s])
        if len(s) < 2:
            return
        clk = src.clocks.get(fid, LinearClock(0, 0, 1.0))
        t = clk.convert(s["devclk"])
        dt = np.diff(t).astype(np.float64)
        ok = dt > 0
        dt = np.where(ok, dt, 1.0)
        ts = t[1:][ok]
        fn = src.cap.functions[fid] if fid < len(src.cap.functions) else None

        def d(col: str) -> np.ndarray:
            return np.diff(s[col].astype(np.int64)).astype(np.float64)[ok]

        dtt = dt[ok]
        series: list[tuple[str, str, np.ndarray]] = []
        for dirn in ("h2d", "d2h"):
            rate = d(f"{dirn}_bytes") / dtt  # bytes/ns == GB/s
            series.append((f"{dirn.upper()} GB/s", "GB/s", rate))
            bwmax = fn.max_bw(dirn) if fn else 0.0  # docs/hardware.md section 9
            if bwmax:
                series.append((f"{dirn.upper()} % of link max", "%",
                               np.minimum(100.0 * rate * 1e9 / bwmax, 100.0)))
        series.append(("DMA utilization %", "%",
                       np.minimum(100.0 * (d("busy_dma_h2d") + d("busy_dma_d2h")) / (2 * dtt),
                                  100.0)))
        comp = sum(d(f"busy_compute{i}") for i in range(4))
        series.append(("compute utilization %", "%", np.minimum(100.0 * comp / (4 * dtt), 100.0)))
        hits, miss = d("tlb_hits"), d("tlb_misses")
        tot = hits + miss
        m = tot > 0
        if m.any():
            series.append(("TLB hit rate %", "%", np.where(m, 100.0 * hits / np.maximum(tot, 1),
                                                           np.nan)))
        series += link_pm_series(s, ok, dtt)
        for name, unit, vals in series:
            tr = self._device_track(src, fid, name, kind="counter", unit=unit)
            good = np.isfinite(vals)
            yield CounterBatch(np.full(int(good.sum()), tr.idx), ts[good], vals[good])

    # ---------------------------------------------------------------- host --
    def host(self, src: Source) -> Iterator[Batch]:
        node = self.node_track(src)
        host = self.tracks.get(("host", src.node_idx), "host", node, "group", node=src.node_idx)
        n_sleep = self.names.iid("sleeping")
        n_wake = self.names.iid("wakeup")
        n_blk = self.names.iid("block read/write")
        n_blkr, n_blkw = self.names.iid("block read"), self.names.iid("block write")
        n_tx, n_rx = self.names.iid("net tx"), self.names.iid("net rx")
        for ch in src.cap.chunks("host"):
            ts = src.align.convert(ch["t_ns"].view(np.uint64)) if src.node_idx else \
                ch["t_ns"].astype(np.int64)
            k = ch["kind"]
            # scheduling: sleeping from switch-out (prev) to the next switch-in of that tid
            sw = k == HostKind.SCHED_SWITCH
            outs = sw & (ch["tid"] != 0)
            ins = sw & (ch["next_pid"] != 0)
            tid = np.concatenate([ch["tid"][outs], ch["next_pid"][ins]]).astype(np.int64)
            tt = np.concatenate([ts[outs], ts[ins]])
            typ = np.concatenate([np.zeros(int(outs.sum()), np.int8),
                                  np.ones(int(ins.sum()), np.int8)])
            carry = self.counter_carry.setdefault(("sched", src.node_idx), {})
            if carry:
                ct = np.array(list(carry.keys()), np.int64)
                tid = np.r_[ct, tid]
                tt = np.r_[np.array(list(carry.values()), np.int64), tt]
                typ = np.r_[np.zeros(len(ct), np.int8), typ]
                carry.clear()
            o = np.lexsort((typ, tt, tid))
            tid, tt, typ = tid[o], tt[o], typ[o]
            pair = (typ[:-1] == 0) & (typ[1:] == 1) & (tid[:-1] == tid[1:])
            i = np.flatnonzero(pair)
            last = np.r_[tid[1:] != tid[:-1], True] & (typ == 0)
            for t_, v in zip(tid[last].tolist(), tt[last].tolist(), strict=True):
                carry[int(t_)] = int(v)

            def in_thread(key: int) -> Track:
                """The thread's group when its process is known (sched records), else the
                node's host group."""
                pid = self.os_names(src)[1].get(key)
                return self.thread_track(src, pid, key) if pid else host

            def make_cpu(key: int) -> Track:
                return self.tracks.get(("cpu", src.node_idx, key),
                                       f"{self.thread_label(src, key)} CPU", in_thread(key),
                                       node=src.node_idx)

            if len(i):
                b = Batch(self._lookup_tracks(tid[i], make_cpu), tt[i], tt[i + 1] - tt[i],
                          np.full(len(i), n_sleep, np.int64))
                yield self.nooverlap.fix(b)
            wk = k == HostKind.SCHED_WAKEUP
            def make_wake(key: int) -> Track:
                return self.tracks.get(("wake", src.node_idx, key),
                                       f"{self.thread_label(src, key)} wakeups",
                                       in_thread(key), node=src.node_idx)

            if wk.any():
                yield Batch(self._lookup_tracks(ch["tid"][wk].astype(np.int64), make_wake),
                            ts[wk], None, np.full(int(wk.sum()), n_wake, np.int64))
            bc = k == HostKind.BLOCK_COMPLETE
            if bc.any():
                def make_blk(key: int) -> Track:
                    return self.tracks.get(("blk", src.node_idx, key),
                                           f"block {key >> 20}:{key & 0xFFFFF}", host,
                                           node=src.node_idx)

                sub = ch[bc]
                flow = self._block_flows(src, sub)
                b = Batch(self._lookup_tracks(sub["dev"].astype(np.int64), make_blk),
                          ts[bc] - sub["dur_ns"], sub["dur_ns"].astype(np.int64),
                          np.where(sub["prev_state"] == BlockOp.WRITE, n_blkw,
                                   np.where(sub["prev_state"] == BlockOp.READ, n_blkr,
                                            n_blk)).astype(np.int64),
                          flow, None if flow is None else np.zeros(len(sub), bool),
                          args={"bytes": sub["size"].astype(np.uint64),
                                "sector": sub["sector"].astype(np.uint64)})
                yield self.nooverlap.fix(b)
            net = (k == HostKind.NET_TX) | (k == HostKind.NET_RX)
            if net.any():
                sub = ch[net]

                def make_net(key: int) -> Track:
                    return self.tracks.get(("net", src.node_idx, key), f"net if{key}", host,
                                           node=src.node_idx)

                yield Batch(self._lookup_tracks(sub["dev"].astype(np.int64), make_net),
                            ts[net], None,
                            np.where(sub["kind"] == HostKind.NET_TX, n_tx, n_rx).astype(np.int64),
                            args={"bytes": sub["size"].astype(np.uint64)})

    def _block_flows(self, src: Source, blk: np.ndarray) -> np.ndarray | None:
        """Flow ids of block completions: a request issued on a thread inside one of its
        tensor read ranges (tensor_flows) is a step of that tensor's flow."""
        tf = self.tensor_flows(src)
        if tf is None or not len(tf.reads):
            return None
        issued = (blk["t_ns"] - blk["dur_ns"]).astype(np.int64)
        tid = blk["tid"].astype(np.int64)
        flow = np.zeros(len(blk), np.uint64)
        for rt, r0, r1, f in tf.reads.tolist():
            flow[(tid == rt) & (issued >= r0) & (issued <= r1)] = np.uint64(f)
        return flow if flow.any() else None

    def drops(self, src: Source) -> Iterator[Batch]:
        node = self.node_track(src)
        n = self.names.iid("records dropped")
        for ch in src.cap.chunks("drops"):
            tr = self.tracks.get(("drops", src.node_idx), "drops", node, node=src.node_idx)
            ts = src.align.convert(ch["t_ns"].view(np.uint64)) if src.node_idx else \
                ch["t_ns"].astype(np.int64)
            yield Batch(np.full(len(ch), tr.idx), ts, None, np.full(len(ch), n, np.int64),
                        args={"count": ch["count"].astype(np.uint64),
                              "source": ch["source"].astype(np.uint64)})

    def vm_pauses(self, src: Source) -> Iterator[Batch]:
        """The VM standing still (paused, or stopped to migrate: Capture.vm_pauses) on the
        node's ``VM paused`` track: one slice per pause, over the interval of the guest's
        clock it lies in (that clock stood still with it), named by its host time."""
        p = src.cap.vm_pauses()
        if not len(p):
            return
        tr = self.tracks.get(("vm", src.node_idx), "VM paused", self.node_track(src),
                             node=src.node_idx)
        lo, hi = p["t_lo"], p["t_hi"]
        if src.node_idx:
            lo = src.align.convert(lo.view(np.uint64))
            hi = src.align.convert(hi.view(np.uint64))
        names = np.array([self.names.iid(f"VM paused {ns / 1e6:.1f} ms (host time)")
                          for ns in p["paused_ns"]], np.int64)
        yield Batch(np.full(len(p), tr.idx), lo.astype(np.int64),
                    np.maximum(hi - lo, 0).astype(np.int64), names,
                    args={"paused_ns": p["paused_ns"].astype(np.uint64)})

    def _recv_ids(self, src: Source) -> list[int]:
        return [i for i, t in src.cap.strings.items() if t == "net_recv"]

    def network(self, src: Source) -> Iterator[Batch]:
        """Cross-node messages (tacc.timeline.cluster.messages) on the node's network
        tracks: ``net tx -> peer`` (the message's first packet sent, and the send) and
        ``net rx <- peer`` (its last packet received, and the receive's return), each
        a step of the message tag's cross-node flow."""
        msgs = self.messages
        if msgs is None or not len(msgs):
            return
        host = self.tracks.get(("host", src.node_idx), "host", self.node_track(src), "group",
                               node=src.node_idx)
        names = {s.node_idx: s.node for s in self.sources}
        for side, peer_col, what in (("src", "dst", "tx"), ("dst", "src", "rx")):
            m = msgs[msgs[side] == src.node_idx]
            if not len(m):
                continue
            parts: list[tuple[np.ndarray, np.ndarray, int]] = []
            pkt = m[what] != 0
            label = "message sent" if what == "tx" else "message received"
            when = m["send_start"] if what == "tx" else m["recv_end"]
            parts.append((when, np.ones(len(m), bool), self.names.iid(label)))
            parts.append((m[what], pkt, self.names.iid(f"packet {what}")))
            for ts, ok, nm in parts:
                sel = m[ok]
                peers = sel[peer_col].astype(np.int64)

                def make(k: int, what: str = what) -> Track:
                    arrow = "->" if what == "tx" else "<-"
                    return self.tracks.get(("xnet", src.node_idx, what, k),
                                           f"net {what} {arrow} {names.get(k, k)}", host,
                                           node=src.node_idx)

                o = np.argsort(ts[ok], kind="stable")
                yield Batch(self._lookup_tracks(peers[o], make), ts[ok][o].astype(np.int64),
                            None, np.full(len(sel), nm, np.int64),
                            flow_ids(0, sel["tag"][o], sel["tag"][o]), np.zeros(len(sel), bool),
                            {"tag": sel["tag"][o].astype(np.uint64),
                             "bytes": sel["bytes"][o].astype(np.uint64)})

    def all(self) -> Iterator[Batch | CounterBatch]:
        """Every batch of every source, stream by stream."""
        for src in self.sources:
            yield from self.network(src)
            yield from self.api(src)
            yield from self.driver(src)
            yield from self.device(src)
            yield from self._range_projection(src)
            yield from self.tlp(src)
            yield from self.device_events(src)
            yield from self.counters(src)
            yield from self.host(src)
            yield from self.drops(src)
            yield from self.vm_pauses(src)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"nodes": []}
        for src in self.sources:
            meta["nodes"].append({
                "node": src.node, "capture": str(src.cap.path), "complete": src.cap.complete,
                "problems": src.cap.problems,
                "align_to_reference": src.align.to_json(),
                "device_clocks": {src.cap.functions[f].pci: c.to_json()
                                  for f, c in src.clocks.items()},
                "kernel": src.cap.meta.get("kernel"), "qemu": src.cap.meta.get("qemu"),
                "icount": src.cap.meta.get("icount"),
                "time_scale": src.cap.meta.get("time_scale"),
            })
        if self.view is not None:
            meta["cluster"] = self.view.metadata()
        return meta
