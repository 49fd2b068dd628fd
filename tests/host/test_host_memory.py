"""host_memory's estimate against the device's link model.

The synthetic unaligned twin (tacc.capture.synth.w_unaligned_userptr) costs what the
device's closed forms give a copy whose host side starts off a page: the link steps of
docs/hardware.md section 9 (MRRS and 4 KiB read splits, RCB completions, DLLPs, flow
control) and one page walk per extra page.  The rule must price the same thing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tacc.analyze.engine import analyze
from tacc.capture import open_capture, synth
from tacc.capture.synth import Sim, generate, run


def _lost(path: Path) -> int:
    f = [x for x in analyze(open_capture(path)) if x.rule == "host_memory"]
    assert len(f) == 1, f
    return f[0].time_lost_ns


@pytest.mark.parametrize("scale", [1, 3])
def test_estimate_is_the_link_model_difference(tmp_path: Path, scale: int) -> None:
    tb = generate(tmp_path / "bad", "unaligned_userptr", "bad", scale=scale)
    tg = generate(tmp_path / "good", "unaligned_userptr", "good", scale=scale)
    measured = tb["device_busy_ns"] - tg["device_busy_ns"]
    est = _lost(tmp_path / "bad")
    # the same closed forms on both sides: only ns rounding per copy differs
    assert abs(est - measured) <= 0.02 * measured, (est, measured)
    assert not [x for x in analyze(open_capture(tmp_path / "good")) if x.rule == "host_memory"]


def test_estimate_without_api_args_from_the_tlp_counts(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No buffer offsets in the API stream (API tracing off, or other runtimes): the
    host offsets are inferred from each record's TLP count, which at a 32 B offset
    (off the RCB and MPS) the link model makes differ from the aligned count."""
    monkeypatch.setattr(synth, "UNALIGNED_OFFSET", 32)
    measured = []
    for v in ("bad", "good"):
        sim = Sim()
        run(sim, [("unaligned_userptr", v == "bad")])
        for a in sim.api:
            a["args_id"] = 0
        sim.write(tmp_path / v)
        c = {k: np.concatenate([x[k] for x in sim.cmds]) for k in sim.cmds[0]}
        measured.append(int((c["t_end"] - c["t_start"]).sum()))
    diff = measured[0] - measured[1]
    est = _lost(tmp_path / "bad")
    assert abs(est - diff) <= 0.25 * diff, (est, diff)


def test_copy_offsets_read_past_the_fingerprint_words() -> None:
    """copy_h2d's API arguments end in ``fp=`` (and ``doff=``) words for redundant_upload:
    the offsets still come from them (with the pattern anchored on the byte count alone,
    every real upload fell back to the TLP count, which a 64 B offset leaves unchanged:
    the unaligned twin's fixture priced its downloads only, 286 of 312 us)."""
    from tacc.analyze.rules.host_memory import _COPY_ARGS, _side_off
    from tacc.runtime.stream import fingerprint

    data = np.arange(4096, dtype=np.uint8)
    for args in (f"u2+64->d4 4194304 fp={fingerprint(data, 0, 4096)}",
                 f"u2+64->d4 4194304 fp={fingerprint(data, 0, 4096)} doff=8192",
                 "d4->u2+64 4194304"):
        m = _COPY_ARGS.match(args)
        assert m, args
        offs = sorted((_side_off(m.group(1)), _side_off(m.group(2))))
        assert offs == [0, 64], args
