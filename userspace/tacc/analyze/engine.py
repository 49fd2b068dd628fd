"""Run the rules over a capture; findings.json (versioned) and the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from tacc import __version__
from tacc.capture import Capture

from .data import load
from .rules import RULES, Finding, Thresholds

FINDINGS_SCHEMA = "tacc-findings"
FINDINGS_VERSION = 1


def analyze(cap: Capture, th: Thresholds | None = None, rules: list[str] | None = None
            ) -> list[Finding]:
    th = th or Thresholds()
    d = load(cap)
    found: list[Finding] = []
    for name, fn in RULES.items():
        if rules and name not in rules:
            continue
        found.extend(fn(d, th))
    for f in found:
        share = f.time_lost_ns / d.span
        f.severity = ("high" if share >= th.severity_high else
                      "medium" if share >= th.severity_medium else "low")
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
        "generator": f"tacc {__version__}",
        "capture": {"path": str(cap.path), "node": cap.node, "complete": cap.complete,
                    "t_start_ns": t0, "t_end_ns": t1, "problems": cap.problems},
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


def write_table(out: TextIO, findings: list[Finding], span_ns: int) -> None:
    if not findings:
        out.write("no findings\n")
        return
    out.write(f"{'#':>2} {'severity':<8} {'rule':<18} {'lost ms':>9} {'lost %':>7}  title\n")
    for i, f in enumerate(findings, 1):
        out.write(f"{i:>2} {f.severity:<8} {f.rule:<18} {f.time_lost_ns / 1e6:>9.2f} "
                  f"{100 * f.time_lost_ns / max(span_ns, 1):>6.1f}%  {f.title}\n")
    out.write("\n")
    for i, f in enumerate(findings, 1):
        rng = f.time_ranges[0] if f.time_ranges else None
        where = (f"{len(f.time_ranges)} range(s), first {rng[0] / 1e6:.3f}-{rng[1] / 1e6:.3f} ms"
                 if rng else "")
        out.write(f"[{i}] {f.rule}: {where}\n    evidence: ")
        out.write(", ".join(f"{k}={_short(v)}" for k, v in f.evidence.items()))
        out.write(f"\n    suggestion: {f.suggestion}\n")


def _short(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 80 else s[:77] + "..."
