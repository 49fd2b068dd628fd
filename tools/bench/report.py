#!/usr/bin/env python3
"""build/bench/report.html from the benchmarks' JSON (``make bench`` runs it last).

One self-contained page (no script, no network; every plot a matplotlib PNG inlined as a
data: URI) beside the JSON it is drawn from:

* link bandwidth vs transfer size, one panel per configuration (``link*.json``, from
  bench_link.py), measured points and the formula's curve (docs/hardware.md);
* overhead per tool and workload (``tracing.json``, vm_tracing.py): throughput as a
  fraction of "nothing" with its 95 % interval, one bar per mode;
* NOP latency histograms (``driver.json`` ``nop_latency.samples_us``, vm_driver.py; and
  per tracing mode where tracing.json has ``latency_us``);
* counter sampling CPU vs rate (``counters.json`` ``sampling_sweep``, bench_counters.py);
* decode tokens/s vs batch per tracing mode under the modelled device's roofline bound
  (``decode.json``, vm_decode.py), and its table of ratios to untraced.

A section whose JSON is missing says so instead of a plot.

    report.py [--dir build/bench] [-o build/bench/report.html]
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "userspace"))
from tacc.errors import MissingExtraError, require_extra  # noqa: E402

try:
    matplotlib: Any = require_extra("matplotlib", "bench", "make bench's report")
except MissingExtraError as exc:
    raise SystemExit(f"report: {exc}") from None
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _load(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def link_section(d: Path) -> str:
    files = sorted(d.glob("link*.json"))
    runs = [(f, _load(f)) for f in files]
    runs = [(f, r) for f, r in runs if r and r.get("rows")]
    if not runs:
        return "<p>No link sweep (link*.json) in this run.</p>"
    out = []
    for f, r in runs:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for dr, color in (("h2d", "tab:blue"), ("d2h", "tab:orange")):
            rows = sorted((x for x in r["rows"] if x["dir"] == dr), key=lambda x: x["size"])
            if not rows:
                continue
            xs = [x["size"] for x in rows]
            ax.plot(xs, [x["formula_gbps"] for x in rows], "-", color=color, alpha=0.6,
                    label=f"{dr} formula")
            ax.plot(xs, [x["bw_gbps"] for x in rows], "o", color=color, ms=4,
                    label=f"{dr} measured")
        if r.get("link_peak_gbps"):
            ax.axhline(r["link_peak_gbps"], ls=":", color="grey", label="link peak")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("transfer size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"link bandwidth vs size: {r.get('props', f.stem)}")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        worst = max(abs(x.get("err_pct", 0.0)) for x in r["rows"])
        out.append(f"<h3>{html.escape(str(r.get('props', f.stem)))} ({html.escape(f.name)})"
                   f"</h3>{_img(_png(fig), 'link ' + f.stem)}"
                   f"<p>worst deviation from the formula: {worst:.3f} %</p>")
    return "\n".join(out)


def tracing_section(t: Any) -> str:
    if not t or not t.get("results"):
        return "<p>No tracing benchmark (tracing.json) in this run.</p>"
    res = t["results"]
    out = []
    fig, axes = plt.subplots(1, len(res), figsize=(5.5 * len(res), 3.6), squeeze=False)
    for ax, (wl, rows) in zip(axes[0], res.items(), strict=True):
        names = [r["mode"] for r in rows]
        ratio = [r["ratio"] for r in rows]
        lo = [r["ratio"] - r["ratio_ci"][0] for r in rows]
        hi = [r["ratio_ci"][1] - r["ratio"] for r in rows]
        ax.bar(names, ratio, yerr=[lo, hi], capsize=4, color="tab:green", alpha=0.8)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylim(0, max(1.1, max(ratio) + 0.1))
        ax.set_ylabel("throughput x nothing")
        ax.set_title(f"{wl}: overhead per tool (95 % CI)")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    out.append(_img(_png(fig), "overhead per tool"))
    for wl, rows in res.items():
        out.append(f"<h3>{html.escape(wl)}</h3><table><tr><th>mode</th><th>median /s</th>"
                   "<th>95 % CI</th><th>x nothing</th><th>95 % CI</th><th>tracer CPU</th>"
                   "<th>facts kept</th><th>drops</th></tr>")
        for r in rows:
            out.append(
                f"<tr><td>{html.escape(r['mode'])}</td><td>{r['median']:.1f}</td>"
                f"<td>{r['ci'][0]:.1f} - {r['ci'][1]:.1f}</td><td>{r['ratio']:.3f}</td>"
                f"<td>{r['ratio_ci'][0]:.3f} - {r['ratio_ci'][1]:.3f}</td>"
                f"<td>{r['tracer_cpu_share'] * 100:.1f} %</td>"
                f"<td>{r.get('facts_kept', 0):,} / {r.get('facts_possible', 0):,}</td>"
                f"<td>{r.get('drops', 0):,}</td></tr>")
        out.append("</table>")
    return "\n".join(out)


def latency_section(drv: Any, t: Any) -> str:
    sets: list[tuple[str, list[float]]] = []
    if drv and drv.get("nop_latency", {}).get("samples_us"):
        sets.append(("driver bench (no tracer)", drv["nop_latency"]["samples_us"]))
    for mode, xs in ((t or {}).get("latency_us") or {}).items():
        if xs:
            sets.append((f"tracing: {mode}", xs))
    if not sets:
        return "<p>No NOP latency samples (driver.json nop_latency.samples_us) in this run.</p>"
    fig, ax = plt.subplots(figsize=(7, 3.6))
    hi = max(sorted(xs)[int(len(xs) * 0.99) - 1 if len(xs) > 1 else 0] for _, xs in sets)
    for name, xs in sets:
        ax.hist([x for x in xs if x <= hi * 1.2], bins=60, histtype="step", label=name)
    ax.set_xlabel("submit -> completion (µs, guest clock)")
    ax.set_ylabel("jobs")
    ax.set_title("one-NOP job latency")
    ax.legend(fontsize=7)
    return _img(_png(fig), "NOP latency histogram")


def counters_section(c: Any) -> str:
    sweep = (c or {}).get("sampling_sweep")
    if not sweep:
        return "<p>No counter sampling sweep (counters.json sampling_sweep) in this run.</p>"
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for be in sorted({r["backend"] for r in sweep}):
        rows = sorted((r for r in sweep if r["backend"] == be), key=lambda r: r["rate_hz"])
        ax.plot([r["rate_hz"] for r in rows], [r["cpu_share"] * 100 for r in rows], "o-",
                label=be)
    ax.axhline(1.0, ls=":", color="grey", label="1 % goal")
    ax.set_xscale("log")
    ax.set_xlabel("sampling rate (Hz)")
    ax.set_ylabel("CPU (% of one CPU)")
    ax.set_title("counter sampling CPU vs rate")
    ax.legend(fontsize=7)
    return _img(_png(fig), "counter sampling CPU vs rate")


def decode_section(dj: Any) -> str:
    if not dj or not dj.get("results"):
        return "<p>No decode benchmark (decode.json) in this run.</p>"
    import decodestats

    res = {int(b): rows for b, rows in dj["results"].items()}
    batches = sorted(res)
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in dj.get("modes") or [r["mode"] for r in res[batches[0]]]:
        pts = [(b, r) for b in batches for r in res[b] if r["mode"] == mode]
        if not pts:
            continue
        xs = [b for b, _ in pts]
        ys = [r["median"] for _, r in pts]
        err = [[r["median"] - r["ci"][0] for _, r in pts],
               [r["ci"][1] - r["median"] for _, r in pts]]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, ms=4, label=mode)
    m = dj.get("model")
    if m:
        span = decodestats.mean_span(dj.get("prompt", 0), dj.get("tokens", 0))
        bs = sorted({1, 2, 4, 8, 16, 32, 64, *batches})
        roof = [decodestats.roofline(batch=b, span=span, **m) for b in bs]
        ax.plot(bs, [r["tokens_per_s"] for r in roof], "k--", lw=1,
                label="roofline bound (device model)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("tokens/s (guest clock)")
    ax.set_title(f"decode {dj.get('config', '')}: tokens/s vs batch (95 % CI)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    out = [_img(_png(fig), "decode tokens/s vs batch")]
    out.append("<table><tr><th>batch</th><th>mode</th><th>tokens/s</th><th>95 % CI</th>"
               "<th>min - max</th><th>x untraced</th><th>95 % CI</th><th>tracer CPU</th>"
               "<th>drops</th><th>roofline bound</th></tr>")
    for b in batches:
        bound = (dj.get("roofline") or {}).get(str(b), {}).get("tokens_per_s", 0.0)
        for r in res[b]:
            out.append(
                f"<tr><td>{b}</td><td>{html.escape(r['mode'])}</td><td>{r['median']:.2f}</td>"
                f"<td>{r['ci'][0]:.2f} - {r['ci'][1]:.2f}</td>"
                f"<td>{r['spread'][0]:.2f} - {r['spread'][1]:.2f}</td><td>{r['ratio']:.3f}</td>"
                f"<td>{r['ratio_ci'][0]:.3f} - {r['ratio_ci'][1]:.3f}</td>"
                f"<td>{r.get('tracer_cpu_share', 0.0) * 100:.1f} %</td>"
                f"<td>{r.get('drops', 0):,}</td><td>{bound:.0f}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def render(d: Path) -> str:
    t = _load(d / "tracing.json")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        "<title>tacc make bench report</title><style>body{font-family:sans-serif;"
        "margin:1.5em;max-width:1200px}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
        "</style></head><body>",
        "<h1>tacc <code>make bench</code> report</h1>",
        f"<p>From the JSON in <code>{html.escape(str(d))}</code>: "
        + ", ".join(html.escape(p.name) for p in sorted(d.glob("*.json"))) + "</p>",
        "<h2>Link bandwidth vs transfer size</h2>", link_section(d),
        "<h2>Tracing overhead per tool and workload</h2>", tracing_section(t),
        "<h2>NOP latency</h2>", latency_section(_load(d / "driver.json"), t),
        "<h2>Counter sampling CPU vs rate</h2>", counters_section(_load(d / "counters.json")),
        "<h2>Decode tokens/s per tracing mode</h2>", decode_section(_load(d / "decode.json")),
        "</body></html>",
    ]
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("build/bench"))
    ap.add_argument("-o", "--output", type=Path, default=None)
    a = ap.parse_args()
    if not a.dir.is_dir():
        print(f"report: {a.dir}: no such directory", file=sys.stderr)
        return 2
    out = a.output or a.dir / "report.html"
    out.write_text(render(a.dir))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
