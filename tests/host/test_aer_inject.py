"""tacc.testing.aer_inject without a guest: the struct aer_error_inj record it writes
(drivers/pci/pcie/aer_inject.c: u8 bus, dev, fn; u32 uncor_status, cor_status,
header_log0..3, domain), the error names taken from <linux/pci_regs.h>, and the CLI's
refusal of bad input (the injection itself: tests/vm/test_linkfault.py)."""

from __future__ import annotations

import struct

import pytest
from tacc.testing import aer_inject


def test_record_layout_is_the_kernels() -> None:
    rec = aer_inject.pack("0001:3a:1f.7", uncor_status=0x4000, cor_status=0x40,
                          header=(1, 2, 3, 4))
    assert len(rec) == 32
    assert rec[:4] == bytes([0x3A, 0x1F, 7, 0])
    assert struct.unpack_from("<7I", rec, 4) == (0x4000, 0x40, 1, 2, 3, 4, 1)
    assert aer_inject.pack("01:00.0")[:3] == b"\x01\x00\x00"


def test_error_names_come_from_the_header() -> None:
    assert aer_inject.UNCOR["DLP"] == 0x10 and aer_inject.UNCOR["COMP_TIME"] == 0x4000
    assert aer_inject.COR["BAD_TLP"] == 0x40 and aer_inject.COR["HL_OVERFLOW"] == 0x8000
    assert len(aer_inject.UNCOR) == 13 and len(aer_inject.COR) == 8
    assert aer_inject.status_of(["bad_tlp", "0x1"], aer_inject.COR) == 0x41


@pytest.mark.parametrize("argv, msg", [
    (["01:00", "--cor", "BAD_TLP"], "not a PCI address"),
    (["0000:01:00.0", "--cor", "NO_SUCH"], "unknown error 'NO_SUCH'"),
    (["0000:01:00.0"], "nothing to inject"),
])
def test_cli_bad_input_is_one_line_and_non_zero(argv, msg, capsys, monkeypatch) -> None:
    monkeypatch.setattr(aer_inject, "is_loaded", lambda: True)  # never modprobe here
    assert aer_inject.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err, err
