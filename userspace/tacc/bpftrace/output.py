"""Text and JSON rendering of accel-bpftrace results (pure functions, host-tested)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tacc.capture.schema import DriverKind
from tacc.devices import devid_to_pci

SNOOP_HEADER = (f"{'TIME(s)':>12} {'PID':>7} {'COMM':<16} {'DEVICE':<12} {'CTX':>3} {'Q':>1} "
                f"{'TAG':>18} {'EVENT':<6} {'SEQNO':>6} {'CMDS':>4} {'BYTES':>10} {'LAT(us)':>9}")


def snoop_rows(ev: np.ndarray, t0_ns: int) -> list[dict[str, Any]]:
    """Submissions and completions as dicts (the JSON form of a snoop line)."""
    sel = np.isin(ev["kind"], [int(DriverKind.SUBMIT), int(DriverKind.JOB_DONE)])
    rows = []
    for e in ev[sel]:
        done = int(e["kind"]) == DriverKind.JOB_DONE
        rows.append({
            "time_s": (int(e["ts"]) - t0_ns) / 1e9,
            "event": "done" if done else "submit",
            "pid": int(e["pid"]), "comm": e["comm"].decode(errors="replace"),
            "device": devid_to_pci(int(e["dev"])), "ctx": int(e["x"]), "queue": int(e["y"]),
            "tag": int(e["tag"]), "seqno": int(e["a"]),
            "cmds": None if done else int(e["v"]),
            "bytes": None if done else int(e["b"]),
            "latency_us": int(e["d"]) / 1e3 if done and int(e["d"]) else None,
            "error": int(e["z"]) if done else 0,
            "dev_ticks": int(e["c"]) - int(e["b"]) if done else None,
        })
    return rows


def snoop_line(r: dict[str, Any]) -> str:
    lat = f"{r['latency_us']:9.1f}" if r["latency_us"] is not None else f"{'-':>9}"
    cmds = f"{r['cmds']:>4}" if r["cmds"] is not None else f"{'-':>4}"
    nbytes = f"{r['bytes']:>10}" if r["bytes"] is not None else f"{'-':>10}"
    ev = r["event"] if not r["error"] else f"err{r['error']}"
    return (f"{r['time_s']:12.6f} {r['pid']:>7} {r['comm'][:16]:<16} {r['device']:<12} "
            f"{r['ctx']:>3} {r['queue']:>1} {r['tag']:#18x} {ev:<6} {r['seqno']:>6} "
            f"{cmds} {nbytes} {lat}")


def log2_hist(slots: dict[int, int], unit: str, width: int = 40) -> list[str]:
    """bcc-style log2 histogram; slot s counts values in [2^s, 2^(s+1)) (slot 0: 0..1)."""
    if not slots:
        return [f"{'(no samples)':>28}"]
    hi = max(slots)
    top = max(slots.values())
    lines = [f"{unit:>20} : count     distribution"]
    for s in range(0, hi + 1):
        lo = 0 if s == 0 else 1 << s
        up = (1 << (s + 1)) - 1
        c = slots.get(s, 0)
        bar = "*" * (c * width // top if top else 0)
        lines.append(f"{lo:>10} -> {up:<10} : {c:<9} |{bar:<{width}}|")
    return lines


def hist_stats(slots: dict[int, int]) -> dict[str, Any]:
    n = sum(slots.values())
    return {"count": n, "slots": {str(k): v for k, v in sorted(slots.items())}}


WHICH = {0: "submit_to_complete_ns", 1: "queue_wait_ns", 2: "device_ticks"}


def latency_report(h: dict[tuple[int, int, int], dict[int, int]], as_json: bool) -> list[str]:
    groups: dict[tuple[int, int], dict[int, dict[int, int]]] = {}
    for (dev, q, which), slots in h.items():
        groups.setdefault((dev, q), {})[which] = slots
    if as_json:
        out = [{"device": devid_to_pci(dev), "queue": q,
                **{WHICH[w]: hist_stats(s) for w, s in sorted(ws.items())}}
               for (dev, q), ws in sorted(groups.items())]
        return [json.dumps({"latency": out})]
    lines: list[str] = []
    for (dev, q), ws in sorted(groups.items()):
        for w, title, unit in ((0, "submit -> complete", "nsecs"), (1, "queue wait", "nsecs"),
                               (2, "device execution", "ticks")):
            lines.append(f"device {devid_to_pci(dev)} queue {q}: {title}")
            lines.extend(log2_hist(ws.get(w, {}), unit))
            lines.append("")
    if not lines:
        lines.append("no jobs completed")
    return lines


def top_rows(cur: dict[int, dict[str, Any]], prev: dict[int, dict[str, Any]], dt: float,
             clock_hz: float) -> list[dict[str, Any]]:
    rows = []
    for pid, v in cur.items():
        p = prev.get(pid, {})
        d = {k: int(v[k]) - int(p.get(k, 0)) for k in ("jobs", "cmds", "bytes", "busy_ticks",
                                                       "errors", "lat_ns", "submits")}
        rows.append({
            "pid": pid, "comm": v["comm"], "jobs_s": d["jobs"] / dt, "cmds_s": d["cmds"] / dt,
            "bytes_s": d["bytes"] / dt,
            "busy_pct": 100.0 * d["busy_ticks"] / clock_hz / dt if clock_hz else 0.0,
            "avg_lat_us": d["lat_ns"] / d["jobs"] / 1e3 if d["jobs"] else 0.0,
            "errors": d["errors"], "jobs_total": int(v["jobs"]),
        })
    rows.sort(key=lambda r: (-r["jobs_s"], r["pid"]))
    return rows


def top_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'PID':>7} {'COMM':<16} {'JOBS/s':>9} {'CMDS/s':>9} {'BYTES/s':>11} "
             f"{'BUSY%':>6} {'LAT(us)':>9} {'ERR':>4} {'JOBS':>8}"]
    for r in rows:
        lines.append(f"{r['pid']:>7} {r['comm'][:16]:<16} {r['jobs_s']:9.1f} "
                     f"{r['cmds_s']:9.1f} {r['bytes_s']:11.0f} {r['busy_pct']:6.1f} "
                     f"{r['avg_lat_us']:9.1f} {r['errors']:>4} {r['jobs_total']:>8}")
    return lines


def dma_lines(per: dict[int, dict[str, Any]], hist: dict[tuple[int, int], dict[int, int]],
              dt: float) -> list[str]:
    lines = [f"{'PID':>7} {'COMM':<16} {'MAPS':>6} {'MAP_B':>11} {'MAP/s':>8} "
             f"{'AVG_MAP_us':>10} {'UNMAPS':>6} {'UNMAP_B':>11} {'AVG_UNMAP_us':>12}"]
    for pid, v in sorted(per.items()):
        am = v["map_ns"] / v["maps"] / 1e3 if v["maps"] else 0.0
        au = v["unmap_ns"] / v["unmaps"] / 1e3 if v["unmaps"] else 0.0
        lines.append(f"{pid:>7} {v['comm'][:16]:<16} {v['maps']:>6} {v['map_bytes']:>11} "
                     f"{v['maps'] / dt:8.1f} {am:10.1f} {v['unmaps']:>6} "
                     f"{v['unmap_bytes']:>11} {au:12.1f}")
    for (pid, d), slots in sorted(hist.items()):
        lines.append("")
        lines.append(f"pid {pid} {'unmap' if d else 'map'} sizes")
        lines.extend(log2_hist(slots, "bytes"))
    return lines
