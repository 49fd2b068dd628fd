"""The offline HTML view renders in headless Chromium: tracks visible, no console errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.analyze.engine import analyze, to_json
from tacc.analyze.rules import Thresholds
from tacc.capture import open_capture
from tacc.capture.synth import generate
from tacc.timeline.convert import convert

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,900", "--virtual-time-budget=3000"]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("html")
    generate(d / "c", [("map_churn", True), ("serialized_copies", True)])
    cap = open_capture(d / "c")
    findings = to_json(cap, analyze(cap), Thresholds())["findings"]
    out = d / "view.html"
    convert([d / "c"], out, fmt="html", findings=findings)
    return out


def test_html_is_self_contained(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<script src" not in text and "<link" not in text
    assert "default-src 'none'" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_html_renders_in_chromium(page: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    prof = tmp_path / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", "--enable-logging=stderr",
                          "--v=0", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    html = dom.stdout
    assert 'data-rendered="' in html, dom.stderr[-2000:]
    for name in ("node0", "tacc-run pid 4242", "tacc-run tid 4243", "tacc-run tid 4243 API",
                 "tacc-run tid 4243 CPU", "driver 0000:01:00.0", "dma map/unmap",
                 "PCIe H2D q0", "compute0 q0", "H2D GB/s", "findings",
                 "finding: serialized_copies", "finding: iommu_churn"):
        assert f'data-track="{name}' in html, name
    errors = [line for line in dom.stderr.splitlines()
              if "Uncaught" in line or ("CONSOLE" in line and "ERROR" in line.upper()
                                        and "console" in line.lower())]
    assert not [e for e in errors if "Uncaught" in e], errors
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={prof}", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 20_000


def test_slice_limit_counts_what_it_drops_and_counters_keep_each_groups_peak() -> None:
    """HtmlSink keeps the first max_slices slices (the rest counted as dropped, batch by
    batch) and, past 2 x max_points samples of a counter, keeps each group's maximum."""
    import numpy as np
    from tacc.timeline.html import HtmlSink
    from tacc.timeline.model import Batch, CounterBatch

    def batch(n: int, t0: int) -> Batch:
        ts = np.arange(t0, t0 + n, dtype=np.int64)
        return Batch(track=np.zeros(n, np.int64), ts=ts, dur=np.ones(n, np.int64),
                     name=np.zeros(n, np.int64))

    h = HtmlSink(max_slices=10, max_points=4)
    h.slices(batch(6, 0))
    assert (h.n, h.dropped) == (6, 0)
    h.slices(batch(4, 100))  # exactly fills the limit
    assert (h.n, h.dropped) == (10, 0)
    h.slices(batch(3, 200))
    assert (h.n, h.dropped) == (10, 3)
    h2 = HtmlSink(max_slices=10, max_points=4)
    h2.slices(batch(7, 0))
    h2.slices(batch(5, 100))  # 3 of 5 kept
    assert (h2.n, h2.dropped) == (10, 2)
    assert np.concatenate(h2.slices_parts)[:, 1].tolist() == [0, 1, 2, 3, 4, 5, 6, 100, 101,
                                                             102]
    vals = np.array([1, 5, 2, 0, 9, 3, 4, 4, 7], np.float64)
    h.counters(CounterBatch(track=np.zeros(9, np.int64), ts=np.arange(9) * 10.0, value=vals))
    # 9 > 2 x 4 samples: groups of 9 // 4 = 2, the maxima of the first 4 groups (the odd
    # sample at the end is left out)
    (p,) = h.counters_data[0]
    assert p.tolist() == [[0.0, 5.0], [20.0, 2.0], [40.0, 9.0], [60.0, 4.0]]


def test_html_data_block_title_processes_and_findings(page: Path) -> None:
    """The view's data: its title names the node, the OS tracks their process and thread
    (synth: tacc-run, pid 4242, tid 4243), the findings as the analysis gave them, with
    ranges from the view's t0; nothing dropped."""
    import json

    m = re.search(r'<script id="data" type="application/json">(.*?)</script>',
                  page.read_text(), re.S)
    assert m
    d = json.loads(m.group(1).replace("<\\/", "</"))
    assert d["title"] == "tacc timeline: node0" and d["dropped"] == 0
    os_tracks = {(t["pid"], t["tid"], t["comm"]) for t in d["tracks"] if "os" in t}
    assert (4242, 4243, "tacc-run") in os_tracks
    assert {pid for pid, _, _ in os_tracks} == {4242}
    cap = open_capture(page.parent / "c")
    want = to_json(cap, analyze(cap), Thresholds())["findings"]
    assert [(f["rule"], f["severity"], f["title"], f["suggestion"]) for f in d["findings"]] == \
        [(f["rule"], f["severity"], f["title"], f["suggestion"]) for f in want]
    assert [f["ranges"] for f in d["findings"]] == \
        [[[a - d["t0"], b - d["t0"]] for a, b in f["time_ranges"]] for f in want]
