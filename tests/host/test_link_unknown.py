"""``link_saturation`` when the capture does not know the link (a function described with
link gen 0 or width 0: ``Function.max_bw`` is 0): no finding and no arithmetic on a zero
capacity, as ``link_degraded`` treats gen 0 as unknown (docs/analysis.md)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from realcaps import FIXTURES, extract
from tacc.analyze.data import load
from tacc.analyze.rules import Thresholds
from tacc.analyze.rules.link_saturation import link_saturation
from tacc.capture import open_capture


def test_unknown_link_no_finding_no_warning(tmp_path: Path) -> None:
    d = load(open_capture(extract(FIXTURES / "link_saturation-bad.tar.xz", tmp_path)))
    assert [f.rule for f in link_saturation(d, Thresholds())] == ["link_saturation"]
    unknown = dataclasses.replace(d, functions=[dataclasses.replace(f, gen=0)
                                                for f in d.functions])
    assert all(f.max_bw("h2d") == 0 for f in unknown.functions)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert link_saturation(unknown, Thresholds()) == []
