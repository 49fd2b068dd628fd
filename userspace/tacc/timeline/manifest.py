"""Per-node Perfetto traces and a ``perfetto_manifest`` that places them as the merge does.

Perfetto's trace processor and UI (since mid-2026, google/perfetto#1018, PR #6493, format
reference docs/reference/perfetto-manifest.md) open a ZIP/TAR of several traces as one
merged trace; a ``perfetto_manifest`` JSON member names each file's machine and relates
its clock to another file's.  ``write_manifest`` writes, into DIR:

* ``<node>.pftrace`` for every capture (timestamps: that node's CLOCK_MONOTONIC, as a
  single-capture ``tacc timeline`` writes them);
* ``perfetto_manifest.json``: version 1, trace time = the reference node's ``MONOTONIC``,
  one machine per node, and for every other node a ``clocks`` block relating its
  ``MONOTONIC`` to the reference's with the offset of tacc's alignment (``offset_ns`` is
  "the source clock reads T when the reference reads T + offset_ns": minus tacc's node -
  reference offset, at the middle of the overlap); the method, its bound and both
  estimates are manifest ``attributes`` (``tacc.<node>.*``), since the format states no
  uncertainty;
* ``<first node>-cluster.zip``: the traces and the manifest, the one file to open.

The manifest has a fixed offset only (no rate): over a capture of T seconds the placement
can differ from tacc's merge by the nodes' rate difference times T (``drift`` in
``tacc.<node>.drift_ppm``; under host time, a few ppm).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from .cluster import load_view


def manifest(view: Any, files: list[str]) -> dict[str, Any]:
    ref = files[0]
    entries: list[dict[str, Any]] = []
    attrs: dict[str, Any] = {"tacc.reference": view.names[0]}
    for name, f, nc in zip(view.names, files, view.clocks, strict=True):
        e: dict[str, Any] = {"path": f, "machine": {"name": name}}
        if nc.used != "reference":
            off = nc.hostclk if nc.used == "hostclk" else nc.network
            assert off is not None
            e["clocks"] = {"clock": "MONOTONIC",
                           "sync_to": {"file": ref, "clock": "MONOTONIC"},
                           "offset_ns": -int(round(off.offset_ns))}
            attrs[f"tacc.{name}.align"] = nc.used
            attrs[f"tacc.{name}.bound_ns"] = int(round(off.bound_ns))
            attrs[f"tacc.{name}.drift_ppm"] = int(round((off.drift - 1.0) * 1e6))
            for o in (nc.hostclk, nc.network):
                if o is not None:
                    attrs[f"tacc.{name}.{o.method}.offset_ns"] = int(round(o.offset_ns))
                    attrs[f"tacc.{name}.{o.method}.bound_ns"] = int(round(o.bound_ns))
        entries.append(e)
    return {"perfetto_manifest": {"version": 1, "trace_time": {"clock": "MONOTONIC",
                                                               "file": ref},
                                  "files": entries, "attributes": attrs}}


def write_manifest(captures: list[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                   renames: list[str] | None = None, align: str = "auto") -> Path:
    """Writes the per-node traces, the manifest and the archive; returns the archive."""
    from .convert import convert

    view = load_view(captures, renames, align)
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = [f"{name}.pftrace" for name in view.names]
    for cap, f in zip(captures, files, strict=True):
        convert([cap], d / f)
    doc = manifest(view, files)
    (d / "perfetto_manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    z = d / f"{view.names[0]}-cluster.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(d / "perfetto_manifest.json", "perfetto_manifest.json")
        for f in files:
            zf.write(d / f, f)
    return z
