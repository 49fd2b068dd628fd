"""The capture's raw device-trace dtype and counter columns match kernel/include/tacc_hw.h."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.capture.schema import (
    COUNTERS_DTYPE,
    DEVICE_TRACE_DTYPE,
    FUNC_COUNTERS,
    GLOBAL_COUNTERS,
    TRACE_EV_BASE,
    TRACE_EV_VIRTIO_DISPATCH,
    TRACE_EV_VIRTIO_KICK,
    TRACE_REC_DTYPE,
    TRACE_REC_VERSION,
)

ROOT = Path(__file__).resolve().parents[2]
HDR = ROOT / "kernel" / "include"

PROG = r"""
#include <stdio.h>
#include <stddef.h>
#include "tacc_hw.h"
#define F(f) printf("field %s %zu %zu\n", #f, offsetof(struct tacc_trace_rec, f), \
                    sizeof(((struct tacc_trace_rec *)0)->f));
#define C(name, idx, unit, desc) printf("func %s %d\n", #name, idx);
#define G(name, idx, unit, desc) printf("global %s %d\n", #name, idx);
int main(void) {
    printf("size %zu\n", sizeof(struct tacc_trace_rec));
    printf("recsize %d\n", TACC_TRACE_REC_SIZE);
    printf("version %d\n", TACC_TRACE_VERSION);
    printf("ev %d %d %d\n", TACC_TRACE_EV_BASE, TACC_TRACE_EV_VIRTIO_KICK,
           TACC_TRACE_EV_VIRTIO_DISPATCH);
    F(version) F(opcode) F(engine) F(queue) F(func) F(ctx) F(seq) F(job) F(tag)
    F(t_fetch) F(t_start) F(t_end) F(bytes) F(tlps) F(index) F(status) F(tlb_misses) F(rsvd)
    TACC_FUNC_COUNTERS(C)
    TACC_GLOBAL_COUNTERS(G)
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("layout")
    (d / "l.c").write_text(PROG)
    subprocess.run([gcc, "-Wall", "-Werror", "-I", str(HDR), "-o", str(d / "l"), str(d / "l.c")],
                   check=True)
    out = subprocess.run([str(d / "l")], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def test_trace_record_matches_c(c_layout: list[list[str]]) -> None:
    fields = {r[1]: (int(r[2]), int(r[3])) for r in c_layout if r[0] == "field"}
    size = next(int(r[1]) for r in c_layout if r[0] == "size")
    assert size == TRACE_REC_DTYPE.itemsize == 64
    assert next(int(r[1]) for r in c_layout if r[0] == "recsize") == 64
    assert next(int(r[1]) for r in c_layout if r[0] == "version") == TRACE_REC_VERSION
    assert next([int(x) for x in r[1:]] for r in c_layout if r[0] == "ev") == [
        TRACE_EV_BASE, TRACE_EV_VIRTIO_KICK, TRACE_EV_VIRTIO_DISPATCH]
    assert set(fields) == set(TRACE_REC_DTYPE.names)
    for name, (off, sz) in fields.items():
        dt, doff = TRACE_REC_DTYPE.fields[name][:2]
        assert (doff, dt.itemsize) == (off, sz), name
        assert dt.byteorder in ("<", "|", "=")
    # the capture stream keeps the raw record at the same offsets
    for name in TRACE_REC_DTYPE.names:
        assert DEVICE_TRACE_DTYPE.fields[name][1] == TRACE_REC_DTYPE.fields[name][1]


def test_counter_xlists_match_c(c_layout: list[list[str]]) -> None:
    func = [(r[1], int(r[2])) for r in c_layout if r[0] == "func"]
    glob = [(r[1], int(r[2])) for r in c_layout if r[0] == "global"]
    assert tuple(func) == FUNC_COUNTERS
    assert tuple(glob) == GLOBAL_COUNTERS
    for name, _ in FUNC_COUNTERS:
        assert COUNTERS_DTYPE.fields[name][0].str == "<u8"
    for name, _ in GLOBAL_COUNTERS:
        assert "g_" + name in COUNTERS_DTYPE.names


def test_link_model_single_source() -> None:
    """docs/hardware.md section 9: one Python implementation (tacc.model.link), its
    constants equal tacc_hw.h, and the test model (taccdev.LinkModel) delegates to it."""
    import re
    from pathlib import Path

    from tacc.model import link as linkmodel
    from tacc.testing.taccdev import LinkModel

    hw = (Path(__file__).resolve().parents[2] / "kernel/include/tacc_hw.h").read_text()
    const = {m[0]: int(m[1]) for m in re.findall(r"#define\s+(TACC_LINK_\w+)\s+(\d+)\b", hw)}
    assert (const["TACC_LINK_ENC_NUM"], const["TACC_LINK_ENC_DEN"]) == (linkmodel.LINK_ENC_NUM,
                                                                         linkmodel.LINK_ENC_DEN)
    # every TACC_LINK_* constant has its Python twin (LINK_*), same value
    for name, v in const.items():
        if name == "TACC_LINK_WIDTH_SHIFT":  # a register field, not the model
            continue
        assert getattr(linkmodel, name.removeprefix("TACC_"), None) == v, name
    lm = LinkModel(gen=4, width=16, mps=256, mrrs=512)
    assert lm.t_link_ps(32) == -(-32 * 8 * 130 * 1000 * 371 // (16 * 16 * 128 * 370))
    # 4 KiB aligned: 64 completions of 64 B (RCB) + the root port's ACK and UpdateFC for
    # 8 requests; up: 8 requests + the device's ACKs for 64 completions
    assert lm.h2d_bytes(4096) == (4096 + 64 * 20 + 4 * 8, 8 * 24 + 16 * 8, 64)
    assert lm.d2h_bytes(4096) == (4096 + 16 * 24, 16)
    # the maximum is the large-transfer limit of the exact formula, per direction
    n = 1 << 30
    for dirn, h2d in (("h2d", True), ("d2h", False)):
        bw = n / ((lm.copy_ps(n, h2d) - (lm.cmd_ns + (lm.rd_ns if h2d else lm.wr_ns)) * 1000)
                  * 1e-12)
        assert abs(bw / linkmodel.link_max_payload_bw(4, 16, 256, dirn) - 1) < 1e-6
