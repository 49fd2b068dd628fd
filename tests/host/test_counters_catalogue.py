"""Catalogue parsing, function discovery and the sysfs backend on a fake sysfs tree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tacc import hw
from tacc.capture.schema import COUNTERS_DTYPE
from tacc.counters import CounterError, SysfsBackend, functions, select_functions
from tacc.counters.catalogue import GLOBAL_PAGE, parse_catalogue
from tacc.counters.fakesys import make_function, set_values


def test_parse_catalogue_from_header_format() -> None:
    cat = parse_catalogue(hw.counter_catalogue())
    assert cat.version == 1
    assert cat.get("h2d_bytes").slot == 2 and cat.get("h2d_bytes").unit == "bytes"
    assert cat.get("uptime_ticks").is_global
    assert cat.get("uptime_ticks").offset == GLOBAL_PAGE + 8 * 8
    assert cat.get("busy_dma_h2d").description.startswith("DMA H2D engine busy")
    fn_only = cat.select(scope="function")
    assert not any(c.is_global for c in fn_only)
    with pytest.raises(CounterError):
        cat.select(["h2d_bytes", "nope"])


def test_parse_errors() -> None:
    with pytest.raises(CounterError):
        parse_catalogue("# version 1\n")
    with pytest.raises(CounterError):
        parse_catalogue("h2d_bytes two bytes function x\n")


def test_catalogue_columns_match_capture_schema() -> None:
    """Every counter the driver lists has a column in the capture's counters stream."""
    cat = parse_catalogue(hw.counter_catalogue())
    cols = set(COUNTERS_DTYPE.names)
    missing = [n for n in cat.record_dtype().names if n not in cols]
    assert missing == []


def test_page_dtype_offsets() -> None:
    cat = parse_catalogue(hw.counter_catalogue())
    dt = cat.page_dtype()
    assert dt.itemsize == GLOBAL_PAGE
    assert dt.fields["gen"][1] == 8
    assert dt.fields["h2d_bytes"][1] == 16
    buf = np.zeros(GLOBAL_PAGE // 8, "<u8")
    buf[2] = 12345
    assert int(np.ndarray((), dt, buffer=buf.data)["h2d_bytes"]) == 12345


def test_functions_and_pmu_names(tmp_path: Path) -> None:
    make_function(tmp_path, "0000:01:00.0")
    make_function(tmp_path, "0001:02:01.3", vf=0, gen=5, width=8)
    fns = functions(tmp_path)
    assert [f.pci for f in fns] == ["0000:01:00.0", "0001:02:01.3"]
    assert fns[0].pmu_name == "tacc_100"
    assert fns[1].pmu_name == "tacc_1020b"  # 1 << 16 | 2 << 8 | (1 << 3 | 3)
    assert (fns[1].gen, fns[1].width, fns[1].mps) == (5, 8, 256)
    assert select_functions(["01:00.0"], tmp_path)[0].pci == "0000:01:00.0"
    with pytest.raises(CounterError):
        select_functions(["0000:09:00.0"], tmp_path)


def test_sysfs_backend_reads_files(tmp_path: Path) -> None:
    dev = make_function(tmp_path, values={"h2d_bytes": 4096, "link_h2d_bytes": 7})
    fn = functions(tmp_path)[0]
    with SysfsBackend(fn) as b:
        s1 = b.read()
        set_values(dev, {"h2d_bytes": 8192, "link_h2d_bytes": 9})
        s2 = b.read()
    i = fn.catalogue.index("h2d_bytes")
    assert s1.valid and int(s1.values[i]) == 4096 and int(s2.values[i]) == 8192
    assert int(s2.values[fn.catalogue.index("link_h2d_bytes")]) == 9


def test_missing_catalogue_is_a_clear_error(tmp_path: Path) -> None:
    dev = make_function(tmp_path)
    (dev / "counters" / "catalogue").unlink()
    with pytest.raises(CounterError, match="catalogue"):
        _ = functions(tmp_path)[0].catalogue
