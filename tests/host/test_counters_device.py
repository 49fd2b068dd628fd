"""The device backend's sample-ring entry parser and the sampler's device loop, on
synthetic bytes (no device)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tacc.capture import CaptureWriter, open_capture
from tacc.counters import BACKENDS, CounterError, functions
from tacc.counters.device import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    SAMPLE_SLOTS,
    DeviceBackend,
    SampleBatch,
    entry_slots,
    parse_entries,
)
from tacc.counters.fakesys import make_function
from tacc.counters.sampler import Sampler, capture_meta

ROOT = Path(__file__).resolve().parents[2]


def _entry(seq: int, devclk: int, func: dict[int, int], glob: dict[int, int] | None = None,
           version: int = 1) -> bytes:
    """One entry packed by hand, the way the device writes it (little endian)."""
    slots = [0] * (2 * SAMPLE_SLOTS)
    for k, v in func.items():
        slots[k] = v
    for k, v in (glob or {}).items():
        slots[SAMPLE_SLOTS + k] = v
    nslots = 2 * SAMPLE_SLOTS if glob is not None else SAMPLE_SLOTS
    b = (version.to_bytes(4, "little") + nslots.to_bytes(4, "little")
         + seq.to_bytes(8, "little") + devclk.to_bytes(8, "little"))
    return b + b"".join(v.to_bytes(8, "little") for v in slots)


def test_entry_size_is_the_devices() -> None:
    assert ENTRY_SIZE == ENTRY_DTYPE.itemsize == 1048
    assert len(_entry(0, 0, {})) == ENTRY_SIZE


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_entry_size_matches_header(tmp_path: Path) -> None:
    src = tmp_path / "s.c"
    src.write_text('#include <stdio.h>\n#include <linux/types.h>\n#include "tacc_hw.h"\n'
                   'int main(void) { printf("%zu %zu %d\\n", TACC_SAMPLE_SIZE, '
                   "sizeof(struct tacc_sample_hdr), TACC_SAMPLE_SLOTS); return 0; }\n")
    subprocess.run(["gcc", "-I", str(ROOT / "kernel/include"), "-o", str(tmp_path / "s"),
                    str(src)], check=True)
    out = subprocess.run([str(tmp_path / "s")], check=True, capture_output=True, text=True)
    assert out.stdout.split() == [str(ENTRY_SIZE), "24", str(SAMPLE_SLOTS)]


def test_slots_of_function_and_global_counters(tmp_path: Path) -> None:
    make_function(tmp_path / "sys")
    cat = functions(tmp_path / "sys")[0].catalogue
    slots = entry_slots(cat)
    for c, s in zip(cat, slots, strict=True):
        assert s == (SAMPLE_SLOTS + c.slot if c.is_global else c.slot), c.name


def test_parse_wraps_around_the_ring() -> None:
    entries = 4
    ring = bytearray(entries * ENTRY_SIZE)
    # free-running indices 6, 7, 8, 9 live at ring positions 2, 3, 0, 1
    for i in range(6, 10):
        pos = i % entries
        ring[pos * ENTRY_SIZE:(pos + 1) * ENTRY_SIZE] = _entry(
            100 + i, 1_000_000 + i * 100_000, {2: i * 4096, 3: 16}, {8: 7 + i})
    slots = np.array([2, 3, SAMPLE_SLOTS + 8], dtype=np.intp)
    seq, devclk, vals = parse_entries(bytes(ring), slots, 6, 4, entries)
    assert seq.tolist() == [106, 107, 108, 109]
    assert np.diff(devclk).tolist() == [100_000] * 3
    assert vals[:, 0].tolist() == [6 * 4096, 7 * 4096, 8 * 4096, 9 * 4096]
    assert (vals[:, 1] == 16).all()
    assert vals[:, 2].tolist() == [13, 14, 15, 16]
    # nothing pending: empty arrays of the right shape
    seq, devclk, vals = parse_entries(bytes(ring), slots, 10, 0, entries)
    assert len(seq) == 0 and vals.shape == (0, 3)


def test_parse_refuses_unknown_entry_version() -> None:
    ring = _entry(0, 0, {}) + _entry(1, 0, {}, version=2)
    with pytest.raises(CounterError, match="version 2"):
        parse_entries(ring, np.array([2], dtype=np.intp), 0, 2, 2)


class _FakeRing(DeviceBackend):
    """A DeviceBackend whose ring is a list of scripted drains (no driver)."""

    def __init__(self, fn, catalogue=None, period_ns=100_000, entries=64, node=None):  # type: ignore[no-untyped-def]
        self.fn = fn
        self.catalogue = catalogue if catalogue is not None else fn.catalogue
        self.slots = entry_slots(self.catalogue)
        self.period_ns = period_ns
        self.entries = entries
        self.dropped = 0
        self.mm = None
        self.fd = -1
        self.script: list[tuple[int, int]] = [(0, 5), (5, 3), (12, 4)]  # (first seq, n)
        self.script_drops = [0, 0, 4]

    def drain(self, limit: int | None = None) -> SampleBatch:
        if not self.script:
            return SampleBatch(np.zeros(0, np.uint64), np.zeros(0, np.uint64),
                               np.zeros((0, len(self.slots)), np.uint64), self.dropped, 1)
        first, n = self.script.pop(0)
        self.dropped = self.script_drops.pop(0)
        raw = b"".join(_entry(50 + first + i, (first + i) * self.period_ns,
                              {2: (first + i) * 10}) for i in range(n))
        size = 1 << (n - 1).bit_length()  # a ring is a power of two
        raw += bytes((size - n) * ENTRY_SIZE)
        seq, devclk, vals = parse_entries(raw, self.slots, 0, n, size)
        return SampleBatch(seq, devclk, vals, self.dropped, 1)


def test_sampler_device_loop_records_and_drops(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    make_function(tmp_path / "sys")
    fns = functions(tmp_path / "sys")
    monkeypatch.setitem(BACKENDS, "device", _FakeRing)
    out = tmp_path / "cap"
    with Sampler(fns, 10_000, "device") as s, CaptureWriter(
            out, capture_meta(fns, 10_000, "device"),
            streams=("counters", "clock_sync", "drops")) as w:
        assert s.sources[0].backend.period_ns == 100_000  # the rate maps to the period
        st = s.run(duration_s=0.05, writer=w)
    cap = open_capture(out)
    rec = cap.read("counters")
    assert len(rec) == st.samples == st.ticks == 12
    # seq relative to the first sample (8..11 missing: the device dropped 4), devclk
    # straight from the entries
    assert rec["seq"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    assert rec["h2d_bytes"].tolist() == [10 * int(q) for q in rec["seq"]]
    assert (np.diff(rec["devclk"].astype(np.int64))[:7] == 100_000).all()
    assert st.missed == 4
    assert int(cap.read("drops")["count"].sum()) == 4


def test_device_backend_is_registered() -> None:
    assert BACKENDS["device"] is DeviceBackend
