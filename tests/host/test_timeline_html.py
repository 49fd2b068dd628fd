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
