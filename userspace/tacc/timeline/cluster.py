"""Several nodes on one timeline (docs/cluster.md).

The merged view of N captures, one per node:

* **node ids**: every capture names its node (meta.json ``node``); two captures of one
  node id are refused unless ``--rename CAPTURE=NAME`` tells them apart.
* **alignment**: node k's CLOCK_MONOTONIC -> the reference's (the first capture), by two
  independent methods, each an :class:`Offset` (node - reference, ns) with its bound:
  ``hostclk`` (both devices' host-clock register, QEMU's host realtime clock, read in the
  clock-sync brackets: bound = both half brackets + both fit residuals) and ``network``
  (taccd's four-timestamp exchanges, ``net_clock`` stream: bound = half the round trip of
  the best exchange + the fit residual).  ``used`` says which one maps the node; the
  default (``auto``) prefers the host clock and falls back to the network.
* **messages**: each ``net_send`` API record on node A joined to the ``net_recv`` record of
  the same tag on node B (k-th with k-th, per tag and pair of nodes), with the first
  packet the sending thread transmitted in the send (host ``net tx``) and the last packet
  node B received before the receive returned (host ``net rx``); all times on the
  reference timeline (:data:`MESSAGE_DTYPE`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tacc.capture import Capture, CaptureError
from tacc.capture.clock import IDENTITY, LinearClock, compose, fit_pairs
from tacc.capture.schema import HostKind
from tacc.errors import UsageError

ALIGN_METHODS = ("auto", "hostclk", "network")
# one flow id space for tags that cross nodes: top byte 0xFF (node flows use 1..N)
CROSS_FLOW = np.uint64(0xFF << 56)

MESSAGE_DTYPE = np.dtype([
    ("tag", "<u8"), ("src", "<u2"), ("dst", "<u2"), ("bytes", "<u8"),
    ("send_start", "<i8"), ("send_end", "<i8"),  # on the sender, reference timeline
    ("tx", "<i8"),  # first packet the sending thread transmitted in the send (0: none seen)
    ("rx", "<i8"),  # last packet the receiver got before its receive returned (0: none)
    ("recv_start", "<i8"), ("recv_end", "<i8"),  # on the receiver
    ("send_tid", "<u4"), ("recv_tid", "<u4"),
])


class ClusterError(CaptureError):
    """A merge that cannot be made (one line)."""


class ClusterOptionError(ClusterError, UsageError):
    """A merge the command line cannot mean: a --rename or --align value, too few
    captures (a usage error: exit status 2)."""


@dataclass
class Offset:
    """node CLOCK_MONOTONIC - reference CLOCK_MONOTONIC, within +- ``bound_ns``."""

    method: str
    offset_ns: float
    bound_ns: float
    at_ns: int  # reference time the estimate is stated at
    samples: int
    drift: float = 1.0  # node ns per reference ns
    detail: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NodeClock:
    node: str
    capture: str
    index: int
    used: str  # "reference" | "hostclk" | "network"
    align: LinearClock  # node mono -> reference mono
    hostclk: Offset | None = None
    network: Offset | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "capture": self.capture, "used": self.used,
                "hostclk": self.hostclk.to_json() if self.hostclk else None,
                "network": self.network.to_json() if self.network else None,
                "align_to_reference": self.align.to_json()}


# ------------------------------------------------------------------ node ids --
def parse_renames(items: list[str] | None) -> dict[str, str]:
    """``--rename CAPTURE=NAME`` (repeatable) -> {capture path or basename: name}."""
    out: dict[str, str] = {}
    for it in items or []:
        cap, sep, name = it.rpartition("=")
        if not sep or not cap or not name.strip():
            raise ClusterOptionError(f"--rename {it!r}: accepted: CAPTURE=NAME")
        out[cap.rstrip("/")] = name.strip()
    return out


def node_names(caps: list[Capture], renames: dict[str, str] | None = None) -> list[str]:
    """Each capture's node id (renamed), refusing a missing or repeated one."""
    renames = dict(renames or {})
    names: list[str] = []
    seen: dict[str, Capture] = {}
    for cap in caps:
        keys = {str(cap.path).rstrip("/"), cap.path.name, os.path.normpath(str(cap.path))}
        hit = [k for k in keys if k in renames]
        name = renames.pop(hit[0]) if hit else str(cap.meta.get("node") or "")
        for k in hit[1:]:
            renames.pop(k, None)
        if not name:
            raise ClusterError(f"{cap.path}: the capture names no node (meta.json 'node'); "
                               f"merging needs node ids: pass --rename {cap.path}=NAME")
        if name in seen:
            raise ClusterError(f"{seen[name].path} and {cap.path} have the same node id "
                               f"{name!r}; pass --rename {cap.path}=NAME to tell them apart")
        seen[name] = cap
        names.append(name)
    if renames:
        raise ClusterOptionError(f"--rename {next(iter(renames))}: no such capture among those "
                           f"merged")
    return names


# ----------------------------------------------------------------- host clock --
@dataclass
class HostFit:
    clock: LinearClock  # node mono -> host realtime ns
    half_bracket_ns: float  # widest half bracket of the pairs used
    lo: int
    hi: int


def host_fit(cap: Capture) -> HostFit | None:
    pairs = cap.read("clock_sync")
    sel = pairs[(pairs["hostclk"] != 0) & (pairs["mono_after"] >= pairs["mono_before"])]
    if len(sel) == 0:
        return None
    # the tight brackets only (a loaded host widens some by milliseconds): within twice
    # the tightest (+ 2 us), at least three pairs; the bound is the widest one kept
    width = sel["mono_after"] - sel["mono_before"]
    keep = width <= 2 * int(width.min()) + 2000
    if keep.sum() < min(3, len(sel)):
        keep = width <= np.sort(width)[min(3, len(sel)) - 1]
    sel = sel[keep]
    mid = (sel["mono_before"] + sel["mono_after"]) // 2
    hc = sel["hostclk"].astype(np.int64)
    clk = fit_pairs(mid.astype(np.uint64), hc, hc, 1.0, f"{cap.path.name} host clock")
    half = float(np.max(sel["mono_after"] - sel["mono_before"])) / 2.0
    return HostFit(clk, half, int(mid.min()), int(mid.max()))


def _at(c: LinearClock, t: int) -> int:
    return int(np.atleast_1d(c.convert(np.array([t], np.int64).view(np.uint64)))[0])


def _invert(c: LinearClock) -> LinearClock:
    return LinearClock(x0=c.y0, y0=c.x0, drift=1.0 / c.drift,
                       residual_max_ns=c.residual_max_ns, npairs=c.npairs)


def hostclk_alignment(ref: HostFit, node: HostFit) -> tuple[LinearClock, Offset]:
    """node mono -> reference mono through the host clock, and the offset it states."""
    align = compose(_invert(ref.clock), node.clock)
    lo, hi = max(ref.lo, _at(align, node.lo)), min(ref.hi, _at(align, node.hi))
    at = (lo + hi) // 2 if hi >= lo else ref.lo
    node_t = _at(_invert(align), at)
    bound = (ref.half_bracket_ns + node.half_bracket_ns + ref.clock.residual_max_ns
             + node.clock.residual_max_ns + 1.0)
    off = Offset("hostclk", float(node_t - at), bound, at,
                 min(ref.clock.npairs, node.clock.npairs), drift=1.0 / align.drift,
                 detail={"ref_half_bracket_ns": ref.half_bracket_ns,
                         "node_half_bracket_ns": node.half_bracket_ns,
                         "ref_residual_max_ns": ref.clock.residual_max_ns,
                         "node_residual_max_ns": node.clock.residual_max_ns})
    align = LinearClock(align.x0, align.y0, align.drift, align.residual_rms_ns,
                        align.residual_max_ns, bound, align.npairs)
    return align, off


# -------------------------------------------------------------------- network --
def exchanges(caps: list[Capture], names: list[str], ref: int, k: int) -> np.ndarray:
    """Every exchange between nodes ``ref`` and ``k`` as (t_ref, offset k - ref, half
    round trip), from both captures (either side may have asked)."""
    from tacc.capture.clockx import offsets

    rows = []
    for a, b, sign in ((ref, k, 1.0), (k, ref, -1.0)):
        recs = caps[a].read("net_clock")
        recs = recs[recs["peer_node"] == names[b].encode()[:24]]
        if len(recs) == 0:
            continue
        off, half = offsets(recs)
        # the requester's midpoint of t1..t4 is when the estimate holds
        t_req = (recs["t1"] + recs["t4"]) // 2
        t_ref = t_req if a == ref else (t_req + np.rint(off)).astype(np.int64)
        rows.append(np.stack([t_ref.astype(np.float64), sign * off, half], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 3))


def network_alignment(ex: np.ndarray) -> tuple[LinearClock, Offset]:
    """Offset and rate from the exchanges: the best (smallest round trip) states the
    offset and its bound; those within twice its round trip fit the rate."""
    best = int(np.argmin(ex[:, 2]))
    t_b, off_b, half_b = ex[best]
    good = ex[ex[:, 2] <= max(2.0 * half_b, half_b + 50_000.0)]
    slope = 0.0
    if len(good) >= 3 and np.ptp(good[:, 0]) > 0:
        w = 1.0 / np.maximum(good[:, 2], 1.0) ** 2
        mx, my = np.average(good[:, 0], weights=w), np.average(good[:, 1], weights=w)
        var = np.average((good[:, 0] - mx) ** 2, weights=w)
        slope = float(np.average((good[:, 0] - mx) * (good[:, 1] - my), weights=w) / var)
        if abs(slope) > 1e-3:  # not a clock rate: a bad sample set, keep the offset only
            slope = 0.0
    pred = off_b + slope * (good[:, 0] - t_b)
    resid = float(np.max(np.abs(good[:, 1] - pred))) if len(good) else 0.0
    # a sample's interval [off - half, off + half] holds the truth: a fit line leaving one
    # by more than its half width adds that to the bound
    excess = float(np.max(np.maximum(np.abs(good[:, 1] - pred) - good[:, 2], 0.0)))
    bound = float(half_b) + excess
    off = Offset("network", float(off_b), bound, int(t_b), int(len(ex)), drift=1.0 + slope,
                 detail={"best_half_round_trip_ns": float(half_b),
                         "median_half_round_trip_ns": float(np.median(ex[:, 2])),
                         "rate_samples": float(len(good)), "fit_residual_max_ns": resid})
    # node mono x -> ref mono: x at node time (t_b + off_b) is t_b; rate 1 / (1 + slope)
    align = LinearClock(x0=int(round(t_b + off_b)), y0=int(t_b), drift=1.0 / (1.0 + slope),
                        residual_max_ns=resid, bracket_ns=bound, npairs=int(len(good)))
    return align, off


# ------------------------------------------------------------------ alignment --
def align_nodes(caps: list[Capture], names: list[str], method: str = "auto"
                ) -> list[NodeClock]:
    """Each node's clock on the reference (first) node's CLOCK_MONOTONIC."""
    if method not in ALIGN_METHODS:
        raise ClusterOptionError(f"--align {method}: accepted: {', '.join(ALIGN_METHODS)}")
    fits = [host_fit(c) for c in caps]
    out = [NodeClock(names[0], str(caps[0].path), 0, "reference", IDENTITY)]
    for k in range(1, len(caps)):
        nc = NodeClock(names[k], str(caps[k].path), k, "", IDENTITY)
        h_align = n_align = None
        if fits[0] is not None and fits[k] is not None:
            h_align, nc.hostclk = hostclk_alignment(fits[0], fits[k])  # type: ignore[arg-type]
        ex = exchanges(caps, names, 0, k)
        if len(ex):
            n_align, nc.network = network_alignment(ex)
        if method in ("auto", "hostclk") and h_align is not None:
            nc.used, nc.align = "hostclk", h_align
        elif method in ("auto", "network") and n_align is not None:
            nc.used, nc.align = "network", n_align
        else:
            have = [m for m, a in (("hostclk", h_align), ("network", n_align)) if a]
            why = (f"it has only {have[0]} alignment (--align {have[0]} or auto)" if have else
                   "neither host-clock pairs (clock_sync with hostclk) nor network clock "
                   f"exchanges with {names[0]} (net_clock; tacc trace start --peers)")
            raise ClusterError(f"{caps[k].path}: node {names[k]} has no clock pairs to "
                               f"align it with {names[0]}: {why}")
        out.append(nc)
    return out


def to_reference(nc: NodeClock, t: np.ndarray) -> np.ndarray:
    t = np.asarray(t, np.int64)
    if nc.used == "reference":
        return t.copy()
    return nc.align.convert(t.view(np.uint64))


# ------------------------------------------------------------------- messages --
def _api_of(cap: Capture, name: str) -> np.ndarray:
    ids = [i for i, s in cap.strings.items() if s == name]
    api = cap.read("api")
    return api[np.isin(api["name_id"], ids)] if ids else api[:0]


def messages(caps: list[Capture], clocks: list[NodeClock]) -> np.ndarray:
    """Every cross-node message (:data:`MESSAGE_DTYPE`), in send order."""
    sends = [_api_of(c, "net_send") for c in caps]
    recvs = [_api_of(c, "net_recv") for c in caps]
    hosts = [c.read("host") for c in caps]
    rows: list[tuple[Any, ...]] = []
    for a in range(len(caps)):
        if not len(sends[a]):
            continue
        for b in range(len(caps)):
            if a == b or not len(recvs[b]):
                continue
            shared = np.intersect1d(sends[a]["tag"], recvs[b]["tag"])
            shared = shared[shared != 0]
            if not len(shared):
                continue
            s_all = sends[a][np.isin(sends[a]["tag"], shared)]
            r_all = recvs[b][np.isin(recvs[b]["tag"], shared)]
            s_all = s_all[np.lexsort((s_all["t_start"], s_all["tag"]))]
            r_all = r_all[np.lexsort((r_all["t_end"], r_all["tag"]))]
            tx = hosts[a][hosts[a]["kind"] == HostKind.NET_TX]
            rx = hosts[b][hosts[b]["kind"] == HostKind.NET_RX]
            rx_t = np.sort(rx["t_ns"])
            for tag in shared.tolist():
                ss = s_all[s_all["tag"] == tag]
                rr = r_all[r_all["tag"] == tag]
                for s, r in zip(ss, rr, strict=False):
                    m = (tx["tid"] == s["tid"]) & (tx["t_ns"] >= s["t_start"]) & \
                        (tx["t_ns"] <= s["t_end"])
                    t_tx = int(tx["t_ns"][m].min()) if m.any() else 0
                    i = int(np.searchsorted(rx_t, r["t_end"], side="right")) - 1
                    t_rx = int(rx_t[i]) if i >= 0 and rx_t[i] >= r["t_start"] else 0
                    rows.append((tag, a, b, int(s["bytes"]), int(s["t_start"]),
                                 int(s["t_end"]), t_tx, t_rx, int(r["t_start"]),
                                 int(r["t_end"]), int(s["tid"]), int(r["tid"])))
    out = np.array(rows, MESSAGE_DTYPE) if rows else np.zeros(0, MESSAGE_DTYPE)
    for col, side in (("send_start", "src"), ("send_end", "src"), ("tx", "src"),
                      ("rx", "dst"), ("recv_start", "dst"), ("recv_end", "dst")):
        for k, nc in enumerate(clocks):
            m = (out[side] == k) & (out[col] != 0)
            if m.any():
                out[col][m] = to_reference(nc, out[col][m])
    return out[np.argsort(out["send_start"], kind="stable")]


def cross_tags(msgs: np.ndarray) -> np.ndarray:
    return np.unique(msgs["tag"]) if len(msgs) else np.zeros(0, np.uint64)


@dataclass
class ClusterView:
    """What the timeline and the cross-node rules read."""

    caps: list[Capture]
    names: list[str]
    clocks: list[NodeClock]
    messages: np.ndarray

    def metadata(self) -> dict[str, Any]:
        fwd = self.messages["tx"] < self.messages["rx"]
        both = (self.messages["tx"] != 0) & (self.messages["rx"] != 0)
        return {"reference": self.names[0], "nodes": [c.to_json() for c in self.clocks],
                "messages": int(len(self.messages)),
                "messages_with_packets": int(both.sum()),
                "packets_forward_in_time": int((fwd & both).sum())}


def open_view(caps: list[Capture], renames: dict[str, str] | None = None,
              method: str = "auto") -> ClusterView:
    names = node_names(caps, renames)
    clocks = align_nodes(caps, names, method)
    return ClusterView(caps, names, clocks, messages(caps, clocks))


def load_view(paths: list[str | os.PathLike[str]], renames: list[str] | None = None,
              method: str = "auto") -> ClusterView:
    from tacc.capture import open_capture

    if len(paths) < 2:
        raise ClusterOptionError("a cluster merge needs two or more captures (one per node)")
    return open_view([open_capture(Path(p)) for p in paths], parse_renames(renames), method)
