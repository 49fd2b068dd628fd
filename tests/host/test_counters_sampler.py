"""The sampler and the tacc stat/top/counters commands, on a fake sysfs tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from tacc.capture import CaptureWriter, open_capture
from tacc.counters import functions
from tacc.counters.fakesys import make_function
from tacc.counters.sampler import Sampler, capture_meta

TACC = str(Path(sys.executable).with_name("tacc"))  # the console script


def test_sampler_writes_counted_stream(tmp_path: Path) -> None:
    make_function(tmp_path / "sys", values={"h2d_bytes": 42, "uptime_ticks": 7})
    fns = functions(tmp_path / "sys")
    out = tmp_path / "cap"
    with Sampler(fns, 2000, "sysfs") as s, CaptureWriter(
            out, capture_meta(fns, 2000, "sysfs"),
            streams=("counters", "clock_sync", "drops")) as w:
        st = s.run(duration_s=0.2, writer=w)
    assert st.unmapped == []
    cap = open_capture(out)
    rec = cap.read("counters")
    assert len(rec) == st.samples == st.ticks > 10
    assert (rec["h2d_bytes"] == 42).all() and (rec["fid"] == 0).all()
    assert (rec["devclk"] == 7).all()  # the global uptime counter when readable
    seq = rec["seq"].astype(np.int64)
    assert int((np.diff(seq) - 1).sum()) == st.missed
    drops = cap.read("drops")
    assert int(drops["count"].sum()) == st.missed
    assert len(cap.read("clock_sync")) == 4  # 2 pairs at start, 2 at the end


def test_sampler_counts_misses_when_late(tmp_path: Path) -> None:
    make_function(tmp_path / "sys")
    fns = functions(tmp_path / "sys")
    with Sampler(fns, 10_000, "sysfs") as s:
        orig = s.sources[0].backend.read

        def slow():  # type: ignore[no-untyped-def]
            import time
            time.sleep(0.00035)
            return orig()

        s.sources[0].backend.read = slow  # type: ignore[method-assign]
        import time
        t0 = time.monotonic()
        st = s.run(duration_s=0.1)
        elapsed = time.monotonic() - t0
    assert st.missed > 0
    # every scheduled tick is a sample or a counted miss, never more than the
    # run's real length allows (a loaded machine stretches the run)
    assert st.ticks + st.missed <= int(elapsed * 10_000) + 2


def test_sampler_rejects_rates_above_10khz(tmp_path: Path) -> None:
    make_function(tmp_path / "sys")
    import pytest

    with pytest.raises(ValueError):
        Sampler(functions(tmp_path / "sys"), 20_000, "sysfs")


def _tacc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TACC_SYSFS_ROOT": str(tmp_path / "sys"), "COLUMNS": "160"}
    return subprocess.run([TACC, *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_cli_stat_list_top(tmp_path: Path) -> None:
    make_function(tmp_path / "sys", values={"h2d_bytes": 5})
    r = _tacc(tmp_path, "stat", "--json", "--", "true")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["functions"][0]["counters"]["h2d_bytes"]["value"] == 0
    r = _tacc(tmp_path, "stat", "-a", "--", "true")
    assert "h2d_bytes" in r.stdout and "seconds time elapsed" in r.stdout
    r = _tacc(tmp_path, "counters", "list")
    assert "busy_dma_h2d" in r.stdout and "tacc_100" in r.stdout
    r = _tacc(tmp_path, "top", "-n", "1", "-i", "0.05")
    assert r.returncode == 0, r.stderr
    assert "0000:01:00.0" in r.stdout
    r = _tacc(tmp_path, "stat", "-d", "0000:07:00.0", "--", "true")
    assert r.returncode == 1 and r.stderr.startswith("tacc: error:")


def test_cli_json_list_top_sample(tmp_path: Path) -> None:
    """--json of counters list, top and counters sample: one document each (top: one
    object a refresh), its values those of the catalogue, the link and the capture."""
    from tacc.cli.counters import link_of

    make_function(tmp_path / "sys", values={"h2d_bytes": 5})
    (fn,) = functions(tmp_path / "sys")
    r = _tacc(tmp_path, "counters", "list", "--json")
    assert r.returncode == 0, r.stderr
    (doc,) = json.loads(r.stdout)
    assert (doc["function"], doc["label"], doc["pmu"], doc["catalogue_version"]) == (
        fn.pci, fn.label, fn.pmu_name, fn.catalogue.version)
    assert [(c["name"], c["slot"], c["unit"]) for c in doc["counters"]] == [
        (c.name, c.slot, c.unit) for c in fn.catalogue]
    r = _tacc(tmp_path, "top", "--json", "-n", "2", "-i", "0.05")
    assert r.returncode == 0, r.stderr
    refreshes = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert len(refreshes) == 2 and all(x["interval_s"] == 0.05 for x in refreshes)
    (f,) = refreshes[-1]["functions"]
    link = link_of(fn)
    assert f["function"] == fn.pci and f["max_gbps"] == {
        d: link.max_bw(d) / 1e9 for d in ("h2d", "d2h")}
    assert f["derived"]["h2d_gbps"] == 0.0  # the fake counters do not move
    out = tmp_path / "cap"
    r = _tacc(tmp_path, "counters", "sample", "-o", str(out), "-b", "sysfs", "-r", "500",
              "-t", "0.2", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["output"] == str(out) and st["functions"] == [fn.pci]
    assert st["samples"] == len(open_capture(out).read("counters")) > 0
    r = _tacc(tmp_path, "counters", "sample", "-o", str(tmp_path / "cap2"), "-b", "sysfs",
              "-r", "500", "-t", "0.2")
    n = len(open_capture(tmp_path / "cap2").read("counters"))
    assert r.returncode == 0 and r.stdout.startswith(f"{n} samples of 1 function at "), r.stdout
