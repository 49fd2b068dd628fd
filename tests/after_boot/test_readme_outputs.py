"""On the host, after the extras boot: what README.md's guest commands wrote
(``$TACC_VM_OUT/FILE``, kept by tests/vm/test_readme.py in the boot's ``out/readme/``),
checked where the guest cannot: the model's HTML view ("Profile a model") rendered in
headless Chromium.  scripts/test-vm runs this directory with TACC_VM_RESULTS = the boot's
output directory after a boot whose README tests kept files; not part of the host layer."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tacc.testing.chromium import dump_dom

RESULTS = os.environ.get("TACC_VM_RESULTS", "")


@pytest.fixture
def kept() -> Path:
    if not RESULTS:
        pytest.fail("TACC_VM_RESULTS must name a boot's output directory "
                    "(scripts/test-vm sets it after the extras boot)")
    return Path(RESULTS) / "readme"


def test_model_view_draws_the_roofline_and_every_step(kept: Path, tmp_path: Path) -> None:
    """README "Profile a model": model.html's panel draws every roofline point of its
    report and one row per step (prefill and each decode step), without a script error."""
    page = kept / "model.html"
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>',
                  page.read_text(), re.S)
    assert m, f"{page}: no data block"
    rep = json.loads(m.group(1).replace("<\\/", "</")).get("report")
    assert rep, f"{page}: no model report (a capture without version-3 records?)"
    points = sum(len(f["points"]) for f in rep["roofline"])
    # tacc run decode_launch --tokens 4: the prefill, then 3 decode steps (157 commands on
    # the roofline in the run that wrote this test)
    names = [s["name"] for s in rep["steps"]]
    assert points > 0 and names == ["prefill"] + [f"decode step {i}" for i in (1, 2, 3)], (
        points, names)
    html, err = dump_dom(page, tmp_path / "profile")
    assert f'data-roofline="{points}"' in html, err[-2000:]
    assert f'data-steps="{len(rep["steps"])}"' in html, err[-2000:]
    for s in rep["steps"]:
        assert f'data-step="{s["name"]}"' in html, s["name"]
    assert "Uncaught" not in err, err[-2000:]
