"""The benchmark statistics (tools/bench/benchstats.py) and vm_tracing's log summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
from benchstats import median_ci, ratio_ci  # noqa: E402


def test_median_ci_order_statistics() -> None:
    xs = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0]
    assert median_ci(xs) == (5.0, 2.0, 8.0)  # n = 9: ranks 2 and 8 (96.1 %)
    assert median_ci([1.0, 2.0, 3.0]) == (2.0, 1.0, 3.0)  # too few for 95 %: the range
    assert median_ci([]) == (0.0, 0.0, 0.0)


def test_ratio_ci_paired_and_seeded() -> None:
    base = [100.0, 110.0, 90.0, 105.0, 95.0, 100.0, 102.0, 98.0, 101.0]
    half = [x * 0.5 for x in base]  # drift cancels when rounds stay paired
    assert ratio_ci(half, base) == pytest.approx((0.5, 0.5, 0.5))
    noisy = [x * (0.9 + 0.02 * i) for i, x in enumerate(base)]
    p, lo, hi = ratio_ci(noisy, base)
    assert lo <= p <= hi and hi - lo < 0.2
    assert ratio_ci(noisy, base) == (p, lo, hi)


def test_vm_tracing_summarizes_a_log(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    import vm_tracing

    log = tmp_path / "vm.log"
    lines = []
    for r in range(1, 10):
        lines.append(f"  round {r} nop nothing       {30000 + r:.1f}/s cpu   0.0% drops 0 "
                     "pm 0 gc 0")
        lines.append(f"  round {r} nop taccd         {21000 + r:.1f}/s cpu  15.9% drops 0 "
                     f"facts 100/110 pm 0 gc 0\r")
    log.write_text("\n".join(["noise", *lines]))
    runs = vm_tracing.from_log(log)
    assert list(runs["nop"]) == ["nothing", "taccd"] and len(runs["nop"]["taccd"]) == 9
    rows = {r["mode"]: r for r in vm_tracing.summarize(runs["nop"])}
    assert rows["taccd"]["ratio"] == pytest.approx(21005 / 30005)
    assert rows["taccd"]["facts_kept"] == 900 and rows["taccd"]["facts_possible"] == 990
