"""Capture(s) -> timeline outputs, in one streaming pass."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tacc.capture import CaptureError, open_capture

from .chrome_json import JsonSink, Ranks
from .html import HtmlSink
from .model import Batch, CounterBatch, Extractor, make_sources
from .perfetto import PerfettoSink
from .summary import SummarySink, write_text

FINDINGS_UUID_BASE = 0x7ACD_0000


@dataclass
class Result:
    events: int = 0
    tracks: int = 0
    outputs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    summary: str = ""
    summary_json: dict[str, Any] = field(default_factory=dict)  # the summary's source
    device_events: dict[str, int] = field(default_factory=dict)  # kind name -> instants


def load_findings(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{path}: cannot read findings ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != "tacc-findings":
        raise CaptureError(f"{path}: not a tacc findings file")
    if data.get("version") != 1:
        raise CaptureError(f"{path}: findings version {data.get('version')!r} is not supported")
    return list(data.get("findings", []))


def convert(
    captures: list[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None,
    fmt: str = "perfetto",
    summary: bool = False,
    findings: list[dict[str, Any]] | None = None,
    renames: list[str] | None = None,
    align: str = "auto",
    progress: Any = None,
    report: dict[str, Any] | None = None,
) -> Result:
    """Write ``out`` in ``fmt`` (perfetto, json, html; hta: ``out`` a directory of one
    Chrome JSON per node/function rank); optionally build the text summary.
    Several captures are merged as a cluster (tacc.timeline.cluster: node ids, clock
    alignment, cross-node messages); ``renames`` are ``CAPTURE=NAME`` items; ``report``:
    the HTML view's roofline and steps (tacc.analyze.report, version-3 captures)."""
    caps = [open_capture(c) for c in captures]
    view = None
    if len(caps) > 1:
        from .cluster import open_view, parse_renames

        view = open_view(caps, parse_renames(renames), align)
    sources = make_sources(caps, view)
    ex = Extractor(sources, view)
    meta = ex.metadata()
    t0 = min((c.time_range[0] for c in caps), default=0) if fmt == "perfetto" else 0
    res = Result()
    fh: Any = None
    pf: PerfettoSink | None = None
    js: JsonSink | None = None
    ht: HtmlSink | None = None
    sm = SummarySink(names=ex.names) if summary else None
    if out is not None:
        if fmt == "perfetto":
            fh = open(out, "wb")
            pf = PerfettoSink(io.BufferedWriter(fh, 1 << 22), ex.names, t0, meta,  # type: ignore[arg-type]
                              os_tracks=len(sources) == 1)
        elif fmt in ("json", "hta"):
            ranks = Ranks([(s.node_idx, s.node, [f.name for f in s.cap.functions])
                           for s in sources])
            if fmt == "json":
                fh = open(out, "w", buffering=1 << 22)
                js = JsonSink(lambda _r: fh, meta, ranks)
            else:  # a directory of one Chrome JSON per rank (HTA's trace_dir)
                hta_dir = Path(out)
                hta_dir.mkdir(parents=True, exist_ok=True)
                for old in hta_dir.glob("rank*.json"):
                    old.unlink()
                js = JsonSink(lambda r: open(hta_dir / f"rank{r}.json", "w",  # noqa: SIM115
                                             buffering=1 << 20), meta, ranks, split=True)
        elif fmt == "html":
            ht = HtmlSink()
            ht.findings = list(findings or [])
            ht.report = dict(report or {})
        else:
            raise CaptureError(f"unknown output format {fmt!r}")
    total = sum(c.count(s) for c in caps for s in c.streams)
    try:
        uuids = np.zeros(0, np.int64)
        for b in ex.all():
            new = ex.tracks.take_pending()
            if new:
                uuids = np.array([t.uuid for t in ex.tracks.tracks], np.uint64)
                if pf:
                    pf.tracks(new, ex.tracks.tracks)
                if js:
                    js.tracks(new, ex.tracks.tracks)
            if isinstance(b, Batch):
                if pf:
                    pf.slices(b, uuids)
                if js:
                    js.slices(b, ex.tracks.tracks, ex.names.lookup())
                if ht:
                    ht.slices(b)
                if sm:
                    sm.slices(b, ex.tracks.tracks)
            elif isinstance(b, CounterBatch):
                if pf:
                    pf.counters(b, uuids)
                if js:
                    js.counters(b, ex.tracks.tracks)
                if ht:
                    ht.counters(b)
                if sm:
                    sm.counters(b)
            res.events += len(b)
            if progress is not None:  # (events so far, the captures' records)
                progress(res.events, total)
        if findings:
            if pf:
                root = ex.tracks.tracks[0].uuid if ex.tracks.tracks else 0
                pf.findings(findings, root, FINDINGS_UUID_BASE)
            if js:
                js.findings(findings)
        if js:
            js.close()
        if pf:
            pf.f.flush()
        if ht and out is not None:
            with open(out, "w") as f:
                title = "tacc timeline: " + ", ".join(s.node for s in sources)
                ht.write(f, ex.tracks.tracks, ex.names.lookup(), meta, title)
    finally:
        if fh is not None:
            fh.close()
    res.tracks = len(ex.tracks.tracks)
    res.device_events = dict(sorted(ex.device_event_counts.items()))
    res.problems = [f"{c.path}: {p}" for c in caps for p in c.problems]
    if out is not None:
        res.outputs.append(str(out))
    if sm:
        doc = sm.to_json(ex.tracks.tracks, ex.names.lookup(), res.problems)
        doc["device_events"] = {"total": sum(res.device_events.values()),
                                "by_kind": res.device_events}
        buf = io.StringIO()
        write_text(buf, doc)
        res.summary, res.summary_json = buf.getvalue(), doc
    return res
