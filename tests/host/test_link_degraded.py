"""The link_degraded rule (docs/analysis.md): a link trained below its
capable speed/width; time lost = per copy, the modelled link time at the negotiated link
less at the capable one (tacc.model.link.copy_link_ps), capped at the copy's time.
Synthetic captures here; tests/vm/test_linkfault.py runs it on a real one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tacc.analyze.engine import analyze
from tacc.capture import open_capture
from tacc.capture.schema import Opcode
from tacc.capture.synth import generate
from tacc.model.link import D2H, H2D, copy_link_ps


def _relink(p: Path, **link: int) -> None:
    meta = json.loads((p / "meta.json").read_text())
    for d in meta["devices"]:
        d["link"].update(link)
    (p / "meta.json").write_text(json.dumps(meta))


def _union(s: np.ndarray, e: np.ndarray) -> int:
    o = np.argsort(s, kind="stable")
    total, hi = 0, None
    for a, b in zip(s[o].tolist(), e[o].tolist(), strict=True):
        if hi is None or a > hi:
            total += b - a
            hi = b
        elif b > hi:
            total += b - hi
            hi = b
    return total


def _lost(p: Path, gen: int, width: int, max_gen: int, max_width: int) -> float:
    """Per direction: busy union x (1 - capable link time / negotiated link time)."""
    dt = open_capture(p).read("device_trace")
    total = 0.0
    for op, k in ((Opcode.COPY_H2D, H2D), (Opcode.COPY_D2H, D2H)):
        r = dt[(dt["opcode"] == op) & (dt["bytes"] > 0)]
        if not len(r):
            continue
        now = sum(copy_link_ps(k, int(n), gen, width, 256) for n in r["bytes"])
        cap = sum(copy_link_ps(k, int(n), max_gen, max_width, 256) for n in r["bytes"])
        busy = _union(r["t_start"].astype(np.int64), r["t_end"].astype(np.int64))
        total += busy * (1 - cap / now)
    return total


def test_fires_on_a_degraded_link_with_the_formula_time_lost(tmp_path: Path) -> None:
    p = tmp_path / "c"
    generate(p, "link_saturation", "bad")
    assert not [f for f in analyze(open_capture(p)) if f.rule == "link_degraded"]
    _relink(p, gen=3, width=4, max_gen=4, max_width=16)
    found = [f for f in analyze(open_capture(p)) if f.rule == "link_degraded"]
    assert len(found) == 1, found
    f = found[0]
    assert f.evidence["negotiated"] == {"gen": 3, "width": 4}
    assert f.evidence["capable"] == {"gen": 4, "width": 16}
    want = _lost(p, 3, 4, 4, 16)
    assert want > 0 and abs(f.time_lost_ns - want) <= 1e-3 * want, (f.time_lost_ns, want)
    assert f.time_lost_ns <= f.active_span_ns
    assert np.isclose(f.evidence["raw_bandwidth_ratio"], 8 * 4 / (16 * 16))


def test_silent_without_the_capable_link(tmp_path: Path) -> None:
    """Captures before minor 8 have no max_gen/max_width: the link counts as capable."""
    p = tmp_path / "c"
    generate(p, "link_saturation", "bad")
    _relink(p, gen=3, width=4)
    assert not [f for f in analyze(open_capture(p)) if f.rule == "link_degraded"]
