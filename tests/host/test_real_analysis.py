"""`tacc analyze` on REAL captures (tests/host/realcaps.py: recorded in the test VM by
`make fixtures`, and real-mixed): exact finding sets, exact figures, and the estimates
against what the twins measured.

The exact sets are judged, not copied: each twin's bad capture has the rule it is built
for, and what else fires is listed with why it is true of that capture.  The exact
findings (severity, time lost, ranges, shares, evidence, title and suggestion) are in
data/fixtures/findings-expected.json; after a
deliberate change of a rule, regenerate them with
``.venv/bin/python tests/host/test_real_analysis.py --update`` and say why in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from realcaps import FIXTURES, archives, extract, fixture_meta

GOLDEN = FIXTURES / "findings-expected.json"

# Each bad twin has its own rule; what else fires is true of the capture, for the reason
# given.  Recorded by `make fixtures` (RECORDED.json: commit, configuration, date).
#  - precision: fp32 GEMMs on a device that reports a bf16 peak (every workload with GEMMs
#    but decode_precision's good twin, whose weights are bf16);
#  - redundant_upload: the workload uploads the same host bytes into the same device
#    buffer again (serialized_copies' two fixed inputs each step, unaligned_userptr's and
#    the noisy neighbour's rounds, link_saturation's re-uploads);
#  - tlb_thrash: GEMM operands on 4 KiB pages (host_bound, serialized_copies, the decoder's
#    weights);
#  - idle_gaps: the device waits for the host between steps (the decoder's host work per
#    step under TCG, link_saturation's good twin on its API calls);
#  - host_memory: a copy's host side off a page: unaligned_userptr's 64 B offset, and
#    numpy arrays (malloc'd, not page-aligned) copied directly (link_saturation's four and
#    the noisy neighbour's one 8 MiB download, host_bound's upload and download).
# Not listed because they no longer fire: iommu_churn on the decoder (each weight and
# cache buffer mapped once: no map to save), memory_bound on decode_launch (its layers
# L0/L1 repeat across the steps of one sequence, which depend on each other).
_DECODE_BASE = {"tlb_thrash", "idle_gaps", "precision"}
EXPECTED: dict[str, set[str]] = {
    "tiny_transfers-bad": {"small_transfers", "idle_gaps"},  # idle_gaps: 0.45 ms, low
    "tiny_transfers-good": set(),
    "map_churn-bad": {"iommu_churn"},
    "map_churn-good": set(),
    "tlb_thrash-bad": {"tlb_thrash"},
    "tlb_thrash-good": {"precision"},  # 0.13 ms: its six fp32 GEMMs
    "serialized_copies-bad": {"serialized_copies", "tlb_thrash", "idle_gaps",
                              "redundant_upload", "precision"},
    "serialized_copies-good": {"tlb_thrash", "redundant_upload", "precision"},
    "host_bound-bad": {"idle_gaps", "serialized_copies", "tlb_thrash", "host_memory"},
    "host_bound-good": {"tlb_thrash"},
    # the bad twin's re-uploads are the same bytes each time: link_saturation's cause
    "link_saturation-bad": {"link_saturation", "h2d_d2h_imbalance", "host_memory",
                            "redundant_upload"},
    # launch_bound on the good twin only: its 4 x 12 one-op jobs per queue (y = 2x on a
    # resident input) are submitted one by one and the device waits ~0.7 ms for the host
    # before most of them; the bad twin's re-uploads break those runs (a host transfer)
    "link_saturation-good": {"host_memory", "launch_bound", "idle_gaps"},
    "unaligned_userptr-bad": {"host_memory", "redundant_upload"},
    "unaligned_userptr-good": {"redundant_upload"},
    # VF1 and VF2 contend; the neighbour saturates the link H2D only
    "noisy_neighbour-bad": {"vf_contention", "link_saturation", "h2d_d2h_imbalance",
                            "idle_gaps", "host_memory", "redundant_upload"},
    "noisy_neighbour-good": {"host_memory", "redundant_upload"},
    # tests/vm/test_e2e_real.py MIXED_EXPECTED on the PF
    "mixed": {"small_transfers", "iommu_churn", "tlb_thrash", "serialized_copies",
              "idle_gaps", "redundant_upload", "precision"},
    # recorded before the API records carried fingerprints and the trace records FLOPs
    "real-mixed": {"small_transfers", "iommu_churn", "tlb_thrash", "serialized_copies",
                   "idle_gaps"},
    # on virtio-tacc the map_churn segment raises no iommu_churn (as recorded; why is not
    # examined here); tlb_thrash from the device's walks (virtio-tacc's binds are not in
    # the driver stream)
    "virtio-mixed": {"small_transfers", "serialized_copies", "idle_gaps", "redundant_upload",
                     "precision", "tlb_thrash"},
    # the decoder's twins (tiny config, batch 2, prompt 8, 4 tokens)
    "decode_launch-bad": {"launch_bound", *_DECODE_BASE},
    "decode_launch-good": _DECODE_BASE,
    # the weights uploaded again before each step into fresh buffers: mapped again too
    "decode_weights-bad": {"redundant_upload", "iommu_churn", *_DECODE_BASE},
    "decode_weights-good": _DECODE_BASE,
    "decode_kv-bad": {"kv_roundtrip", *_DECODE_BASE},
    "decode_kv-good": _DECODE_BASE,
    "decode_batch-bad": {"memory_bound", *_DECODE_BASE},
    "decode_batch-good": _DECODE_BASE,
    "decode_precision-bad": {"precision", "tlb_thrash", "idle_gaps"},
    "decode_precision-good": {"tlb_thrash", "idle_gaps"},
}


def findings_doc(cap_path: Path) -> dict[str, Any]:
    """findings.json as `tacc analyze --json` writes it (the CLI's own entry point)."""
    import contextlib
    import io

    from tacc.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["analyze", str(cap_path), "--json"])
    assert rc == 0
    return json.loads(buf.getvalue())


def figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each finding whole, as findings.json has it: the figures (severity, time lost,
    ranges, shares), the evidence, and the title and suggestion that quote them."""
    return doc["findings"]


def same(got: Any, want: Any, where: str = "") -> None:
    """``got == want``, floats within 1e-9 relative (the figures are computed in numpy's
    float64: another build may round a last digit differently)."""
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (where, got, want)
    elif isinstance(want, dict) and isinstance(got, dict):
        assert list(got) == list(want), (where, list(got), list(want))
        for k in want:
            same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), (where, len(got), len(want))
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("realan")
    return {n: (p := extract(a, root / n), findings_doc(p)) for n, a in archives().items()}


def test_every_fixture_has_an_expected_set(analysed: dict) -> None:
    assert set(analysed) == set(EXPECTED) & set(analysed)
    assert len(analysed) >= 2


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_finding_set(analysed: dict, name: str) -> None:
    if name not in analysed:
        pytest.skip(f"{name}: not recorded (make fixtures)")
    got = {f["rule"] for f in analysed[name][1]["findings"]}
    assert got == EXPECTED[name], (name, sorted(got))
    # the twin's own rule fires on its bad capture only
    w, _, variant = name.rpartition("-")
    want = set(fixture_meta(name).get("results", [{}])[0].get("expected_findings") or [])
    if variant == "bad":
        assert want and want <= got, (want, got)


def test_exact_figures(analysed: dict) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(analysed)
    for name, (_, doc) in analysed.items():
        same(figures(doc), golden[name], name)


def test_time_ranges_inside_the_capture(analysed: dict) -> None:
    from tacc.capture import open_capture

    for name, (p, doc) in analysed.items():
        t0, t1 = open_capture(p).time_range
        for f in doc["findings"]:
            assert f["time_ranges"] and f["time_lost_ns"] > 0, (name, f["rule"])
            for a, b in f["time_ranges"]:
                assert t0 <= a <= b <= t1, (name, f["rule"], a, b, t0, t1)


def test_small_transfers_lost_is_net_of_its_batched_ideal(analysed: dict) -> None:
    for name in ("tiny_transfers-bad", "mixed", "real-mixed"):
        if name not in analysed:
            continue
        f = next(x for x in analysed[name][1]["findings"] if x["rule"] == "small_transfers")
        e = f["evidence"]
        assert 0 < e["batched_estimate_ns"] < e["observed_ns"]
        assert f["time_lost_ns"] == e["observed_ns"] - e["batched_estimate_ns"], (name, e)


def _busy(p: Path) -> int:
    from tacc.capture import open_capture

    dt = open_capture(p).read("device_trace")
    dt = dt[dt["opcode"] < 0xF0]  # commands, not event records
    return int((dt["t_end"].astype(np.int64) - dt["t_start"].astype(np.int64)).sum())


def _roofline(p: Path) -> int:
    """The device time of the commands on the roofline (tacc.analyze.roofline.on_roof:
    what memory_bound and precision price), as tests/vm/test_e2e_real.py measures it."""
    from tacc.analyze import roofline
    from tacc.analyze.data import load
    from tacc.capture import open_capture

    c = load(open_capture(p)).cmds
    return int(c.dur[roofline.on_roof(c)].sum())


# rule -> (twin, measured figure, bound on |estimate / measured - 1|): docs/analysis.md
# "Estimated against measured": busy = bad - good device busy time (from the two
# captures), span = bad - good device time of the measured section (the worker's result),
# roofline = bad - good device time of the roofline commands (GEMM, element-wise,
# softmax, norm, gather).  host_memory prices the device's own closed forms (1.0002 on
# the fixtures of 2026-12-03); the others hold the documented 25 % (there: link_saturation
# 0.874, launch_bound 0.906, redundant_upload 0.981, kv_roundtrip 0.880, memory_bound
# 1.072, precision 0.989).
ESTIMATES = {
    "host_memory": ("unaligned_userptr", "busy", 0.01),
    "link_saturation": ("link_saturation", "busy", 0.25),
    "tlb_thrash": ("tlb_thrash", "busy", 0.25),
    "iommu_churn": ("map_churn", "span", 0.25),
    "small_transfers": ("tiny_transfers", "span", 0.25),
    "launch_bound": ("decode_launch", "span", 0.25),
    "redundant_upload": ("decode_weights", "span", 0.25),
    "kv_roundtrip": ("decode_kv", "span", 0.25),
    "memory_bound": ("decode_batch", "roofline", 0.25),
    "precision": ("decode_precision", "roofline", 0.25),
}


@pytest.mark.parametrize("rule", sorted(ESTIMATES))
def test_estimate_against_the_twins_measurement(analysed: dict, rule: str) -> None:
    twin, by, bound = ESTIMATES[rule]
    if f"{twin}-bad" not in analysed:
        pytest.skip("make fixtures: no twins")
    pb, doc = analysed[f"{twin}-bad"]
    pg, _ = analysed[f"{twin}-good"]
    est = next(f["time_lost_ns"] for f in doc["findings"] if f["rule"] == rule)
    if by == "busy":
        measured = _busy(pb) - _busy(pg)
    elif by == "roofline":
        measured = _roofline(pb) - _roofline(pg)
    else:
        rb, rg = (fixture_meta(f"{twin}-{v}")["results"][0] for v in ("bad", "good"))
        measured = rb["device_ns"] - rg["device_ns"]
    assert measured > 0 and abs(est / measured - 1) <= bound, (rule, est, measured)


def _update() -> None:
    import tempfile

    root = Path(tempfile.mkdtemp())
    out = {n: figures(findings_doc(extract(a, root / n))) for n, a in archives().items()}
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(out)} captures)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: test_real_analysis.py --update")
    sys.path.insert(0, str(Path(__file__).parent))
    _update()


def test_iommu_churn_without_counters_prices_walks_at_the_default(tmp_path: Path) -> None:
    """The real map_churn bad twin with its counters stream removed (a capture without
    counters): the copies' page walks are priced at the default PTE reads per miss,
    copy_walk_ns = misses x walk_reads_per_miss x walk_read_ns x time scale."""
    from tacc.analyze.engine import analyze
    from tacc.analyze.rules import Thresholds
    from tacc.capture import open_capture

    p = extract(archives()["map_churn-bad"], tmp_path)
    (p / "streams" / "counters.tcs").unlink()
    meta = json.loads((p / "meta.json").read_text())
    del meta["streams"]["counters"]
    (p / "meta.json").write_text(json.dumps(meta))
    cap = open_capture(p)
    (f,) = analyze(cap, rules=["iommu_churn"])
    th = Thresholds()
    e = f.evidence
    scale = cap.functions[0].time_scale
    assert e["copy_tlb_misses"] > 0
    assert e["copy_walk_ns"] == int(e["copy_tlb_misses"] * th.walk_reads_per_miss
                                    * th.walk_read_ns * scale)
