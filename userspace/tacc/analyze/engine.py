"""Run the rules over a capture; findings.json (versioned) and the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tacc import __version__
from tacc.capture import Capture
from tacc.capture.schema import NO_FID

from .data import Data, load
from .rules import RULES, Finding, Thresholds

FINDINGS_SCHEMA = "tacc-findings"
FINDINGS_VERSION = 1  # major: readers reject another one
# minor 1 (issue 13): capture.span_ns; per finding active_range, active_span_ns, share
# (of the active span: what the severity is judged on) and capture_share
FINDINGS_MINOR = 1


def active_ranges(d: Data) -> dict[int, tuple[int, int]]:
    """Per function (fid): first to last device or API activity in the capture.

    Device activity: a command from its fetch to its end (device trace); API activity: a
    runtime API call naming the function (API ring, ``fid``).  Driver events alone (an
    ioctl, a PM transition) are not activity: they do not start a function's span."""
    out: dict[int, tuple[int, int]] = {}

    def widen(fid: int, lo: int, hi: int) -> None:
        a, b = out.get(fid, (lo, hi))
        out[fid] = (min(a, lo), max(b, hi))

    c = d.cmds
    if len(c):
        start = np.minimum(c.tf, c.ts)
        for fid in np.unique(c.fid).tolist():
            m = c.fid == fid
            widen(int(fid), int(start[m].min()), int(c.te[m].max()))
    api = d.api
    if len(api) and "fid" in (api.dtype.names or ()):
        for fid in np.unique(api["fid"]).tolist():
            if fid == NO_FID:
                continue
            m = api["fid"] == fid
            widen(int(fid), int(api["t_start"][m].min()), int(api["t_end"][m].max()))
    return out


def _judge(f: Finding, d: Data, ranges: dict[int, tuple[int, int]], th: Thresholds) -> None:
    """Active span of the finding (its functions' activity, and its own time ranges), the
    shares, and the severity from the share of the active span."""
    by_pci = {fn.pci: fn.fid for fn in d.functions}
    spans = [ranges[by_pci[p]] for p in f.functions if by_pci.get(p) in ranges]
    spans += [(int(a), int(b)) for a, b in f.time_ranges]
    if spans:
        lo = max(min(a for a, _ in spans), d.t0)
        hi = min(max(b for _, b in spans), d.t1)
    else:
        lo, hi = d.t0, d.t1
    if hi <= lo:
        lo, hi = d.t0, d.t1
    f.active_range = [lo, hi]
    f.active_span_ns = max(hi - lo, 1)
    f.share = min(f.time_lost_ns / f.active_span_ns, 1.0)
    f.capture_share = min(f.time_lost_ns / d.span, 1.0)
    f.severity = ("high" if f.share >= th.severity_high else
                  "medium" if f.share >= th.severity_medium else "low")


def analyze(cap: Capture, th: Thresholds | None = None, rules: list[str] | None = None
            ) -> list[Finding]:
    th = th or Thresholds()
    d = load(cap)
    found: list[Finding] = []
    for name, fn in RULES.items():
        if rules and name not in rules:
            continue
        found.extend(fn(d, th))
    ranges = active_ranges(d)
    for f in found:
        _judge(f, d, ranges, th)
        f.node = cap.node
    order = {"high": 0, "medium": 1, "low": 2}
    found.sort(key=lambda f: (order[f.severity], -f.time_lost_ns, f.rule))
    for i, f in enumerate(found):
        f.id = f"{cap.node}-{i + 1}-{f.rule}"
    return found


def to_json(cap: Capture, findings: list[Finding], th: Thresholds) -> dict[str, Any]:
    t0, t1 = cap.time_range
    return {
        "schema": FINDINGS_SCHEMA,
        "version": FINDINGS_VERSION,
        "minor": FINDINGS_MINOR,
        "generator": f"tacc {__version__}",
        "capture": {"path": str(cap.path), "node": cap.node, "complete": cap.complete,
                    "t_start_ns": t0, "t_end_ns": t1, "span_ns": t1 - t0,
                    "problems": cap.problems},
        "thresholds": th.__dict__,
        "findings": [f.to_json() for f in findings],
    }


def load_thresholds(path: str | Path | None, overrides: list[str]) -> Thresholds:
    th = Thresholds()
    if path:
        text = Path(path).read_text()
        if str(path).endswith(".toml"):
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
        th.update(data.get("thresholds", data))
    kv = {}
    for o in overrides:
        k, _, v = o.partition("=")
        kv[k.strip()] = v.strip()
    th.update(kv)
    return th


def write_table(out: TextIO, findings: list[Finding], span_ns: int, t0_ns: int = 0) -> None:
    """The findings as a table, then each one's ranges (ms from the capture's start,
    ``t0_ns``) and evidence (floats to 4 significant digits, ``*_ns`` as ms, bytes with a
    binary unit; findings.json keeps the exact values)."""
    if not findings:
        out.write("no findings\n")
        return
    out.write(f"capture span {span_ns / 1e6:.1f} ms; lost % and severity are of each "
              "finding's active span (first to last device or API activity of its "
              "functions); times are ms from the capture's start\n")
    out.write(f"{'#':>2} {'severity':<8} {'rule':<18} {'lost ms':>9} {'lost %':>7} "
              f"{'active ms':>10}  title\n")
    for i, f in enumerate(findings, 1):
        out.write(f"{i:>2} {f.severity:<8} {f.rule:<18} {f.time_lost_ns / 1e6:>9.2f} "
                  f"{100 * f.share:>6.1f}% {f.active_span_ns / 1e6:>10.2f}  {f.title}\n")
    out.write("\n")
    for i, f in enumerate(findings, 1):
        rng = f.time_ranges[0] if f.time_ranges else None
        where = (f"{len(f.time_ranges)} range(s), first {(rng[0] - t0_ns) / 1e6:.3f}-"
                 f"{(rng[1] - t0_ns) / 1e6:.3f} ms" if rng else "")
        out.write(f"[{i}] {f.rule}: {where}\n    evidence: ")
        out.write(", ".join(_evidence(k, v) for k, v in f.evidence.items()))
        out.write(f"\n    suggestion: {f.suggestion}\n")


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def _evidence(key: str, v: Any) -> str:
    """One ``key=value`` of a finding's evidence, as the table shows it."""
    from tacc.timeline.summary import fmt_bytes

    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    if num and (key.endswith("_ns") or "_ns_" in key):  # walk_ns_estimate, idle_ns
        scale, unit = next((d, u) for d, u in ((1e6, "ms"), (1e3, "us"), (1, "ns"))
                           if abs(v) >= d or u == "ns")
        return f"{key.replace('_ns', '')}={v / scale:.4g} {unit}"
    if num and "bytes" in key:
        return f"{key}={fmt_bytes(v)}"
    return f"{key}={_short(_round(v))}"


def _short(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 80 else s[:77] + "..."
