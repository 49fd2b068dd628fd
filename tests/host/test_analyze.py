"""tacc analyze: each rule fires on its bad twin only; the mixed workload; invariants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tacc.analyze.engine import analyze
from tacc.analyze.rules import RULES, Thresholds
from tacc.capture import CaptureWriter, open_capture
from tacc.capture.schema import CLOCK_DTYPE, DEVICE_TRACE_DTYPE
from tacc.capture.synth import EXPECTED, MIXED, WORKLOADS, generate
from tacc.cli import main

BAD = [w for w in WORKLOADS if EXPECTED[w]]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("twins")
    out = {}
    for w in WORKLOADS:
        out[w] = {}
        for v in ("bad", "good"):
            p = root / f"{w}-{v}"
            truth = generate(p, w, v)
            out[w][v] = (p, truth, analyze(open_capture(p)))
    return out


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_rule_fires_on_bad_twin_only(twins: dict, workload: str) -> None:
    _, _, bad = twins[workload]["bad"]
    _, _, good = twins[workload]["good"]
    assert {f.rule for f in bad} == EXPECTED[workload]
    assert good == []


# Estimated / measured (bad - good wall time of the generated twins) per workload: the
# ratio measured on these captures, and the bound each is held to (docs/analysis.md,
# "Synthetic twins": measured ratio +- a stated margin, not a factor of 2).
# map_churn's bad twin also waits for each copy before its next registration (the good
# twin streams them), a cost the iommu_churn rule does not claim: 0.68.
EST_OVER_MEASURED = {
    "tiny_transfers": (0.995, 0.02), "unaligned_userptr": (1.000, 0.01),
    "map_churn": (0.681, 0.03), "serialized_copies": (1.066, 0.03),
    "tlb_thrash": (0.999, 0.01), "link_saturation": (1.082, 0.03),
    "host_bound": (1.047, 0.03),
    # the good twin's loader copies and submits between the reader's reads: ideal + 9 %
    "load": (1.088, 0.03),
}


@pytest.mark.parametrize("workload", [w for w in BAD if w != "noisy_neighbour"])
def test_time_lost_matches_twin_difference(twins: dict, workload: str) -> None:
    _, tb, bad = twins[workload]["bad"]
    _, tg, _ = twins[workload]["good"]
    measured = tb["wall_ns"] - tg["wall_ns"]
    est = sum(f.time_lost_ns for f in bad)
    ratio, margin = EST_OVER_MEASURED[workload]
    assert abs(est / measured - ratio) <= margin, (est, measured, est / measured)


def test_vf_contention_time_lost(twins: dict) -> None:
    _, tb, bad = twins["noisy_neighbour"]["bad"]
    _, tg, _ = twins["noisy_neighbour"]["good"]

    def victim_busy(t: dict) -> int:
        c = t["cmds"]
        m = c["fid"] == 1
        return int((c["t_end"][m] - c["t_start"][m]).sum())

    measured = victim_busy(tb) - victim_busy(tg)
    est = next(f.time_lost_ns for f in bad if f.rule == "vf_contention")
    assert 0.8 * measured <= est <= 1.25 * measured


def test_mixed_workload_exact_set(tmp_path: Path) -> None:
    truth = generate(tmp_path / "m", MIXED)
    found = analyze(open_capture(tmp_path / "m"))
    assert sorted(f.rule for f in found) == truth["expected_findings"]
    # each finding points at its segment
    segs = {s["workload"]: s for s in truth["segments"]}
    rule_seg = {"small_transfers": "tiny_transfers", "iommu_churn": "map_churn",
                "tlb_thrash": "tlb_thrash", "serialized_copies": "serialized_copies"}
    for f in found:
        s = segs[rule_seg[f.rule]]
        for a, b in f.time_ranges:
            assert s["t_start"] - 1_000_000 <= a <= b <= s["t_end"] + 1_000_000, f.rule


def test_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate(tmp_path / "c", "tiny_transfers", "bad")
    out = tmp_path / "findings.json"
    assert main(["analyze", str(tmp_path / "c"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tacc-findings" and doc["version"] == 1
    f = doc["findings"][0]
    for key in ("rule", "severity", "evidence", "time_ranges", "time_lost_ns", "suggestion"):
        assert key in f
    assert f["evidence"]["api_calls"] == {"copy_h2d": f["evidence"]["transfers"]}
    table = capsys.readouterr().out
    assert "small_transfers" in table and "suggestion:" in table
    # thresholds are tunable: raising the size limit makes the rule silent
    assert main(["analyze", str(tmp_path / "c"), "--set", "small_bytes=1024"]) == 0
    assert "no findings" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "c"), "--set", "nope=1"]) == 2
    # the timeline overlays them
    pf = tmp_path / "t.pftrace"
    assert main(["timeline", str(tmp_path / "c"), "--findings", str(out), "-o", str(pf)]) == 0
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    tr = pb.Trace()
    tr.ParseFromString(pf.read_bytes())
    names = {p.track_descriptor.name for p in tr.packet if p.HasField("track_descriptor")}
    assert "finding: small_transfers" in names


# ------------------------------------------- severity on the active span --
def _idle_prefix_capture(path: Path, workload: str, bad: bool, idle_ns: int = 8_000_000_000,
                         other_fid_at: int | None = None) -> None:
    """A capture that starts with one driver event (an ioctl: no device command, no API
    call) ``idle_ns`` before the workload, as ``tacc trace start`` a few seconds before
    ``tacc run``."""
    from tacc.capture.schema import DriverKind
    from tacc.capture.synth import Sim, run

    sim = Sim(seed=0, node="node0")
    sim.add_driver(DriverKind.IOCTL, 1_000_000, pid=77, tid=77, fid=0, dur_ns=3000, arg=0x40)
    run(sim, [(workload, bad)], t_start=1_000_000 + idle_ns)
    sim.write(path)


def test_severity_of_active_span_not_capture_span(tmp_path: Path) -> None:
    _idle_prefix_capture(tmp_path / "bad", "tiny_transfers", True)
    _idle_prefix_capture(tmp_path / "good", "tiny_transfers", False)
    cap = open_capture(tmp_path / "bad")
    t0, t1 = cap.time_range
    assert t1 - t0 > 8_000_000_000  # the idle prefix is in the capture
    found = analyze(cap)
    assert [f.rule for f in found] == ["small_transfers"]
    f = found[0]
    # share and severity: time lost over the function's active span (first to last
    # device or API activity of 0000:01:00.0), not over the 8 s capture
    a0, a1 = f.active_range
    assert t0 < a0 < a1 <= t1 and a0 - t0 >= 8_000_000_000 - 1_000_000
    assert f.active_span_ns == a1 - a0 < 1_000_000_000
    assert f.share == pytest.approx(f.time_lost_ns / f.active_span_ns)
    assert f.capture_share == pytest.approx(f.time_lost_ns / (t1 - t0))
    assert f.severity == "high" and f.capture_share < 0.03
    assert analyze(open_capture(tmp_path / "good")) == []


def test_json_and_table_show_both_spans(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    _idle_prefix_capture(tmp_path / "c", "tiny_transfers", True)
    out = tmp_path / "f.json"
    assert main(["analyze", str(tmp_path / "c"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    # findings.json 1.1: version (major) 1 as before, minor 1 adds the spans
    assert (doc["version"], doc["minor"]) == (1, 1)
    cap = doc["capture"]
    assert cap["span_ns"] == cap["t_end_ns"] - cap["t_start_ns"] > 8_000_000_000
    f = doc["findings"][0]
    a0, a1 = f["active_range"]
    assert f["active_span_ns"] == a1 - a0 and f["severity"] == "high"
    assert f["share"] > 0.10 > f["capture_share"]
    table = capsys.readouterr().out
    head = table.splitlines()
    assert head[0].startswith("capture span ") and "active ms" in head[1], table
    row = head[2].split()
    assert row[1] == "high" and float(row[5]) == pytest.approx(f["active_span_ns"] / 1e6, abs=0.01)
    assert float(row[4].rstrip("%")) == pytest.approx(100 * f["share"], abs=0.05)


def test_active_span_of_a_finding_is_that_of_its_functions(tmp_path: Path) -> None:
    """Activity of another function (before and after) does not widen the span of a
    finding about 0000:01:00.0."""
    from tacc.analyze.data import load
    from tacc.analyze.engine import active_ranges

    generate(tmp_path / "c", "noisy_neighbour", "bad")
    d = load(open_capture(tmp_path / "c"))
    ranges = active_ranges(d)
    c = d.cmds
    for fid, (a0, a1) in ranges.items():
        m = c.fid == fid
        assert a0 <= int(c.tf[m].min()) and a1 >= int(c.te[m].max())
    assert set(ranges) == {int(x) for x in np.unique(c.fid)}


# ------------------------------------------------------- idle gaps' cost --
def _bursts_capture(p: Path, bursts: list[tuple[int, int]]) -> None:
    """Device commands (GEMMs on compute0) at the given (start, duration) ns."""
    n = len(bursts)
    rec = np.zeros(n, DEVICE_TRACE_DTYPE)
    rec["opcode"], rec["engine"], rec["fid"] = 4, 2, 0
    st = np.array([b[0] for b in bursts], np.uint64) + np.uint64(10**9)
    rec["t_fetch"] = rec["t_start"] = st
    rec["t_end"] = st + np.array([b[1] for b in bursts], np.uint64)
    rec["tag"] = np.arange(1, n + 1)
    clk = np.zeros(2, CLOCK_DTYPE)
    clk["mono_before"] = [0, 10**9]
    clk["mono_after"] = clk["mono_before"] + 1000
    clk["devclk"] = 10**9 + clk["mono_before"] + 500
    with CaptureWriter(p, META) as w:
        w.append("device_trace", rec)
        w.append("clock_sync", clk)


def test_idle_gaps_lost_is_what_overlap_can_save(tmp_path: Path) -> None:
    """host_bound's shape: a 1 ms upload, then 6 x (20 ms host preparation, 40 ms device
    work) in turn.  Overlapping the preparation of step i+1 with step i hides 5 of the
    gaps whole; the first (after the 1 ms upload) can hide only 1 ms: 101 ms, not the
    120 ms of all gaps (the real capture read 124.8 ms against 94.8 ms measured)."""
    ms = 1_000_000
    bursts = [(0, 1 * ms)]
    t = 1 * ms
    for _ in range(6):
        t += 20 * ms
        bursts.append((t, 40 * ms))
        t += 40 * ms
    _bursts_capture(tmp_path / "c", bursts)
    f = [x for x in analyze(open_capture(tmp_path / "c")) if x.rule == "idle_gaps"]
    assert len(f) == 1
    assert f[0].evidence["idle_ns"] == 120 * ms
    assert abs(f[0].time_lost_ns - 101 * ms) <= 1000, f[0].time_lost_ns


# ------------------------------------------------------------- invariants --
META = {"node": "h", "devices": [
    {"pci": "0000:01:00.0", "vf": 0, "link": {"gen": 4, "width": 8, "mps": 256}},
    {"pci": "0000:01:00.1", "vf": 1, "pf": "0000:01:00.0",
     "link": {"gen": 4, "width": 8, "mps": 256}}]}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), seed=st.integers(0, 2**31), dense=st.floats(0.05, 3.0),
       small=st.booleans())
def test_invariants(tmp_path_factory: pytest.TempPathFactory, n: int, seed: int, dense: float,
                    small: bool) -> None:
    rng = np.random.default_rng(seed)
    p = tmp_path_factory.mktemp("inv") / "c"
    rec = np.zeros(n, DEVICE_TRACE_DTYPE)
    rec["fid"] = rng.integers(0, 2, n)
    rec["opcode"] = rng.choice([1, 2, 4], n)
    rec["engine"] = np.where(rec["opcode"] == 4, 2, rec["opcode"] - 1)
    rec["queue"] = rng.integers(0, 4, n)
    rec["bytes"] = rng.integers(1, 4096 if small else 1 << 24, n) * (rec["opcode"] != 4)
    rec["tlps"] = rec["bytes"] // 256 + rng.integers(0, 40, n)
    rec["tlb_misses"] = rng.integers(0, 3000, n)
    start = np.sort(rng.integers(0, int(n * 100_000 / dense), n)).astype(np.uint64)
    rec["t_start"] = 10**9 + start
    rec["t_fetch"] = rec["t_start"] - rng.integers(0, 5000, n).astype(np.uint64)
    rec["t_end"] = rec["t_start"] + rng.integers(1, 3_000_000, n).astype(np.uint64)
    rec["tag"] = rng.integers(1, 50, n).astype(np.uint64)
    clk = np.zeros(4, CLOCK_DTYPE)
    clk["mono_before"] = np.arange(4) * 10**8
    clk["mono_after"] = clk["mono_before"] + 1000
    clk["devclk"] = 10**9 + np.arange(4) * 10**8 + 500
    clk["fid"] = [0, 1, 0, 1]
    with CaptureWriter(p, META) as w:
        w.append("device_trace", rec)
        w.append("clock_sync", clk)
    cap = open_capture(p)
    t0, t1 = cap.time_range
    th = Thresholds(saturation_min_total_ns=0, saturation_min_run_windows=1,
                    small_min_count=1, min_time_lost_ns=0, idle_min_gaps=1,
                    contention_min_transfers=1)
    found = analyze(cap, th)
    for f in found:
        assert f.rule in RULES
        assert f.severity in ("low", "medium", "high")
        assert 0 <= f.time_lost_ns
        for a, b in f.time_ranges:
            assert t0 <= a <= b <= t1
        for k in ("mean_share", "peak_share"):
            if k in f.evidence:
                assert 0.0 <= f.evidence[k] <= 1.0
        if f.rule == "link_saturation":
            assert f.time_lost_ns <= t1 - t0


def test_thresholds_from_a_file_then_overrides_keep_their_types(tmp_path: Path) -> None:
    """`tacc analyze --config FILE` (TOML, or JSON with or without a "thresholds" table)
    then `--set k=v` overrides: each value converted to its field's type (an int stays an
    int), an unknown name refused (KeyError); `tacc cluster analyze --set` the same."""
    from tacc.analyze.cluster_rules import ClusterThresholds
    from tacc.analyze.engine import load_thresholds

    (tmp_path / "t.toml").write_text("[thresholds]\nmax_ranges = 7\nidle_share = 0.25\n")
    (tmp_path / "t.json").write_text(json.dumps({"window_ns": "2000", "small_bytes": 4096}))
    th = load_thresholds(tmp_path / "t.toml", [" window_ns = 3000 ", "bounce_bw=1e9"])
    assert (th.max_ranges, th.idle_share, th.window_ns, th.bounce_bw) == (7, 0.25, 3000, 1e9)
    assert type(th.window_ns) is int and type(th.bounce_bw) is float
    th = load_thresholds(tmp_path / "t.json", [])
    assert (th.window_ns, th.small_bytes, th.max_ranges) == (2000, 4096, Thresholds().max_ranges)
    with pytest.raises(KeyError, match="no_such"):
        load_thresholds(None, ["no_such=1"])
    with pytest.raises(ValueError):
        load_thresholds(None, ["max_ranges=many"])
    c = ClusterThresholds()
    c.update({"bubble_share": "0.2", "network_min_ns": "5000"})
    assert (c.bubble_share, c.network_min_ns, c.max_ranges) == (0.2, 5000, 50)
    assert type(c.network_min_ns) is int
    with pytest.raises(KeyError, match="no_such"):
        c.update({"no_such": "1"})


# ------------------------------------------------ interval helpers, by brute force --
@st.composite
def _interval_sets(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Up to 12 integer intervals [ts, te), some empty, overlapping or touching."""
    n = draw(st.integers(0, 12))
    ts = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    dur = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    return np.array(ts, np.int64), np.array(ts, np.int64) + np.array(dur, np.int64)


def _cover(ts: np.ndarray, te: np.ndarray) -> set[int]:
    """The unit cells [t, t + 1) the intervals cover: their union, cell by cell."""
    return {t for a, b in zip(ts.tolist(), te.tolist(), strict=True) for t in range(a, b)}


_QUICK = settings(max_examples=60, deadline=None)


@_QUICK
@given(iv=_interval_sets())
def test_union_length_and_merged_by_cells(iv: tuple[np.ndarray, np.ndarray]) -> None:
    from tacc.analyze.data import merged, union_length

    ts, te = iv
    cells = _cover(ts, te)
    assert union_length(ts, te) == len(cells)
    s, e = merged(ts, te)
    assert len(s) == len(e) and bool(np.all(s[1:] > e[:-1]))  # disjoint, sorted, apart
    # the busy periods cover the same cells; an interval touching the one before it
    # (its start at that one's end) joins it
    assert _cover(s, e) == cells
    want: list[list[int]] = []
    for a, b in sorted(zip(ts.tolist(), te.tolist(), strict=True)):
        if want and a <= want[-1][1]:
            want[-1][1] = max(want[-1][1], b)
        else:
            want.append([a, b])
    assert [[int(a), int(b)] for a, b in zip(s, e, strict=True)] == want


@_QUICK
@given(iv=_interval_sets(), groups=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_union_by_group_is_each_groups_union(iv: tuple[np.ndarray, np.ndarray], groups: int,
                                             seed: int) -> None:
    from tacc.analyze.data import union_by_group

    ts, te = iv
    g = np.random.default_rng(seed).integers(0, groups, len(ts))
    got = union_by_group(g, ts, te, groups)
    assert got.dtype == np.int64 and len(got) == groups
    assert got.tolist() == [len(_cover(ts[g == k], te[g == k])) for k in range(groups)]


@_QUICK
@given(iv=_interval_sets(), width=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_window_amount_spreads_each_amount_over_its_interval(
        iv: tuple[np.ndarray, np.ndarray], width: int, seed: int) -> None:
    from tacc.analyze.data import window_amount

    ts, te = iv
    amount = np.random.default_rng(seed).integers(0, 10_000, len(ts))
    edges = np.arange(-width, 300, width, dtype=np.int64)
    got = window_amount(ts, te, amount, edges)
    want = np.zeros(len(edges) - 1)
    for a, b, x in zip(ts.tolist(), te.tolist(), amount.tolist(), strict=True):
        for i, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)):
            want[i] += x * max(min(b, hi) - max(a, lo), 0) / max(b - a, 1)
    assert len(got) == len(want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)


@_QUICK
@given(mask=st.lists(st.booleans(), max_size=30))
def test_runs_are_the_true_stretches(mask: list[bool]) -> None:
    from tacc.analyze.data import runs

    s, e = runs(np.array(mask, bool))
    want = [(i, j) for i in range(len(mask)) for j in range(i + 1, len(mask) + 1)
            if all(mask[i:j]) and (i == 0 or not mask[i - 1]) and (j == len(mask) or not mask[j])]
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == want


# ------------------------------------------------- thresholds at their bounds --
def test_small_transfers_at_its_minimum_count_and_share_of_copies(tmp_path: Path) -> None:
    """small_min_count copies fire, one fewer allowed does not; share_of_copies is over
    the function's copies (one copy: 1.0)."""
    from tacc.capture.schema import Opcode
    from tacc.capture.synth import Sim

    p = tmp_path / "c"
    generate(p, "tiny_transfers", "bad")
    cap = open_capture(p)
    dt = cap.read("device_trace")
    copies = dt[np.isin(dt["opcode"], [Opcode.COPY_H2D, Opcode.COPY_D2H]) & (dt["fid"] == 0)]
    n = int(((copies["bytes"] > 0) & (copies["bytes"] < Thresholds().small_bytes)).sum())
    (f,) = analyze(cap, Thresholds(small_min_count=n), rules=["small_transfers"])
    assert f.evidence["transfers"] == n
    assert f.evidence["share_of_copies"] == n / len(copies)
    assert f.title == f"{n} copies under 64 KiB on 0000:01:00.0"
    assert analyze(cap, Thresholds(small_min_count=n + 1), rules=["small_transfers"]) == []
    sim = Sim(seed=0)
    sim.submit(fid=0, queue=0, pid=100, tid=100, name="copy_h2d", opcode=Opcode.COPY_H2D,
               api_t0=np.array([5_000_000]), nbytes=np.full(1, 4096), dur=np.full(1, 50_000))
    sim.write(tmp_path / "one")
    th = Thresholds(small_min_count=1, min_time_lost_ns=0)
    (f,) = analyze(open_capture(tmp_path / "one"), th, rules=["small_transfers"])
    assert f.evidence["share_of_copies"] == 1.0 and f.evidence["transfers"] == 1


def test_evidence_units_in_the_table() -> None:
    """``*_ns`` figures in ms, us or ns by size; bytes with a binary unit; floats to 4
    significant digits; long values cut at 80 characters."""
    from tacc.analyze.engine import _evidence

    assert _evidence("idle_ns", 2_500_000) == "idle=2.5 ms"
    assert _evidence("idle_ns", 1_000_000) == "idle=1 ms"
    assert _evidence("idle_ns", 999_999) == "idle=1000 us"
    assert _evidence("idle_ns", 1000) == "idle=1 us"
    assert _evidence("idle_ns", 999) == "idle=999 ns"
    assert _evidence("idle_ns", 3) == "idle=3 ns"
    assert _evidence("walk_ns_estimate", -2000) == "walk_estimate=-2 us"
    assert _evidence("share", 0.123456) == "share=0.1235"
    assert _evidence("nested", {"a": 0.333333, "b": [2.0 / 3]}) == \
        'nested={"a": 0.3333, "b": [0.6667]}'
    assert _evidence("flag_ns", True) == "flag_ns=true"
    long = _evidence("names", ["x" * 50, "y" * 50])
    assert len(long) == len("names=") + 80 and long.endswith("...")


def test_cluster_rule_registers_under_its_name() -> None:
    from tacc.analyze import cluster_rules as cr

    def rule(view: object, th: object) -> list:
        return []

    try:
        assert cr.cluster_rule("test_only_rule")(rule) is rule  # type: ignore[arg-type]
        assert cr.CLUSTER_RULES["test_only_rule"] is rule
    finally:
        cr.CLUSTER_RULES.pop("test_only_rule", None)


@_QUICK
@given(cmds=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 100),
                               st.integers(0, 40), st.integers(0, 30)), max_size=15))
def test_vf_contention_ready_time_by_hand(cmds: list[tuple[int, int, int, int, int]]) -> None:
    """A command is ready when fetched and its queue's previous command (same function,
    same queue, by start) has ended; never after its own start."""
    from types import SimpleNamespace

    from tacc.analyze.rules.vf_contention import _ready_ns

    fid, queue, ts, dur, fetch_before = np.array(cmds, np.int64).reshape(-1, 5).T
    c = SimpleNamespace(fid=fid, queue=queue, ts=ts, te=ts + dur, tf=ts - fetch_before)
    got = _ready_ns(c).tolist()
    for i in range(len(cmds)):
        peers = sorted((int(ts[j]), j) for j in range(len(cmds))
                       if fid[j] == fid[i] and queue[j] == queue[i])
        k = peers.index((int(ts[i]), i))
        prev_end = int(c.te[peers[k - 1][1]]) if k else 0
        assert got[i] == min(max(int(c.tf[i]), prev_end), int(ts[i])), (i, cmds)


@_QUICK
@given(spans=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), max_size=6),
       ab=st.lists(st.tuples(st.integers(-5, 150), st.integers(-5, 150)), min_size=1,
                   max_size=6))
def test_vf_contention_covered_by_cells(spans: list[tuple[int, int]],
                                        ab: list[tuple[int, int]]) -> None:
    """_covered: how much of each [a, b) the disjoint sorted intervals cover (0 when b <=
    a), as counted unit cell by unit cell."""
    from tacc.analyze.rules.vf_contention import _covered

    s, e, t = [], [], 0
    for gap, n in spans:
        s.append(t + gap)
        e.append(t + gap + n)
        t += gap + n
    cells = {x for p, q in zip(s, e, strict=True) for x in range(p, q)}
    a = np.array([x for x, _ in ab], np.int64)
    b = np.array([y for _, y in ab], np.int64)
    got = _covered(np.array(s, np.int64), np.array(e, np.int64), a, b)
    assert got.tolist() == [len(cells & set(range(x, y))) for x, y in ab]


@_QUICK
@given(ranges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 200), st.integers(0, 60)),
                       max_size=20),
       spans=st.lists(st.tuples(st.integers(0, 250), st.integers(0, 40)), max_size=8))
@example(ranges=[(k, 10 * k, 5 + k) for k in range(12)], spans=[(0, 200)])  # 12 names
def test_range_names_overlapped_time_most_first(ranges: list[tuple[int, int, int]],
                                                spans: list[tuple[int, int]]) -> None:
    """jobs.range_names: per tacc.range name, the time its records overlap the given
    ranges (summed over them), the 8 most first."""
    from types import SimpleNamespace

    from tacc.analyze.rules.jobs import range_names
    from tacc.capture.schema import API_DTYPE

    strings = {1: "range", 2: "copy_h2d", **{10 + i: f"step {i}" for i in range(12)}}
    api = np.zeros(len(ranges) + 1, API_DTYPE)
    api["name_id"][:-1] = 1
    api["args_id"][:-1] = [10 + k for k, _, _ in ranges]
    api["t_start"][:-1] = [a for _, a, _ in ranges]
    api["t_end"][:-1] = [a + n for _, a, n in ranges]
    api[-1]["name_id"], api[-1]["t_end"] = 2, 10**6  # not a range
    d = SimpleNamespace(cap=SimpleNamespace(strings=strings), api=api)
    s = np.array([a for a, _ in spans], np.int64)
    e = s + np.array([n for _, n in spans], np.int64)
    got = range_names(d, s, e)  # type: ignore[arg-type]
    want: dict[str, int] = {}
    for k, a, n in ranges:
        t = sum(max(0, min(y, a + n) - max(x, a)) for x, y in zip(s.tolist(), e.tolist(),
                                                                    strict=True))
        if t:
            want[f"step {k}"] = want.get(f"step {k}", 0) + t
    assert got == dict(sorted(want.items(), key=lambda kv: -kv[1])[:8])
    assert list(got) == list(dict(sorted(want.items(), key=lambda kv: -kv[1])[:8]))


def test_link_saturation_at_its_minimum_saturated_time(tmp_path: Path) -> None:
    """The saturated windows' time (17 ms on the link_saturation bad twin: whole 1 ms
    windows) at saturation_min_total_ns fires; 1 ns more does not."""
    generate(tmp_path / "c", "link_saturation", "bad")
    cap = open_capture(tmp_path / "c")
    (f,) = analyze(cap, rules=["link_saturation"])
    total = f.evidence["saturated_ns"]
    assert total % Thresholds().window_ns == 0 and total >= 3 * Thresholds().window_ns
    assert len(analyze(cap, Thresholds(saturation_min_total_ns=total),
                       rules=["link_saturation"])) == 1
    assert analyze(cap, Thresholds(saturation_min_total_ns=total + 1),
                   rules=["link_saturation"]) == []
