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


def _relink_one(p: Path, pci: str, **link: int) -> None:
    meta = json.loads((p / "meta.json").read_text())
    for d in meta["devices"]:
        if d["pci"] == pci:
            d["link"].update(link)
    (p / "meta.json").write_text(json.dumps(meta))


def _degraded(p: Path) -> list:
    return analyze(open_capture(p), rules=["link_degraded"])


def test_evidence_and_title_of_the_pfs_link_over_its_vfs_copies(tmp_path: Path) -> None:
    """noisy_neighbour: the copies are the two VFs' (all H2D); the link is the PF's, so the
    PF's degraded link (the VFs' entries left capable) fires with every function's copies,
    each figure of the evidence from the capture's records."""
    p = tmp_path / "c"
    generate(p, "noisy_neighbour", "bad")
    _relink_one(p, "0000:01:00.0", gen=4, width=8, max_gen=4, max_width=16)
    found = _degraded(p)
    assert len(found) == 1, found
    f = found[0]
    assert f.title == "0000:01:00.0: link trained at Gen4 x8, capable of Gen4 x16"
    assert f.functions == ["0000:01:00.0", "0000:01:00.1", "0000:01:00.2"]
    cap = open_capture(p)
    dt = cap.read("device_trace")
    r = dt[((dt["opcode"] == Opcode.COPY_H2D) | (dt["opcode"] == Opcode.COPY_D2H))
           & (dt["bytes"] > 0)]
    assert set(r["fid"].tolist()) == {1, 2} and set(r["opcode"].tolist()) == {Opcode.COPY_H2D}
    e = f.evidence
    assert list(e) == ["negotiated", "capable", "raw_bandwidth_ratio", "directions",
                       "affected_transfers", "affected_bytes", "top_tags", "api_calls"]
    assert e["negotiated"] == {"gen": 4, "width": 8}
    assert e["capable"] == {"gen": 4, "width": 16}
    assert e["raw_bandwidth_ratio"] == 0.5
    assert (e["affected_transfers"], e["affected_bytes"]) == (len(r), int(r["bytes"].sum()))
    busy = _union(r["t_start"].astype(np.int64), r["t_end"].astype(np.int64))
    now = sum(copy_link_ps(H2D, int(n), 4, 8, 256) for n in r["bytes"])
    capable = sum(copy_link_ps(H2D, int(n), 4, 16, 256) for n in r["bytes"])
    assert list(e["directions"]) == [H2D]
    d = e["directions"][H2D]
    assert abs(d["busy_ns"] - busy) <= 1000 * len(r), (d, busy)  # device-clock rounding
    assert d["capable_link_share"] == capable / now
    assert abs(f.time_lost_ns - busy * (1 - capable / now)) <= 1e-3 * f.time_lost_ns
    # the API calls of those copies, by name, and the tags moving the most bytes first
    api = cap.read("api")
    names = [cap.strings[int(i)] for i in api["name_id"][np.isin(api["tag"], r["tag"])]]
    assert e["api_calls"] == {n: names.count(n) for n in sorted(set(names))}
    by_tag: dict[int, int] = {}
    for t, n in zip(r["tag"].tolist(), r["bytes"].tolist(), strict=True):
        by_tag[t] = by_tag.get(t, 0) + n
    top = sorted(by_tag.values(), reverse=True)[:5]
    assert [by_tag[int(t, 16)] for t in e["top_tags"]] == top
    assert "compare lspci LnkSta with LnkCap" in f.suggestion
    assert f.suggestion.startswith("The link trained below its capability (a lane or "
                                   "speed fault, a slot wired narrower, or retraining")
    # the VFs' entries do not stand for the link
    p2 = tmp_path / "vfs"
    generate(p2, "noisy_neighbour", "bad")
    for vf in ("0000:01:00.1", "0000:01:00.2"):
        _relink_one(p2, vf, gen=3, width=4, max_gen=4, max_width=16)
    assert not _degraded(p2)


def test_a_lower_speed_alone_a_narrower_link_alone_d2h_alone(tmp_path: Path) -> None:
    """Gen3 x16 of Gen4 x16 and Gen4 x4 of Gen4 x16 each fire; copies in one direction
    only (D2H) price that direction; an unknown negotiated speed (gen 0) is silent."""
    from tacc.capture.synth import Sim

    p = tmp_path / "c"
    generate(p, "link_saturation", "bad")
    for (gen, width), ratio in (((3, 16), 0.5), ((4, 4), 0.25)):
        _relink(p, gen=gen, width=width, max_gen=4, max_width=16)
        (f,) = _degraded(p)
        assert f.evidence["raw_bandwidth_ratio"] == ratio
        assert set(f.evidence["directions"]) == {H2D, D2H}
        want = _lost(p, gen, width, 4, 16)
        assert abs(f.time_lost_ns - want) <= 1e-3 * want, (gen, width, f.time_lost_ns, want)
    _relink(p, gen=0, width=4, max_gen=4, max_width=16)
    assert not _degraded(p)
    # two PFs: the first loses under min_time_lost_ns (one small copy), the second's
    # 40 D2H copies (no H2D) price that direction alone
    sim = Sim(seed=0, nvfs=1)
    sim.submit(fid=0, queue=0, pid=100, tid=100, name="copy_d2h", opcode=Opcode.COPY_D2H,
               api_t0=np.array([5_000_000]), nbytes=np.full(1, 4096), dur=np.full(1, 3000))
    n = 40
    sim.submit(fid=1, queue=0, pid=100, tid=100, name="copy_d2h", opcode=Opcode.COPY_D2H,
               api_t0=10_000_000 + np.arange(n, dtype=np.int64) * 400_000,
               nbytes=np.full(n, 4 << 20), dur=np.full(n, 300_000))
    q = tmp_path / "d2h"
    sim.write(q)
    meta = json.loads((q / "meta.json").read_text())
    meta["devices"][1].update(pci="0000:02:00.0", pf="0000:02:00.0", vf=0)
    (q / "meta.json").write_text(json.dumps(meta))
    _relink(q, gen=3, width=4, max_gen=4, max_width=16)
    (f,) = _degraded(q)
    assert f.functions == ["0000:02:00.0"] and list(f.evidence["directions"]) == [D2H]
    assert f.evidence["affected_transfers"] == n
    dt = open_capture(q).read("device_trace")
    r = dt[dt["fid"] == 1]
    busy = _union(r["t_start"].astype(np.int64), r["t_end"].astype(np.int64))
    now = n * copy_link_ps(D2H, 4 << 20, 3, 4, 256)
    want = busy * (1 - n * copy_link_ps(D2H, 4 << 20, 4, 16, 256) / now)
    assert want > 0 and abs(f.time_lost_ns - want) <= 1e-3 * want, (f.time_lost_ns, want)
