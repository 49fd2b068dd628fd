"""memory_bound and precision on captures whose version-3 records follow the device's
timing model (docs/hardware.md: ``t = T_cmd + W + max(flops / F, bytes / BW)``, W = page
walks): the serial-vs-batched and fp32-vs-bf16 twins of tacc run decode in miniature.
Each rule's estimate is compared with the twins' difference of roofline device time (the
figure test_e2e_real compares on real captures); each fires on the bad twin only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tacc import hw, model
from tacc.analyze.engine import analyze
from tacc.analyze.report import report
from tacc.capture import CaptureWriter, open_capture
from tacc.capture.schema import API_DTYPE, DEVICE_TRACE_DTYPE, Opcode
from tacc.testing.chromium import CHROMIUM, dump_dom

P = model.DEFAULT
WALK = 3 * P.walk_latency_ns  # a 4 KiB page's miss: 3 PTE reads (docs/hardware.md)
PAGE = 4096
D, V, LAYERS = 128, 512, 2  # the tiny config's shapes
DEV = {"pci": "0000:01:00.0", "vf": 0, "clock_hz": 1e9, "time_scale": 1.0,
       "peak_fp32_gflops": 7575, "peak_bf16_gflops": 30250, "devmem_gbps": 300,
       "trace_version": 3}


def _pages(n: int) -> int:
    return -(-n // PAGE)


class Dev:
    """Commands in device order: each timed by the model, plus a walk per page touched."""

    def __init__(self) -> None:
        self.t = 1_000_000
        self.rows: list[dict[str, Any]] = []

    def cmd(self, op: int, flops: int, rd: int, wr: int, dtype: int = hw.TACC_DT_FP32,
            subop: int = 0) -> None:
        dt = "bf16" if op == Opcode.GEMM and dtype == hw.TACC_DT_BF16 else "fp32"
        walks = _pages(rd) + _pages(wr)
        dur = model.compute_ns(flops, rd + wr, dt) + walks * WALK
        self.rows.append({"opcode": int(op), "flops": flops, "bytes_read": rd,
                          "bytes_written": wr, "dtype": dtype, "subop": subop,
                          "t_start": self.t, "t_end": self.t + dur, "tlb_misses": walks})
        self.t += dur + 200

    def gemm(self, m: int, n: int, k: int, s_ab: int = 4, bias: bool = False) -> None:
        flops = 2 * m * n * k + (m * n if bias else 0)
        rd = (m * k + k * n) * s_ab + (n * 4 if bias else 0)
        self.cmd(Opcode.GEMM, flops, rd, m * n * 4,
                 hw.TACC_DT_BF16 if s_ab == 2 else hw.TACC_DT_FP32,
                 hw.TACC_GEMM_F_BIAS if bias else 0)

    def step(self, rows: int, ctx: int, bf16: bool = False) -> None:
        """One forward pass of ``rows`` token rows (all sequences), ``ctx`` positions."""
        self.cmd(Opcode.GATHER, 0, 4 * rows + rows * D * 4, rows * D * 4)
        for _ in range(LAYERS):
            self.cmd(Opcode.NORM, 8 * rows * D, rows * D * 4 + 2 * D * 4, rows * D * 4)
            for n, k, bias in ((3 * D, D, False), (D, D, True), (4 * D, D, True),
                               (D, 4 * D, True)):
                if bf16:  # the activations cast to bf16 in front
                    self.cmd(Opcode.ELTWISE, 0, rows * k * 4, rows * k * 2,
                             subop=hw.TACC_ELT_CAST)
                self.gemm(rows, n, k, 2 if bf16 else 4, bias)
            heads = 4  # attention: batched over heads, fp32 (the KV cache)
            self.cmd(Opcode.GEMM, 2 * heads * rows * ctx * 32,
                     heads * (rows * 32 + 32 * ctx) * 4, heads * rows * ctx * 4)
            self.cmd(Opcode.SOFTMAX, 5 * heads * rows * ctx, heads * rows * ctx * 4,
                     heads * rows * ctx * 4)
            self.cmd(Opcode.ELTWISE, rows * D, 2 * rows * D * 4, rows * D * 4)
        if bf16:
            self.cmd(Opcode.ELTWISE, 0, rows * D * 4, rows * D * 2, subop=hw.TACC_ELT_CAST)
        self.gemm(rows, V, D, 2 if bf16 else 4)


def _write(path: Path, dev: Dev, ranges: list[tuple[str, int, int]]) -> None:
    with CaptureWriter(path, {"node": "n0", "devices": [DEV]}) as w:
        rid = w.string_id("range")
        a = np.zeros(len(ranges), API_DTYPE)
        for i, (name, t0, t1) in enumerate(ranges):
            a[i]["name_id"], a[i]["args_id"] = rid, w.string_id(name)
            a[i]["t_start"], a[i]["t_end"], a[i]["pid"], a[i]["tid"] = t0, t1, 100, 100
        w.append("api", a)
        d = np.zeros(len(dev.rows), DEVICE_TRACE_DTYPE)
        for i, r in enumerate(dev.rows):
            for k, v in r.items():
                d[i][k] = v
            d[i]["t_fetch"] = r["t_start"]
            d[i]["engine"], d[i]["version"], d[i]["tag"] = 2, 3, i + 1
        w.append("device_trace", d)


def _decode(path: Path, batch: int, serial: bool, bf16: bool = False, prompt: int = 8,
            tokens: int = 4) -> int:
    """Prefill and decode steps, the sequences one after another (``serial``) or as one
    batch; returns the roofline device time (sum of the commands' durations)."""
    dev = Dev()
    ranges = []
    for group in ([1] * batch if serial else [batch]):
        for j in range(tokens):
            t0 = dev.t
            rows = group * (prompt if j == 0 else 1)
            dev.step(rows, prompt + j, bf16)
            ranges.append(("prefill" if j == 0 else f"decode step {j}", t0 - 100, dev.t))
    _write(path, dev, ranges)
    return sum(r["t_end"] - r["t_start"] for r in dev.rows)


def _findings(path: Path) -> dict[str, Any]:
    return {f.rule: f for f in analyze(open_capture(path))}


def test_memory_bound_fires_on_serial_only_estimate_matches(tmp_path: Path) -> None:
    bad = _decode(tmp_path / "bad", 2, serial=True)
    good = _decode(tmp_path / "good", 2, serial=False)
    fb, fg = _findings(tmp_path / "bad"), _findings(tmp_path / "good")
    assert "memory_bound" in fb and "memory_bound" not in fg
    f = fb["memory_bound"]
    meas = bad - good
    # the batched twin reads the weights once, its activations' pages and walks as the
    # model gives them: the estimate is the difference within the walks of the larger
    # activations (a few pages per command)
    assert abs(f.time_lost_ns - meas) <= 0.05 * meas, (f.time_lost_ns, meas)
    ev = f.evidence
    assert ev["repeated_ranges"] == {"prefill": 2, "decode step 1": 2, "decode step 2": 2,
                                     "decode step 3": 2}
    assert ev["gemm_shape"] == [1, 512, 128]  # the LM head: the most time of a GEMM
    rows = ev["rows_to_reach_ridge"]
    r = 7575 / 300
    inten = [2 * b * V * D / ((b * D + D * V) * 4 + b * V * 4) for b in (rows - 1, rows)]
    assert inten[0] < r <= inten[1]


def test_precision_fires_on_fp32_only_estimate_matches(tmp_path: Path) -> None:
    bad = _decode(tmp_path / "bad", 2, serial=False)
    good = _decode(tmp_path / "good", 2, serial=False, bf16=True)
    fb, fg = _findings(tmp_path / "bad"), _findings(tmp_path / "good")
    assert "precision" in fb and "precision" not in fg
    f = fb["precision"]
    meas = bad - good
    assert meas > 0
    assert abs(f.time_lost_ns - meas) <= 0.15 * meas, (f.time_lost_ns, meas)
    # the weights' bytes, halved: per step 2 layers of (3 + 1 + 4 + 4) D^2 and the LM head
    w = (LAYERS * 12 * D * D + D * V) * 4
    assert f.evidence["weight_bytes_saved"] == 4 * w // 2
    assert "memory_bound" not in fb  # nothing repeated


@pytest.mark.parametrize("serial", [False, True])
def test_old_capture_without_v3_has_no_roofline_findings(tmp_path: Path, serial: bool) -> None:
    _decode(tmp_path / "c", 2, serial)
    cap = tmp_path / "c" / "streams" / "device_trace.tcs"
    assert cap.exists()
    # the same capture as version-2 records: no FLOPs, no bytes, no findings, no report
    from tacc.capture import writer as w

    recs = open_capture(tmp_path / "c").read("device_trace")
    recs["version"] = 2
    for k in ("flops", "bytes_read", "bytes_written", "dtype", "subop"):
        recs[k] = 0
    api = open_capture(tmp_path / "c").read("api")
    with CaptureWriter(tmp_path / "v2", {"node": "n0", "devices": [DEV]}) as cw:
        cw.append("device_trace", recs)
        cw.append("api", api)
    del w
    got = _findings(tmp_path / "v2")
    assert "memory_bound" not in got and "precision" not in got
    assert report(open_capture(tmp_path / "v2")) == {}


def test_report_steps_and_roofline(tmp_path: Path) -> None:
    total = _decode(tmp_path / "c", 2, serial=False)
    rep = report(open_capture(tmp_path / "c"))
    steps = rep["steps"]
    assert [s["name"] for s in steps] == ["prefill", "decode step 1", "decode step 2",
                                          "decode step 3"]
    # every command is on the roofline here: compute + memory = the device time
    assert sum(s["compute_ns"] + s["memory_ns"] for s in steps) == total
    (fn,) = rep["roofline"]
    cap = open_capture(tmp_path / "c")
    assert fn["function"] == cap.functions[0].name
    assert fn["ops"] == {int(o): o.name for o in sorted({Opcode(int(p[2])) for p in fn["points"]})}
    assert fn["peak_gflops"] == {"fp32": 7575.0, "bf16": 30250.0}
    assert fn["devmem_gbps"] == 300.0 and fn["reported"]
    pts = np.array([p[:2] for p in fn["points"]])
    # achieved FLOP/s never above the roof: min(peak, intensity * bandwidth)
    assert np.all(pts[:, 1] <= np.minimum(30250.0, pts[:, 0] * 300.0) * 1.0001)


def test_timeline_args_only_for_v3_records(tmp_path: Path) -> None:
    """Chrome JSON of a version-3 capture: every command slice carries its record's FLOPs
    and bytes; of the same capture as version-2 records: no such arguments (older
    captures' timelines unchanged)."""
    import json

    from tacc.timeline.convert import convert

    _decode(tmp_path / "c", 2, serial=False)
    recs = open_capture(tmp_path / "c").read("device_trace")
    with CaptureWriter(tmp_path / "v2", {"node": "n0", "devices": [DEV]}) as cw:
        old = recs.copy()
        old["version"] = 2
        for k in ("flops", "bytes_read", "bytes_written", "list_id", "dtype", "subop"):
            old[k] = 0
        cw.append("device_trace", old)
    for name, v3 in (("c", True), ("v2", False)):
        out = tmp_path / f"{name}.json"
        convert([tmp_path / name], out, fmt="json")
        ev = json.loads(out.read_text())
        ev = ev["traceEvents"] if isinstance(ev, dict) else ev
        sl = [e for e in ev if e.get("ph") == "X" and "tag" in e.get("args", {})]
        assert len(sl) == len(recs)
        if not v3:
            assert not [e for e in sl if "flops" in e["args"]]
            continue
        by_tag = {int(t): (int(f), int(r), int(w)) for t, f, r, w in
                  zip(recs["tag"], recs["flops"], recs["bytes_read"], recs["bytes_written"],
                      strict=True)}
        got = {int(e["args"]["tag"]): (e["args"]["flops"], e["args"]["bytes_read"],
                                       e["args"]["bytes_written"]) for e in sl}
        assert got == by_tag


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_html_roofline_and_steps_render(tmp_path: Path) -> None:
    """The HTML view of a version-3 capture opens its roofline and step panel in headless
    Chromium: every roofline point drawn, one table row per step with the step's times;
    the view of the same capture without version-3 records has no such panel."""
    from tacc.timeline.convert import convert

    _decode(tmp_path / "c", 2, serial=True)
    out = tmp_path / "v.html"
    rep = report(open_capture(tmp_path / "c"))
    convert([tmp_path / "c"], out, fmt="html", report=rep)
    html, err = dump_dom(out, tmp_path / "prof")
    assert f'data-roofline="{len(rep["roofline"][0]["points"])}"' in html, err[-2000:]
    assert f'data-steps="{len(rep["steps"])}"' in html and len(rep["steps"]) == 8
    for s in rep["steps"]:
        assert f'data-step="{s["name"]}"' in html
    first = rep["steps"][0]
    assert f"<td>{first['memory_ns'] / 1e6:.3f}</td>" in html.replace(
        ' style="text-align: right; padding: 2px 6px;"', "")
    assert "Uncaught" not in err
    recs = open_capture(tmp_path / "c").read("device_trace")
    recs["version"] = 2
    with CaptureWriter(tmp_path / "v2", {"node": "n0", "devices": [DEV]}) as cw:
        cw.append("device_trace", recs)
    convert([tmp_path / "v2"], tmp_path / "v2.html", fmt="html",
            report=report(open_capture(tmp_path / "v2")))
    text = (tmp_path / "v2.html").read_text()
    assert 'id="rep"' not in text and "__REPORT" not in text and '"report"' not in text


def test_perfetto_slices_carry_flops_and_bytes(tmp_path: Path) -> None:
    """The Perfetto trace of a version-3 capture: each command slice's debug annotations
    hold its record's tag, FLOPs and bytes read and written."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.timeline.convert import convert

    _decode(tmp_path / "c", 2, serial=False)
    recs = open_capture(tmp_path / "c").read("device_trace")
    want = {int(t): (int(f), int(r), int(w)) for t, f, r, w in
            zip(recs["tag"], recs["flops"], recs["bytes_read"], recs["bytes_written"],
                strict=True)}
    out = tmp_path / "t.pftrace"
    convert([tmp_path / "c"], out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    names = {e.iid: e.name for p in tr.packet for e in p.interned_data.debug_annotation_names}
    got = {}
    for p in tr.packet:
        if p.HasField("track_event") and p.track_event.debug_annotations:
            a = {names[d.name_iid]: d.uint_value for d in p.track_event.debug_annotations}
            if "flops" in a:
                got[a["tag"]] = (a["flops"], a["bytes_read"], a["bytes_written"])
    assert got == want


def test_model_ns_and_batch_to_ridge_by_hand() -> None:
    """model_ns is tacc.model's time with the device's own peaks, in the capture's time
    (time_scale 2: twice the nanoseconds); batch_to_ridge solves the docstring's inequality
    (hand-computed here), None when the denominator is not positive."""
    from tacc.analyze.roofline import GemmShape, batch_to_ridge, model_ns
    from tacc.capture.devinfo import Function

    f = Function(0, "0000:01:00.0", "0000:01:00.0", 0, 4, 16, 256, 1e9, 2.0, 1 << 30,
                 peak_fp32_gflops=1000.0, devmem_gbps=50.0)
    # compute bound on 1000 GFLOP/s: 1e9 FLOPs take 1e6 ns plus the command latency
    want = (1e9 / 1000.0 + P.cmd_latency_ns) * 2.0
    assert model_ns(f, 1e9, 1e3, "fp32") == want
    assert model_ns(f, 1e9, 1e3, "fp32") == 2.0 * model.compute_ns(1e9, 1e3, "fp32",
                                                                   f.model_params())
    # 2 b m n k >= R ((b m k + k n) s_ab + b m n s_c): m 2, n k 64, 4-byte operands, R 8
    # -> b m (2 n k - R (k s_ab + n s_c)) >= R k n s_ab -> 8192 b >= 131072 -> b 16, 32 rows
    assert batch_to_ridge(GemmShape(2, 64, 64, 4, 4, False), 8.0) == 32
    assert batch_to_ridge(GemmShape(1, 1, 1, 4, 4, False), 0.125) == 1  # denominator 1
    assert batch_to_ridge(GemmShape(1, 4, 4, 4, 4, False), 1.0) is None  # denominator 0
