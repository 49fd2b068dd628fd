"""Cross-node rules over a merged view (tacc.timeline.cluster.ClusterView; docs/analysis.md
"Cluster rules", docs/cluster.md).

* ``pipeline_bubble``: a node's device idle while the thread that feeds it waits in a
  receive from a peer (a ``net_recv`` API span on a thread that also submits device
  work): time lost per node, the peer and link the wait was for, and what bound it
  (the peer's device busy, or the message in flight on the network).
* ``network_bound``: time a link had a message in flight (send start to the packet that
  completed it, else the receive's return) while neither the sending nor the receiving
  device worked: the network paced the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tacc.capture.clock import compose
from tacc.timeline.cluster import ClusterView, to_reference

from .data import merged
from .rules import Finding


@dataclass
class ClusterThresholds:
    bubble_share: float = 0.10  # bubble time / the node's pipeline span
    bubble_min_ns: int = 1_000_000
    network_share: float = 0.5  # link in flight with both devices idle / pipeline span
    network_min_ns: int = 1_000_000
    max_ranges: int = 50

    def update(self, kv: dict[str, Any]) -> None:
        for k, v in kv.items():
            if k not in self.__dataclass_fields__:
                raise KeyError(k)
            setattr(self, k, type(getattr(self, k))(v))


ClusterRule = Callable[[ClusterView, ClusterThresholds], list[Finding]]
CLUSTER_RULES: dict[str, ClusterRule] = {}


def cluster_rule(name: str) -> Callable[[ClusterRule], ClusterRule]:
    def deco(fn: ClusterRule) -> ClusterRule:
        CLUSTER_RULES[name] = fn
        return fn

    return deco


# ------------------------------------------------------------------ helpers --
def device_busy(view: ClusterView, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Node k's device busy intervals (every function, merged) on the reference time."""
    cap, nc = view.caps[k], view.clocks[k]
    ts_all, te_all = [], []
    for ch in cap.chunks("device_trace"):
        for fid in np.unique(ch["fid"]).tolist():
            if fid >= len(cap.functions):
                continue
            clk = cap.device_clock(int(fid))
            if nc.used != "reference":
                clk = compose(nc.align, clk)
            m = ch["fid"] == fid
            ts_all.append(clk.convert(ch["t_start"][m]))
            te_all.append(clk.convert(ch["t_end"][m]))
    if not ts_all:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ts, te = np.concatenate(ts_all), np.concatenate(te_all)
    return merged(ts, np.maximum(te, ts))


def _names(view: ClusterView, k: int, *names: str) -> list[int]:
    return [i for i, s in view.caps[k].strings.items() if s in names]


def waits(view: ClusterView, k: int) -> np.ndarray:
    """``net_recv`` spans of node k on threads that also submit device work (API calls
    with a tag other than sends and receives), reference time: (start, end, tid, tag)."""
    api = view.caps[k].read("api")
    if not len(api):
        return np.zeros((0, 4), np.int64)
    net = np.isin(api["name_id"], _names(view, k, "net_recv", "net_send"))
    recv = np.isin(api["name_id"], _names(view, k, "net_recv"))
    feeders = np.unique(api["tid"][~net & (api["tag"] != 0)])
    w = api[recv & np.isin(api["tid"], feeders)]
    s = to_reference(view.clocks[k], w["t_start"])
    e = to_reference(view.clocks[k], w["t_end"])
    return np.stack([s, e, w["tid"].astype(np.int64), w["tag"].view(np.int64)], axis=1)


def subtract(s: np.ndarray, e: np.ndarray, bs: np.ndarray, be: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Intervals [s, e) minus the union [bs, be) (sorted, disjoint): the idle parts."""
    out_s, out_e = [], []
    for a, b in zip(s.tolist(), e.tolist(), strict=True):
        i = int(np.searchsorted(be, a, side="right"))
        cur = a
        while cur < b and i < len(bs) and bs[i] < b:
            if bs[i] > cur:
                out_s.append(cur)
                out_e.append(int(bs[i]))
            cur = max(cur, int(be[i]))
            i += 1
        if cur < b:
            out_s.append(cur)
            out_e.append(b)
    return np.array(out_s, np.int64), np.array(out_e, np.int64)


def overlap(s: np.ndarray, e: np.ndarray, bs: np.ndarray, be: np.ndarray) -> int:
    """Total length of [s, e) intervals inside the union [bs, be)."""
    if not len(s) or not len(bs):
        return 0
    i_s, i_e = subtract(s, e, bs, be)
    return int((e - s).sum() - (i_e - i_s).sum())


def _span(view: ClusterView, k: int, busy: tuple[np.ndarray, np.ndarray]) -> tuple[int, int]:
    """Node k's pipeline span: from its first message (sent or received) to its last.
    Device work before the first message (weights uploaded while the peer starts) is
    set-up, not pipeline time; a node without messages spans its device work."""
    m = view.messages
    mine = m[(m["src"] == k) | (m["dst"] == k)]
    if len(mine):
        return (int(np.where(mine["src"] == k, mine["send_start"], mine["recv_start"]).min()),
                int(np.where(mine["src"] == k, mine["send_end"], mine["recv_end"]).max()))
    if len(busy[0]):
        return int(busy[0][0]), int(busy[1][-1])
    return 0, 0


def _ranges(s: np.ndarray, e: np.ndarray, n: int) -> list[list[int]]:
    o = np.sort(np.argsort(-(e - s), kind="stable")[:n])
    return [[int(s[i]), int(e[i])] for i in o]


def _link(view: ClusterView, a: int, b: int) -> str:
    return f"{view.names[a]} -> {view.names[b]}"


# -------------------------------------------------------------------- rules --
@cluster_rule("pipeline_bubble")
def pipeline_bubble(view: ClusterView, th: ClusterThresholds) -> list[Finding]:
    out = []
    busy = [device_busy(view, k) for k in range(len(view.caps))]
    m = view.messages
    for k in range(len(view.caps)):
        w = waits(view, k)
        lo, hi = _span(view, k, busy[k])
        if not len(w) or hi <= lo:
            continue
        bs, be = subtract(np.clip(w[:, 0], lo, hi), np.clip(w[:, 1], lo, hi), *busy[k])
        lost = int((be - bs).sum())
        span = hi - lo
        if lost < th.bubble_min_ns or lost < th.bubble_share * span:
            continue
        # whom each wait was for: the message it received (same tag, this node receiving)
        per_peer: dict[int, int] = {}
        bound: dict[str, int] = {"peer device": 0, "network": 0, "peer host": 0}
        for (s, e, tid, tag) in w.tolist():
            mm = m[(m["dst"] == k) & (m["recv_tid"] == tid)
                   & (m["tag"] == np.uint64(tag & 0xFFFFFFFFFFFFFFFF))
                   & (m["recv_start"] == s)]
            if not len(mm):
                continue
            msg = mm[0]
            idle = subtract(np.array([s]), np.array([e]), *busy[k])
            idle_ns = int((idle[1] - idle[0]).sum())
            if not idle_ns:
                continue
            p = int(msg["src"])
            per_peer[p] = per_peer.get(p, 0) + idle_ns
            arrive = int(msg["rx"] or msg["recv_end"])
            flight = np.array([max(int(msg["send_start"]), s)]), np.array([max(arrive, s)])
            net = int(flight[1][0] - flight[0][0])
            peer_dev = overlap(idle[0], idle[1], *busy[p])
            bound["network"] += min(net, idle_ns)
            bound["peer device"] += min(peer_dev, max(idle_ns - net, 0))
            bound["peer host"] += max(idle_ns - net - peer_dev, 0)
        peer = max(per_peer, key=lambda p: per_peer[p]) if per_peer else -1
        what = max(bound, key=lambda b: bound[b])
        link = _link(view, peer, k) if peer >= 0 else "?"
        out.append(Finding(
            rule="pipeline_bubble",
            title=(f"{view.names[k]}'s device idled {lost / 1e6:.1f} ms "
                   f"({100 * lost / span:.0f} % of its pipeline span) waiting for "
                   f"{view.names[peer] if peer >= 0 else 'a peer'} (link {link}; "
                   f"bound by the {what})"),
            time_ranges=_ranges(bs, be, th.max_ranges),
            evidence={"node": view.names[k], "bubble_ns": lost, "span_ns": span,
                      "share": lost / span, "waits": int(len(w)),
                      "peer": view.names[peer] if peer >= 0 else "",
                      "link": link,
                      "per_peer_ns": {view.names[p]: v for p, v in per_peer.items()},
                      "bound_by": what, "bound_ns": bound},
            time_lost_ns=lost,
            suggestion=("keep several (micro-)batches in flight: send batch i+1 (or its "
                        "micro-batches) before waiting for batch i's answer, and receive on "
                        "a separate thread, so each stage's device works while its peer and "
                        "the network do"),
            node=view.names[k], severity="high" if lost >= 0.3 * span else "medium",
            share=lost / span, active_range=[lo, hi], active_span_ns=span))
    return out


@cluster_rule("network_bound")
def network_bound(view: ClusterView, th: ClusterThresholds) -> list[Finding]:
    out = []
    m = view.messages
    if not len(m):
        return out
    busy = [device_busy(view, k) for k in range(len(view.caps))]
    lo, hi = int(m["send_start"].min()), int(m["recv_end"].max())  # the message window
    span = max(hi - lo, 1)
    for a in range(len(view.caps)):
        for b in range(len(view.caps)):
            mm = m[(m["src"] == a) & (m["dst"] == b)]
            if not len(mm):
                continue
            arrive = np.where(mm["rx"] != 0, mm["rx"], mm["recv_end"])
            fs, fe = merged(mm["send_start"], np.maximum(arrive, mm["send_start"]))
            ds, de = merged(np.concatenate([busy[a][0], busy[b][0]]),
                            np.concatenate([busy[a][1], busy[b][1]]))
            gs, ge = subtract(fs, fe, ds, de)
            lost = int((ge - gs).sum())
            if lost < th.network_min_ns or lost < th.network_share * span:
                continue
            nbytes = int(mm["bytes"].sum())
            flight = int((fe - fs).sum())
            link = _link(view, a, b)
            out.append(Finding(
                rule="network_bound",
                title=(f"link {link}: messages in flight with both devices idle for "
                       f"{lost / 1e6:.1f} ms ({100 * lost / span:.0f} % of the pipeline); "
                       f"{nbytes / max(flight, 1) * 1e3:.2f} MB/s achieved"),
                time_ranges=_ranges(gs, ge, th.max_ranges),
                evidence={"link": link, "messages": int(len(mm)), "bytes": nbytes,
                          "in_flight_ns": flight, "idle_in_flight_ns": lost,
                          "span_ns": span, "achieved_bytes_per_s": nbytes / max(flight, 1)
                          * 1e9},
                time_lost_ns=lost,
                suggestion=("send fewer bytes over the link (cut the model where the "
                            "activations are narrow, or compress them) or overlap the "
                            "transfers with compute (micro-batches in flight)"),
                node=view.names[b], severity="high" if lost >= 0.3 * span else "medium",
                share=lost / span, active_range=[lo, hi], active_span_ns=span))
    return out


def analyze_cluster(view: ClusterView, th: ClusterThresholds | None = None,
                    rules: list[str] | None = None) -> list[Finding]:
    """The cross-node rules on the merged view (the per-node rules: tacc analyze)."""
    th = th or ClusterThresholds()
    found: list[Finding] = []
    for name, fn in CLUSTER_RULES.items():
        if rules and name not in rules:
            continue
        found.extend(fn(view, th))
    for i, f in enumerate(found):
        f.id = f"cluster-{i + 1}-{f.rule}"
        f.capture_share = f.share
    return found
