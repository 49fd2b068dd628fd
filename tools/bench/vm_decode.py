#!/usr/bin/env python3
"""In-guest: tokens/s of the decode workload under each tracer, side by side.

Runs inside the VM as root (``make bench BENCH=decode``: its own boot, scripts/bench.sh
gives the device its memory and time scale, ``-global tacc.devmem-size=1G -global
tacc.time-scale=...``, and the guest 8 GiB).  For each batch (default 1 and 8) one
decoder is built and loaded (tacc.workloads.decode: GPT-2 small's shapes by default,
fp32 weights resident, the LM head as block GEMMs, prefill and decode step captured as
command lists and replayed), then ``--rounds`` rounds each run one phase per mode, the
mode order rotated per round (round r starts at mode r), so drift hits every mode alike.
A phase is one greedy generation: ``--prompt`` tokens prefilled, ``--tokens`` generated
per sequence; tokens/s = batch x tokens over the guest-clock time from the prompt's
upload to the last token on the host (as ``tacc run decode`` reports it), no
reference check.  Modes:

  untraced    taccd SIGSTOPped (a stopped process costs nothing), no tracer
  taccd       a taccd capture with ``tacc trace start``'s defaults (API records, host
              events, IOCTL records, driver events, device trace, counters from taccd's
              loop, clock pairs)
  taccd-jobs  the jobs-scope capture (vm_tracing.py's): driver job events, device trace,
              device-sampled counters, clock pairs; ``api: false, host_events: false,
              ioctl_events: false``
  perf        ``perf record -e 'tacc:*' -a`` with perf's default ring (peers.py)
  bpftrace    a bpftrace script printing every tacc event to a file (peers.py)

Per phase also: the time to first token, the mean decode step, the tracer's CPU share and
its drops.  Per batch, from its first default (``taccd``) capture: where a step's time goes
(tacc.analyze.report's step breakdown: host, of which in the runtime's API calls, device
compute- and memory-bound time, link; prefill and the mean decode step) and the
findings of ``tacc analyze`` (rule, estimated time lost, the ranges they span).
Per batch: the modelled device's roofline bound (decodestats.py) from the device's peak
and bandwidth (tacc.model's defaults, the device's own ROOFLINE registers when it reports
them) times its time scale (sysfs ``time_scale``), in guest-clock tokens/s.  Per batch
also the set-up: the weights' generation (once per process), the decoder's build (graphs,
shape inference, lowering), the weights' upload, the capture.

    vm_decode.py [--config gpt2] [--batches 1,8] [--prompt 8] [--tokens 16] [--rounds 9]
                 [--modes untraced,taccd,taccd-jobs,perf,bpftrace] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import decodestats  # noqa: E402
import peers  # noqa: E402
from vm_tracing import CAPTURE_OPTIONS, Taccd, cpu_s, guest_function  # noqa: E402

MODES = ("untraced", "taccd", "taccd-jobs", "perf", "bpftrace")
CAPTURES: dict[str, dict[str, Any]] = {"taccd": {},
                                       "taccd-jobs": CAPTURE_OPTIONS["taccd-jobs"]}


class Phases:
    """One decoder (config, batch, prompt) and the tracer of each phase around it."""

    def __init__(self, d: Taccd, tmp: Path, node: str, config: str, batch: int,
                 prompt: int, tokens: int) -> None:
        import numpy as np
        from tacc.models import gpt2
        from tacc.runtime import Context
        from tacc.workloads.decode import Decoder, _weights

        self.d, self.tmp, self.node, self.seq = d, tmp, node, 0
        self.analysis: dict[str, Any] | None = None
        self.batch, self.tokens = batch, tokens
        self.ctx = Context()
        self.cfg = gpt2.get_config(config)
        self.s = self.ctx.stream()
        t = time.monotonic()
        _weights(config)  # generated once per process (cached): 0 for the next batch
        self.weights_s = time.monotonic() - t
        t = time.monotonic()
        self.dec = Decoder(self.ctx, self.cfg, "fp32", batch, prompt)
        self.build_s = time.monotonic() - t
        self.load_s = self.dec.load(self.s) / 1e9
        self.capture_s = self.dec.capture(self.s) / 1e9
        self.ids = np.asarray(gpt2.prompt(self.cfg, batch, prompt, 7))
        t = time.monotonic()
        self.first = self.dec.generate(self.s, self.ids, tokens)  # first-use costs
        self.first_s = time.monotonic() - t

    def run(self, mode: str) -> dict[str, Any]:
        self.seq += 1
        tool: peers.Tool | None = None
        if mode not in CAPTURES:
            self.d.pause()
        cap = None
        if mode in CAPTURES:
            cap = self.d.start(CAPTURES[mode])
        elif mode == "perf":
            tool = peers.Perf(self.tmp, self.seq, None)
        elif mode == "bpftrace":
            tool = peers.Bpftrace(self.tmp, self.seq, self.node)
        if tool is not None:
            tool.start()
        pid = tool.pid if tool is not None else self.d.p.pid
        gc.collect()
        gc.disable()
        self.dec.warm(self.s, self.ids)  # one GATHER: the device resumed before the phase
        c0, t0 = cpu_s(pid), time.monotonic()
        r = self.dec.generate(self.s, self.ids, self.tokens)
        dt = time.monotonic() - t0
        cpu = (cpu_s(pid) - c0) / dt if mode != "untraced" else 0.0
        gc.enable()
        out: dict[str, Any] = {"mode": mode, "tokens_per_s": self.batch * self.tokens / dt,
                               "wall_s": dt, "ttft_ms": r.ttft_ns / 1e6,
                               "tpot_ms": (sum(r.step_ns) / len(r.step_ns) / 1e6
                                           if r.step_ns else 0.0),
                               "cpu": cpu, "drops": 0,
                               "same_tokens": bool((r.tokens == self.first.tokens).all())}
        if cap is not None:
            s = self.d.stop()
            out["drops"] = peers.drops_total(s.get("drops", {}))
            if out["drops"]:
                out["drops_by_source"] = s.get("drops", {})
            if mode == "taccd" and self.analysis is None:
                self.analysis = analyse(cap)
            shutil.rmtree(cap, ignore_errors=True)
        elif tool is not None:
            tool.stop()
            out["drops"] = tool.lost
            tool.cleanup()
        if mode not in CAPTURES:
            self.d.resume()
        return out

    def close(self) -> None:
        self.dec.free()
        self.ctx.close()


def analyse(path: str) -> dict[str, Any]:
    """A default capture's step breakdown (prefill, the mean of the decode steps; ns) and
    its findings."""
    from tacc.analyze import report
    from tacc.analyze.data import load
    from tacc.analyze.engine import analyze
    from tacc.capture import open_capture

    cap = open_capture(path)
    rows = report.steps(load(cap))
    keys = ("wall_ns", "host_ns", "submit_ns", "compute_ns", "memory_ns", "link_ns",
            "storage_ns", "flops", "bytes")
    dec = [r for r in rows if r["name"].startswith("decode step")]
    out: dict[str, Any] = {"steps": rows, "breakdown": {}}
    for name, rs in (("prefill", [r for r in rows if r["name"] == "prefill"]),
                     ("decode step (mean)", dec)):
        if rs:
            out["breakdown"][name] = {k: sum(r[k] for r in rs) / len(rs) for k in keys}
    out["findings"] = [{"rule": f.rule, "severity": f.severity,
                        "time_lost_ms": f.time_lost_ns / 1e6, "share": f.share,
                        "title": f.title, "suggestion": f.suggestion,
                        "ranges": f.evidence.get("ranges", [])}
                       for f in analyze(cap)]
    return out


def print_analysis(batch: int, a: dict[str, Any]) -> None:
    print(f"\nbatch {batch}: where a step's time goes (ms, one default capture)")
    print(f"{'step':<20} {'wall':>8} {'host':>8} {'submit':>8} {'compute':>8} "
          f"{'memory':>8} {'link':>8} {'GFLOP':>8} {'MB':>8}")
    for name, r in a["breakdown"].items():
        print(f"{name:<20} {r['wall_ns'] / 1e6:8.1f} {r['host_ns'] / 1e6:8.1f} "
              f"{r['submit_ns'] / 1e6:8.1f} {r['compute_ns'] / 1e6:8.1f} "
              f"{r['memory_ns'] / 1e6:8.1f} {r['link_ns'] / 1e6:8.1f} "
              f"{r['flops'] / 1e9:8.2f} {r['bytes'] / 1e6:8.1f}")
    print(f"findings: {len(a['findings'])}")
    for f in a["findings"]:
        print(f"  {f['severity']:<6} {f['rule']:<18} {f['time_lost_ms']:9.1f} ms lost "
              f"({f['share'] * 100:.0f} %): {f['title']}"
              + (f" [{', '.join(list(f['ranges'])[:3])}]" if f["ranges"] else ""))


def model_shape(config: str, dev: dict[str, Any] | None = None) -> dict[str, float]:
    """What the roofline bound needs: the model's shapes, the device's peak (fp32, one
    compute engine: its PEAK_FP32_GFLOPS register when reported, else tacc.model's
    default) and device-memory bandwidth (tacc.model), and its time scale (``dev``:
    the function's meta(); 1 without it)."""
    from tacc import model
    from tacc.models import gpt2

    c = gpt2.get_config(config)
    p = model.DEFAULT
    dev = dev or {}
    return {"n_layer": c.n_layer, "d_model": c.d_model, "vocab": c.vocab,
            "peak_gflops": dev.get("peak_fp32_gflops") or p.peak_gflops["fp32"],
            "devmem_gbps": p.devmem_gbps, "time_scale": dev.get("time_scale", 1.0)}


def roofline(shape: dict[str, float], batch: int, prompt: int, tokens: int
             ) -> dict[str, float]:
    return decodestats.roofline(batch=batch, span=decodestats.mean_span(prompt, tokens),
                                **shape)


def table(batch: int, rows: list[dict[str, Any]], bound: dict[str, float]) -> None:
    print(f"\nbatch {batch}: tokens/s, medians of {max(r['n'] for r in rows)} interleaved "
          f"rounds (roofline bound {bound['tokens_per_s']:.0f} tokens/s, {bound['bound']})")
    print(f"{'mode':<11} {'tokens/s':>9} {'95% CI':>17} {'min..max':>17} {'x untraced':>10} "
          f"{'95% CI':>15} {'tracer CPU':>10} {'drops':>6}")
    for r in rows:
        print(f"{r['mode']:<11} {r['median']:9.2f} [{r['ci'][0]:7.2f},{r['ci'][1]:7.2f}] "
              f"[{r['spread'][0]:7.2f},{r['spread'][1]:7.2f}] {r['ratio']:10.3f} "
              f"[{r['ratio_ci'][0]:6.3f},{r['ratio_ci'][1]:6.3f}] "
              f"{r['tracer_cpu_share'] * 100:9.1f}% {r['drops']:6d}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="gpt2", help="gpt2 (GPT-2 small's shapes) or tiny")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16, help="generated per sequence")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    fn = guest_function("vm_decode")
    node, dev = fn.accel, fn.meta()
    modes = [m for m in a.modes.split(",") if m]
    if decodestats.BASE not in modes or any(m not in MODES for m in modes):
        print(f"vm_decode: --modes from {', '.join(MODES)}, with untraced", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="vm-decode-"))
    d = Taccd(tmp)
    t_all = time.monotonic()
    out: dict[str, Any] = {"bench": "decode", "config": a.config, "dtype": "fp32",
                           "prompt": a.prompt, "tokens": a.tokens, "rounds": a.rounds,
                           "modes": modes, "results": {}, "runs": {}, "roofline": {},
                           "setup": {}, "model": model_shape(a.config, dev),
                           "device": {k: dev.get(k) for k in ("devmem", "time_scale",
                                                               "peak_fp32_gflops")}}
    try:
        t = time.monotonic()
        d.start()  # compile the capture program once, outside any measured phase
        d.stop()
        out["capture_first_start_s"] = time.monotonic() - t
        for b in [int(x) for x in a.batches.split(",") if x]:
            ph = Phases(d, tmp, node, a.config, b, a.prompt, a.tokens)
            out["setup"][str(b)] = {"weights_s": ph.weights_s, "build_s": ph.build_s,
                                    "load_s": ph.load_s, "capture_s": ph.capture_s,
                                    "first_run_s": ph.first_s}
            print(f"batch {b}: weights {ph.weights_s:.1f} s, build {ph.build_s:.1f} s, load "
                  f"{ph.load_s:.1f} s, capture {ph.capture_s:.1f} s, first run "
                  f"{ph.first_s:.1f} s", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            try:
                for r, order in enumerate(decodestats.rotations(modes, a.rounds)):
                    for mode in order:
                        res = ph.run(mode)
                        res["round"] = r
                        runs[mode].append(res)
                        print(f"  round {r + 1} batch {b} {mode:<10} "
                              f"{res['tokens_per_s']:8.2f} tokens/s ttft "
                              f"{res['ttft_ms']:8.1f} ms tpot {res['tpot_ms']:8.1f} ms cpu "
                              f"{res['cpu'] * 100:5.1f}% drops {res['drops']}", flush=True)
            finally:
                ph.close()
            if ph.analysis is not None:
                out.setdefault("analysis", {})[str(b)] = ph.analysis
                print_analysis(b, ph.analysis)
            rows = decodestats.summarize({m: [x["tokens_per_s"] for x in rs]
                                          for m, rs in runs.items()})
            for row in rows:
                rs = runs[row["mode"]]
                row["tracer_cpu_share"] = decodestats.median([x["cpu"] for x in rs])
                row["drops"] = sum(x["drops"] for x in rs)
                row["ttft_ms"] = decodestats.median([x["ttft_ms"] for x in rs])
                row["tpot_ms"] = decodestats.median([x["tpot_ms"] for x in rs])
                row["same_tokens"] = all(x["same_tokens"] for x in rs)
            bound = roofline(out["model"], b, a.prompt, a.tokens)
            out["results"][str(b)], out["runs"][str(b)] = rows, runs
            out["roofline"][str(b)] = bound
            table(b, rows, bound)
    finally:
        d.close()
    out["wall_s"] = time.monotonic() - t_all
    print(f"\nvm_decode: {out['wall_s']:.0f} s of guest time")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
