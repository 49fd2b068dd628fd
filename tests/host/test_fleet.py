"""Fleet analysis: Parquet export, DuckDB query, Dask analysis.

Real engines throughout: pyarrow writes and reads the Parquet, DuckDB runs the SQL, Dask's
LocalCluster runs the analysis in worker processes on loopback.  Captures are written by
the real capture writer (synthetic records: tacc.capture.synth and hand-made arrays).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tacc.capture import open_capture
from tacc.capture.schema import DEVICE_TICK_FIELDS, STREAMS
from tacc.capture.synth import generate
from tacc.cli import main as tacc_main
from tacc.fleet import arrowmap
from tacc.fleet.export import MANIFEST, Exporter

DATA = Path(__file__).parent / "data"
OLD_META = DATA / "capture-v1.0"  # meta.json and complete of a minor-0 capture (text)


@functools.cache
def old_minor() -> Path:
    """A capture of format 1, minor 0: the stream files as make_capture_v1_0.py writes them
    (byte for byte what the writer of 350c768 wrote; the streams' framing has not changed),
    with the minor-0 meta.json (no "minor", that writer's stream list) and complete marker
    kept as text in tests/host/data/capture-v1.0."""
    sys.path.insert(0, str(DATA))
    import make_capture_v1_0

    out = Path(tempfile.mkdtemp(prefix="tacc-capture-v1.0-")) / "capture-v1.0"
    make_capture_v1_0.main(str(out))
    for name in ("meta.json", "complete"):
        shutil.copyfile(OLD_META / name, out / name)
    return out


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = tacc_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error(rc: int, err: str, status: int = 1) -> str:
    lines = err.strip().splitlines()
    assert rc == status and len(lines) == 1 and lines[0].startswith("tacc: error:"), (rc, err)
    assert "Traceback" not in err
    return lines[0]


# A real capture: tests/vm/test_e2e_real.py's "mixed" workload recorded by taccd's capture
# engine in the strict VM boot (real device model, tacc.ko, BPF, runtime; node "e2e"),
# taken from the run's out/e2e/captures/mixed at commit 8d8f3dd.
REAL = DATA / "real-mixed.tar.xz"


@pytest.fixture(scope="module")
def caps(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four small captures of two nodes (synthetic twin workloads, real writer), then the
    real capture of the VM."""
    root = tmp_path_factory.mktemp("caps")
    out = []
    for i, (wl, var) in enumerate([("tiny_transfers", "bad"), ("tlb_thrash", "bad"),
                                   ("serialized_copies", "good"), ("map_churn", "bad")]):
        p = root / f"node{i % 2}" / f"cap{i}"
        generate(p, wl, var, 1, i, f"node{i % 2}")
        out.append(p)
    with tarfile.open(REAL) as tf:
        tf.extractall(root)  # noqa: S202 (our own fixture; Python 3.11.2 has no filter=)
    out.append(root / "real-mixed")
    return out


# --------------------------------------------------------------- dtype -> arrow --
SCALARS = ["u1", "<u2", "<u4", "<u8", "i1", "<i2", "<i4", "<i8", ">i4", ">u8", "<f2", "<f4",
           "<f8", ">f8", "?", "S1", "S7", "U3", "V3"]


@st.composite
def dtypes(draw: Any, depth: int = 0) -> np.dtype:
    n = draw(st.integers(1, 6))
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=n,
                          max_size=n, unique=True))
    fields: list[tuple[Any, ...]] = []
    for name in names:
        kind = draw(st.sampled_from(["scalar"] * 6 + ["sub", "struct"]))
        if kind == "struct" and depth < 1:
            fields.append((name, draw(dtypes(depth + 1))))
        elif kind == "sub":
            fields.append((name, draw(st.sampled_from(SCALARS[:13])),
                           draw(st.sampled_from([(2,), (3,), (2, 2)]))))
        else:
            fields.append((name, draw(st.sampled_from(SCALARS))))
    return np.dtype(fields)


def _records(dt: np.dtype, raw: bytes, n: int) -> np.ndarray:
    arr = np.frombuffer(raw[: n * dt.itemsize].ljust(n * dt.itemsize, b"\0"), dt).copy()
    _fix(arr)
    return arr


def _fix(arr: np.ndarray) -> None:
    """Random bytes made into valid values: bools 0/1, U code points below the surrogates
    (numpy refuses to read others)."""
    for name in arr.dtype.names or ():
        col = arr[name]
        base = col.dtype
        if base.names:
            _fix(col)
        elif base.kind == "b":
            col.view(np.uint8)[...] &= 1
        elif base.kind == "U":
            v = np.ascontiguousarray(col).view(np.uint32) % 0xD000
            col[...] = v.view(base).reshape(col.shape)


def _expect(col: np.ndarray) -> list[Any]:
    """What a column should read back as (Python values from numpy)."""
    base = col.dtype
    if col.ndim > 1:
        flat = col.reshape(col.shape[0], int(np.prod(col.shape[1:])))
        return [_expect(r) for r in flat]
    if base.names:
        cols = [c.name for c in arrowmap.columns(base)]
        return [dict(zip(cols, vals, strict=True))
                for vals in zip(*(_expect(col[c]) for c in cols), strict=True)] if cols else \
            [{} for _ in col]
    if base.kind == "S":  # C strings: up to the first NUL
        return [b.split(b"\0")[0].decode("utf-8", "replace") for b in col.tolist()]
    if base.kind == "U":
        return [u.split("\0")[0] for u in col.tolist()]
    if base.kind == "f":
        return [None if np.isnan(x) else float(np.float32(x)) if base.itemsize == 2 else x
                for x in col.astype(np.float64).tolist()]
    return col.tolist()


def _nan_none(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, list):
        return [_nan_none(x) for x in v]
    if isinstance(v, dict):
        return {k: _nan_none(x) for k, x in v.items()}
    return v


def _same(got: pa.ChunkedArray, col: np.ndarray) -> bool:
    """Exported column == capture field (numpy compare for plain numbers)."""
    if col.ndim == 1 and col.dtype.kind in "iub":
        a = got.to_numpy(zero_copy_only=False)
        return a.dtype == col.dtype.newbyteorder("=") and np.array_equal(a, col)
    return _nan_none(got.to_pylist()) == _nan_none(_expect(col))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dt=dtypes(), raw=st.binary(min_size=0, max_size=2048), n=st.integers(0, 40))
def test_dtype_to_arrow_round_trip(dt: np.dtype, raw: bytes, n: int) -> None:
    arr = _records(dt, raw, n)
    if not arrowmap.columns(dt):
        with pytest.raises(arrowmap.UnsupportedDtype, match="no fields other than padding"):
            arrowmap.schema(dt)
        return
    sch = arrowmap.schema(dt)
    assert [f.name for f in sch] == [c.name for c in arrowmap.columns(dt)]
    assert all(f.name != "" for f in sch)
    batch = arrowmap.to_batch(arr, sch)
    assert batch.schema == sch and batch.num_rows == n
    for c in arrowmap.columns(dt):
        got = _nan_none(batch.column(c.name).to_pylist())
        assert got == _nan_none(_expect(arr[c.name])), (c, dt)


def test_dtype_mapping_table() -> None:
    dt = np.dtype([("a", "<u8"), ("b", ">i2"), ("p", "V6"), ("s", "S16"), ("h", "<f2"),
                   ("x", "<u4", (2, 3)), ("t", [("u", "u1"), ("q", "V1")])])
    sch = arrowmap.schema(dt)
    assert sch.names == ["a", "b", "s", "h", "x", "t"]
    assert sch.field("a").type == pa.uint64() and sch.field("b").type == pa.int16()
    assert sch.field("s").type == pa.string() and sch.field("h").type == pa.float32()
    assert sch.field("x").type == pa.list_(pa.uint32(), 6)
    assert sch.field("t").type == pa.struct([pa.field("u", pa.uint8())])
    assert arrowmap.schema(np.dtype([("a", "u1"), ("n", [("q", "V2")]), ("v", "V1", (3,))])
                           ).names == ["a"]
    with pytest.raises(arrowmap.UnsupportedDtype, match="no Arrow type"):
        arrowmap.schema(np.dtype([("o", object)]))


def test_every_stream_dtype_maps() -> None:
    """Every stream of the format maps (padding dropped, all other fields kept)."""
    for name, (_, dt) in STREAMS.items():
        cols = {c.name for c in arrowmap.columns(dt)}
        assert cols == {n for n in dt.names if not n.startswith("_")}, name
        arrowmap.schema(dt)


# ------------------------------------------------------------------- export --
def _read_dataset(root: Path, name: str) -> pa.Table:
    return pads.dataset(root / name, format="parquet", partitioning="hive").to_table()


def test_export_round_trip_every_stream(caps: list[Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    rc, stdout, err = _run(capsys, "export", *map(str, caps), "-o", str(out))
    assert rc == 0, err
    man = json.loads((out / MANIFEST).read_text())
    assert man["format"] == "tacc-export" and man["version"] == 1
    assert [(c["node"], c["capture"]) for c in man["captures"]] == [
        ("e2e", "real-mixed"), ("node0", "cap0"), ("node0", "cap2"), ("node1", "cap1"),
        ("node1", "cap3")]
    for path in caps:
        cap = open_capture(path)
        node, cid = cap.node, path.name
        for name in cap.streams:
            f = out / name / f"node={node}" / f"capture={cid}" / "part-0.parquet"
            t = pq.read_table(f)
            meta = json.loads(t.schema.metadata[b"tacc.export"])
            assert meta["version"] == 1 and meta["stream"] == name
            assert meta["stream_schema"] == STREAMS[name][0]
            rec = cap.read(name)
            assert t.num_rows == len(rec), name
            for c in arrowmap.columns(rec.dtype):
                assert _same(t.column(c.name), rec[c.name]), (name, c.name)
            for fld in DEVICE_TICK_FIELDS.get(name, ()):
                ns = t.column(f"{fld}_ns").to_numpy(zero_copy_only=False)
                want = np.zeros(len(rec), np.int64)
                for fid in np.unique(rec["fid"]).tolist():
                    m = rec["fid"] == fid
                    want[m] = cap.device_clock(fid).convert(rec[fld][m])
                valid = rec[fld] != 0
                assert np.array_equal(ns[valid].astype(np.int64), want[valid]), (name, fld)
                assert t.column(f"{fld}_ns").null_count == int((~valid).sum())
        assert cap.count("device_trace") > 0
    # the hive partitions are columns of the dataset
    dt = _read_dataset(out, "device_trace")
    assert set(dt.column("node").to_pylist()) == {"node0", "node1", "e2e"}
    total = sum(open_capture(p).count("device_trace") for p in caps)
    assert dt.num_rows == total


def test_export_again_replaces_partition(caps: list[Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    assert _run(capsys, "export", str(caps[0]), "-o", str(out))[0] == 0
    assert _run(capsys, "export", str(caps[0]), str(caps[1]), "-o", str(out))[0] == 0
    man = json.loads((out / MANIFEST).read_text())
    assert len(man["captures"]) == 2
    rc, stdout, _ = _run(capsys, "query", str(out), "--json",
                         "SELECT node, capture, count(*) AS n FROM device_trace "
                         "GROUP BY ALL ORDER BY ALL")
    got = {(r["node"], r["capture"]): r["n"] for r in json.loads(stdout)}
    assert got == {("node0", "cap0"): open_capture(caps[0]).count("device_trace"),
                   ("node1", "cap1"): open_capture(caps[1]).count("device_trace")}


def test_export_incomplete_capture_says_so(caps: list[Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "killed"
    shutil.copytree(caps[0], src)
    (src / "complete").unlink()
    f = src / "streams" / "driver.tcs"
    f.write_bytes(f.read_bytes()[: f.stat().st_size - 1000])  # last chunk cut
    out = tmp_path / "x"
    rc, stdout, err = _run(capsys, "export", str(src), "-o", str(out))
    assert rc == 0
    assert "incomplete capture" in err and "last whole chunk" in err
    assert "incomplete capture" in stdout
    cap = open_capture(src)
    kept = cap.count("driver")
    assert 0 < kept < open_capture(caps[0]).count("driver")
    rc, stdout, _ = _run(capsys, "query", str(out), "--json",
                         "SELECT (SELECT count(*) FROM driver) AS n, complete, problems "
                         "FROM captures")
    row = json.loads(stdout)[0]
    assert row["n"] == kept and row["complete"] is False and "complete" in row["problems"]


def test_export_carries_drop_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    out = tmp_path / "x"
    assert _run(capsys, "export", str(old_minor()), "-o", str(out))[0] == 0
    man = json.loads((out / MANIFEST).read_text())
    assert man["captures"][0]["dropped"] == {"driver": 3}
    rc, stdout, _ = _run(capsys, "query", str(out), "--json",
                         "SELECT dropped, dropped_by_source FROM captures")
    assert json.loads(stdout) == [{"dropped": 3, "dropped_by_source": '{"driver": 3}'}]
    rc, stdout, _ = _run(capsys, "query", str(out), "--csv",
                         "SELECT source, count FROM drops")
    assert stdout == "source,count\n2,3\n"


# -------------------------------------------------------------------- query --
def test_query_join_api_device_by_tag(caps: list[Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    assert _run(capsys, "export", str(caps[0]), "-o", str(out))[0] == 0
    cap = open_capture(caps[0])
    api, dt = cap.read("api"), cap.read("device_trace")
    want = len(np.intersect1d(np.unique(api["tag"][api["tag"] != 0]), np.unique(dt["tag"])))
    rc, stdout, err = _run(capsys, "query", str(out), "--json",
                           "SELECT count(DISTINCT d.tag) AS n FROM api a JOIN device_trace d "
                           "USING (node, capture, tag) WHERE d.tag <> 0")
    assert rc == 0, err
    assert json.loads(stdout) == [{"n": want}] and want > 0
    rc, stdout, _ = _run(capsys, "query", str(out),
                         "SELECT engine, count(*) AS n FROM device_trace GROUP BY engine "
                         "ORDER BY engine")
    lines = stdout.splitlines()
    assert lines[0].split() == ["engine", "n"] and lines[-1].endswith(("row)", "rows)"))
    counts = {int(a): int(b) for a, b in (ln.split() for ln in lines[2:-1])}
    eng, n = np.unique(dt["engine"], return_counts=True)
    assert counts == dict(zip(eng.tolist(), n.tolist(), strict=True))
    # the strings view names the API calls
    rc, stdout, _ = _run(capsys, "query", str(out), "--csv",
                         "SELECT DISTINCT s.text FROM api a JOIN strings s ON "
                         "s.id = a.name_id AND s.capture = a.capture ORDER BY 1")
    names = set(stdout.splitlines()[1:])
    assert names == {cap.strings[i] for i in np.unique(api["name_id"]).tolist()}


def test_query_sql_error_one_line(caps: list[Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    assert _run(capsys, "export", str(caps[0]), "-o", str(out))[0] == 0
    for sql, want in [("SELEC 1", "Parser Error"),
                      ("SELECT * FROM no_such_stream", "no_such_stream"),
                      ("SELECT no_col FROM api", "no_col")]:
        rc, _, err = _run(capsys, "query", str(out), sql)
        line = _one_error(rc, err)
        assert line.startswith("tacc: error: query: ") and want in line, line
    rc, _, err = _run(capsys, "query", str(tmp_path / "nothing"), "SELECT 1")
    assert "no such export directory" in _one_error(rc, err)
    rc, _, err = _run(capsys, "query", str(caps[0]), "SELECT 1")
    assert "not a tacc export" in _one_error(rc, err)


# ---------------------------------------------------------------- versions --
def test_older_minor_capture_is_read_and_exported(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """capture-v1.0 was written by the writer before minor versions (no "minor" key, no
    device_events stream file): read, analysed, exported."""
    assert "minor" not in json.loads((old_minor() / "meta.json").read_text())
    cap = open_capture(old_minor())
    assert cap.format_version == (1, 0) and cap.count("device_events") == 0
    assert cap.complete and cap.problems == []
    assert _run(capsys, "analyze", str(old_minor()))[0] == 0
    out = tmp_path / "x"
    assert _run(capsys, "export", str(old_minor()), "-o", str(out))[0] == 0
    assert not (out / "device_events").exists()
    rc, stdout, _ = _run(capsys, "query", str(out), "--json",
                         "SELECT format_version, (SELECT count(*) FROM device_trace) AS n "
                         "FROM captures")
    assert json.loads(stdout) == [{"format_version": "1.0", "n": 24}]


def test_newer_major_capture_refused_one_line(caps: list[Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "v2"
    shutil.copytree(old_minor(), src)
    meta = json.loads((src / "meta.json").read_text())
    meta["version"], meta["minor"] = 2, 0
    (src / "meta.json").write_text(json.dumps(meta))
    for argv in (["export", str(src), "-o", str(tmp_path / "x")], ["analyze", str(src)],
                 ["analyze", "--scheduler", "serial", str(caps[0]), str(src)]):
        rc, _, err = _run(capsys, *argv)
        line = _one_error(rc, err)
        assert "capture format version 2.0 is newer than this tacc reads (1.x)" in line, line
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_newer_minor_capture_is_read(caps: list[Path], tmp_path: Path) -> None:
    src = tmp_path / "v1.9"
    shutil.copytree(old_minor(), src)
    meta = json.loads((src / "meta.json").read_text())
    meta["minor"] = 9
    (src / "meta.json").write_text(json.dumps(meta))
    assert open_capture(src).format_version == (1, 9)


# --------------------------------------------------------------- missing deps --
@pytest.mark.parametrize("module,argv", [
    ("pyarrow", ["export", "{cap}", "-o", "{tmp}/x"]),
    ("duckdb", ["query", "{tmp}", "SELECT 1"]),
    ("distributed", ["analyze", "--scheduler", "local", "{cap}", "{cap}"]),
])
def test_missing_engine_one_line(module: str, argv: list[str], caps: list[Path],
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "tacc-export", "version": 1}))
    for m in list(sys.modules):
        if m == module or m.startswith(module + "."):
            monkeypatch.setitem(sys.modules, m, None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, module, None)
    args = [a.format(cap=caps[0], tmp=tmp_path) for a in argv]
    rc, _, err = _run(capsys, *args)
    line = _one_error(rc, err)
    pkg = {"distributed": "dask[distributed]"}.get(module, module)
    assert f"needs the Python package '{pkg}'" in line, line


# ---------------------------------------------------------------- dask --
def test_dask_local_cluster_two_workers_same_findings(caps: list[Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """Findings of a real LocalCluster (2 worker processes, 127.0.0.1) equal the serial
    in-process run's, capture by capture, and each equals `tacc analyze CAPTURE --json`."""
    docs = {}
    for spec in ("serial", "local"):
        f = tmp_path / f"{spec}.json"
        rc, stdout, err = _run(capsys, "analyze", "--scheduler", spec, "--workers", "2",
                               *map(str, caps), "--json", str(f))
        assert rc == 0, err
        docs[spec] = json.loads(f.read_text())
        assert stdout.count("\n== ") + stdout.startswith("== ") == len(caps) + 1
    assert docs["local"]["scheduler"] == "local"
    assert docs["serial"]["captures"] == docs["local"]["captures"]
    assert docs["serial"]["cross"] == docs["local"]["cross"]
    rules = [{f["rule"] for f in d["findings"]} for d in docs["local"]["captures"]]
    assert {"small_transfers"} <= rules[0] and {"tlb_thrash"} <= rules[1]
    # the real capture's findings (tests/vm/test_e2e_real.py MIXED_EXPECTED)
    assert docs["local"]["captures"][4]["capture"]["node"] == "e2e"
    assert rules[4] == {"small_transfers", "iommu_churn", "tlb_thrash", "serialized_copies",
                        "idle_gaps"}
    for p, d in zip(caps, docs["local"]["captures"], strict=True):
        f = tmp_path / "one.json"
        assert _run(capsys, "analyze", str(p), "--json", str(f))[0] == 0
        assert json.loads(f.read_text()) == d


def test_dask_tcp_scheduler_same_findings(caps: list[Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--scheduler tcp://HOST:PORT`: a running scheduler (here a LocalCluster's, 2 worker
    processes on 127.0.0.1) gives the serial run's findings."""
    import logging

    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        addr = cluster.scheduler_address
        assert addr.startswith("tcp://127.0.0.1:")
        docs = {}
        for spec in ("serial", addr):
            f = tmp_path / "out.json"
            rc, _, err = _run(capsys, "analyze", "--scheduler", spec, *map(str, caps[:3]),
                              "--json", str(f))
            assert rc == 0, err
            docs[spec] = json.loads(f.read_text())
        assert docs[addr]["scheduler"] == addr
        assert docs[addr]["captures"] == docs["serial"]["captures"]


def test_dask_bad_scheduler_one_line(caps: list[Path], capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tacc.fleet import dist

    monkeypatch.setattr(dist, "CONNECT_TIMEOUT", "0.5s")  # nothing listens on port 9
    rc, _, err = _run(capsys, "analyze", "--scheduler", "bogus", str(caps[0]))
    assert "not a scheduler" in _one_error(rc, err, 2)  # a usage error
    rc, _, err = _run(capsys, "analyze", "--scheduler", "tcp://127.0.0.1:9", str(caps[0]))
    assert "cannot reach the Dask scheduler tcp://127.0.0.1:9" in _one_error(rc, err)


def test_cross_rule_plugs_in(caps: list[Path], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """A registered cross rule runs once over the fleet and sees every capture."""
    from tacc.analyze import cross
    from tacc.analyze.rules import Finding

    seen: list[list[str]] = []

    def nodes(view: cross.FleetView, th: Any) -> list[Finding]:
        seen.append([c.node for c in view.captures])
        lost = sum(f["time_lost_ns"] for d in view.docs for f in d["findings"])
        return [Finding("fleet_lost", "time lost over the fleet", [], {"n": len(view.docs)},
                        int(lost), "none", node=",".join(sorted(set(seen[-1]))))]

    monkeypatch.setitem(cross.CROSS_RULES, "fleet_lost", nodes)
    f = tmp_path / "x.json"
    rc, stdout, err = _run(capsys, "analyze", "--scheduler", "serial", *map(str, caps[:2]),
                           "--json", str(f))
    assert rc == 0, err
    doc = json.loads(f.read_text())
    assert seen == [["node0", "node1"]]
    assert doc["cross"]["rules"] == ["fleet_lost"]
    assert doc["cross"]["findings"][0]["node"] == "node0,node1"
    assert "across 2 captures: fleet_lost" in stdout


def test_exporter_row_groups_bounded(caps: list[Path], tmp_path: Path) -> None:
    cap = open_capture(caps[0])
    ex = Exporter(tmp_path, row_group_rows=5000)
    res = ex.export(cap, "c")
    f = tmp_path / "driver" / f"node={cap.node}" / "capture=c" / "part-0.parquet"
    md = pq.ParquetFile(f).metadata
    assert md.num_rows == res.streams["driver"] == cap.count("driver")
    assert md.num_row_groups > 1
    assert all(md.row_group(i).num_rows < 5000 + 20000 for i in range(md.num_row_groups))


def test_stream_of_a_newer_minor_is_exported(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A stream this tacc does not know (as a newer minor adds: here a made-up TLP stream
    with a sub-array and a string) is exported with the layout its file header declares."""
    from tacc.capture import framing
    from tacc.capture.schema import dtype_from_json, dtype_to_json

    assert dtype_from_json(json.loads(json.dumps(dtype_to_json(dt := np.dtype(
        [("t_ns", "<i8"), ("fid", "<u2"), ("kind", "u1"), ("_pad", "V5"),
         ("hdr", "<u4", (4,)), ("what", "S8")]))))) == dt

    src = tmp_path / "newer"
    shutil.copytree(old_minor(), src)
    meta = json.loads((src / "meta.json").read_text())
    meta["minor"] = 7
    (src / "meta.json").write_text(json.dumps(meta))
    rec = np.zeros(10, dt)
    rec["t_ns"] = np.arange(10) * 7
    rec["hdr"] = np.arange(40).reshape(10, 4)
    rec["what"] = [b"MRd", b"CplD"] * 5
    info = {"stream": "tlp_x", "schema": 1, "dtype": dtype_to_json(dt)}
    payload = rec.tobytes()
    (src / "streams" / "tlp_x.tcs").write_bytes(
        framing.encode_file_header(info) + framing.encode_chunk(0, 5, payload[: 5 * 40])
        + framing.encode_chunk(1, 5, payload[5 * 40:]))
    pad = np.dtype([("_p", "V8")])  # nothing but padding: no columns, not exported
    (src / "streams" / "pad_x.tcs").write_bytes(
        framing.encode_file_header({"stream": "pad_x", "schema": 1,
                                    "dtype": dtype_to_json(pad)})
        + framing.encode_chunk(0, 2, np.zeros(2, pad).tobytes()))
    cap = open_capture(src)
    assert cap.other_streams == ["pad_x", "tlp_x"] and "tlp_x" not in cap.streams
    out = tmp_path / "x"
    rc, _, err = _run(capsys, "export", str(src), "-o", str(out))
    assert rc == 0 and "unknown stream 'tlp_x' ignored by the analysis" in err, err
    assert "stream 'pad_x' not exported: numpy dtype" in err and not (out / "pad_x").exists()
    rc, stdout, _ = _run(capsys, "query", str(out), "--json",
                         "SELECT t_ns, hdr, what FROM tlp_x ORDER BY t_ns LIMIT 2")
    assert json.loads(stdout) == [{"t_ns": 0, "hdr": [0, 1, 2, 3], "what": "MRd"},
                                  {"t_ns": 7, "hdr": [4, 5, 6, 7], "what": "CplD"}]
