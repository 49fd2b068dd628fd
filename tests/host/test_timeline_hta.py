"""Chrome trace JSON as chrome://tracing-style parsers and PyTorch's Holistic Trace Analysis
(HTA, PyPI holistictraceanalysis) read it, on a real capture (tests/host/data/real-mixed:
the VM's mixed workload, tests/vm/test_e2e_real.py): every event has a ``cat``, flow ids
are strings unique as strings and as float64 numbers, the rank is in ``distributedInfo``,
the device queues are HTA's GPU streams, and HTA's temporal breakdown equals the device
engines' busy time of ``tacc timeline --summary`` within 1 %."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
from tacc.cli import main

REAL = Path(__file__).parent / "data/real-mixed.tar.xz"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    with tarfile.open(REAL) as tf:
        tf.extractall(root)  # noqa: S202 (our own fixture; Python 3.11.2 has no filter=)
    return root / "real-mixed"


def test_chrome_json_ids_cats_and_rank(real: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["timeline", str(real), "-o", str(out)]) == 0
    text = out.read_text()
    doc = json.loads(text)
    # HTA reads the rank from the first line with '"rank": N'
    assert re.search(r'"rank":\s+(\d+)', text.splitlines()[0]).group(1) == "0"
    assert doc["distributedInfo"]["world_size"] == 1
    ev = doc["traceEvents"]
    assert ev and all(isinstance(e.get("cat"), str) and e["cat"] for e in ev)
    flows = [e for e in ev if e["ph"] in ("s", "t", "f")]
    ids = [e["id"] for e in flows]
    assert all(isinstance(i, str) for i in ids)
    # the capture's 720 jobs each carry their tag from the API call to the device
    distinct = set(ids)
    assert len(distinct) >= 720
    assert len({float(i) for i in distinct}) == len(distinct)  # a JavaScript number each
    starts = {e["id"] for e in flows if e["ph"] == "s"}
    assert starts == distinct  # each flow starts once, at its API call
    kernels = [e for e in ev if e["ph"] == "X" and "stream" in e["args"]]
    assert kernels and all(e["args"]["stream"] > 0 for e in kernels)
    assert {"kernel", "gpu_memcpy"} <= {e["cat"] for e in kernels} <= {"kernel", "gpu_memcpy",
                                                                       "gpu_memset"}


def _summary_device(out: str) -> dict[str, float]:
    m = re.search(r"span ([\d.]+) ms, busy ([\d.]+) ms \([\d.]+ %\), compute ([\d.]+) ms "
                  r"\([\d.]+ %\), idle ([\d.]+) %", out)
    assert m, out
    return {"span": float(m[1]), "busy": float(m[2]), "compute": float(m[3]),
            "idle_pct": float(m[4])}


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore:The inplace keyword")
def test_hta_temporal_breakdown_equals_tacc_busy(real: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # tacc's times are ns; HTA would round each event's ends to whole µs
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    d = tmp_path / "hta"
    assert main(["timeline", str(real), "--format", "hta", "-o", str(d), "--summary"]) == 0
    tacc = _summary_device(capsys.readouterr().out)
    files = sorted(p.name for p in d.iterdir())
    assert files == ["rank0.json"]  # one device function: one rank
    doc = json.loads((d / "rank0.json").read_text())
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    ta = TraceAnalysis(trace_dir=str(d))
    df = ta.t.get_trace(0)
    assert len(df) == len(x)  # HTA kept every slice
    streams = {e["args"]["stream"] for e in x if "stream" in e["args"]}
    assert set(df[df["stream"] > 0]["stream"].unique()) == streams
    tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
    kernel_ms = tb["kernel_time(us)"] / 1e3
    assert kernel_ms == pytest.approx(tacc["span"], rel=0.01)
    assert kernel_ms - tb["idle_time(us)"] / 1e3 == pytest.approx(tacc["busy"], rel=0.01)
    assert tb["compute_time(us)"] / 1e3 == pytest.approx(tacc["compute"], rel=0.01)
    assert tb["idle_time_pctg"] == pytest.approx(tacc["idle_pct"], rel=0.01)
    assert 0 < tacc["compute"] < tacc["busy"] < tacc["span"]


def test_summaries_read_right(real: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """timeline --summary: a track's busy time leaves out its sleeping slices, names are
    whole, device memory carries its unit; analyze: ranges in ms from the capture's start,
    evidence rounded and with units (findings.json keeps the exact values)."""
    from tacc.capture import open_capture

    assert main(["timeline", str(real), "--summary"]) == 0
    out = capsys.readouterr().out
    rows = {ln.rsplit(None, 4)[0]: ln.split()[-4:] for ln in out.splitlines()
            if ln.startswith("e2e / ") and len(ln.split()) > 5 and ln.split()[-1][0].isdigit()}
    kc = [k for k in rows if "kcompactd0" in k and k.endswith(" CPU")]
    assert len(kc) == 1, rows.keys()  # the whole name, not cut at 64 characters
    assert kc[0] == "e2e / kcompactd0 pid 33 / kcompactd0 tid 33 / kcompactd0 tid 33 CPU"
    slices, busy, pct, sleep = rows[kc[0]]
    assert float(busy) == 0.0 and float(sleep) > 2000  # it slept (was "76 % busy")
    m = re.search(r"device memory in use +56 +([\d.]+) MiB +([\d.]+) MiB", out)
    assert m and float(m[2]) == pytest.approx(21757952 / 2**20, abs=0.005)

    cap = open_capture(real)
    t0, t1 = cap.time_range
    assert main(["analyze", str(real)]) == 0
    table = capsys.readouterr().out
    firsts = [(float(a), float(b)) for a, b in re.findall(r"first ([\d.]+)-([\d.]+) ms", table)]
    assert firsts and all(0 <= a <= b <= (t1 - t0) / 1e6 for a, b in firsts)
    ev = [ln for ln in table.splitlines() if ln.strip().startswith("evidence:")]
    assert ev and not re.search(r"\d\.\d{5,}", "\n".join(ev))  # no unrounded float
    assert "observed=70.6 ms" in table and "bytes=2.00 MiB" in table


def test_a_rank_per_function_with_its_own_commands(tmp_path: Path) -> None:
    """`--format hta` of a capture with three functions (noisy_neighbour: the PF, VF1 and
    VF2 copying): a file per function, its header naming its rank; each VF's file holds
    its own copies (one slice per device record of that function) and driver records."""
    from collections import Counter

    from tacc.capture import open_capture
    from tacc.capture.synth import generate

    generate(tmp_path / "c", "noisy_neighbour", "bad")
    d = tmp_path / "hta"
    assert main(["timeline", str(tmp_path / "c"), "--format", "hta", "-o", str(d)]) == 0
    dt = open_capture(tmp_path / "c").read("device_trace")
    per_fid = Counter(dt["fid"].tolist())
    names = ["node0 0000:01:00.0", "node0 0000:01:00.1 (VF1)", "node0 0000:01:00.2 (VF2)"]
    assert sorted(p.name for p in d.iterdir()) == ["rank0.json", "rank1.json", "rank2.json"]
    for r, name in enumerate(names):
        doc = json.loads((d / f"rank{r}.json").read_text())
        assert doc["distributedInfo"] == {"backend": "tacc", "rank": r, "world_size": 3,
                                          "name": name}
        cats = Counter(e["cat"] for e in doc["traceEvents"] if e["ph"] == "X")
        assert cats["gpu_memcpy"] == per_fid.get(r, 0), (r, cats)
        if r:
            assert cats["driver"] >= per_fid[r]
