"""make bench's report.html (tools/bench/report.py) from fixture JSON: self-contained, one
PNG per plot, and every image decodes in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parent / "fixtures" / "bench"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]
# plots the fixtures give: two link configurations, overhead, latency, counter sampling,
# decode tokens/s vs batch
N_PLOTS = 6


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bench")
    for f in FIX.glob("*.json"):
        shutil.copy(f, d / f.name)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "report.py"), "--dir",
                        str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d / "report.html"


def test_report_is_self_contained_with_every_plot(report: Path) -> None:
    text = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<script" not in text
    imgs = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', text)
    assert len(imgs) == N_PLOTS, imgs
    assert "link-gen=3,link-width=4" in text and "No " not in text  # every section drawn


def test_missing_json_says_so(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "report.py"), "--dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "report.html").read_text()
    assert text.count("in this run.") == 5 and "<img" not in text
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "report.py"), "--dir",
                          str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


CHECK = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100);
  document.body.setAttribute('data-images', ok.length + '/' + imgs.length);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (setup installs it)")
def test_images_load_in_chromium(report: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    # a copy with a checking script (the report itself has none and forbids scripts)
    page = tmp_path / "check.html"
    text = re.sub(r"<meta http-equiv='Content-Security-Policy'[^>]*>", "", report.read_text())
    page.write_text(text.replace("</body>", CHECK + "</body>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=180)
    m = re.search(r'data-images="(\d+)/(\d+)"', dom.stdout)
    assert m, dom.stderr[-2000:]
    assert (int(m.group(1)), int(m.group(2))) == (N_PLOTS, N_PLOTS)
