"""pcapng files of TLP records (docs/capture-format.md "TLP capture (pcapng)").

One Section Header Block, one Interface Description Block (link type
``LINKTYPE_USER0`` = 147, snaplen 64, ``if_tsresol`` 9: nanoseconds, ``if_name``
the PF's PCI address, ``if_description`` "tacc TLP capture v1"), then one Enhanced
Packet Block per TLP whose packet data is the raw 64-byte ``struct tacc_tlp_rec``
(little endian; the picosecond time is inside it, the block's timestamp is that time
in ns).  ``tools/tacc-tlp.lua`` decodes it in Wireshark / tshark.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from . import LINKTYPE, TLP_DTYPE

SHB, IDB, EPB = 0x0A0D0D0A, 0x00000001, 0x00000006
BYTE_ORDER_MAGIC = 0x1A2B3C4D
REC = TLP_DTYPE.itemsize


def _opt(code: int, value: bytes) -> bytes:
    pad = (-len(value)) % 4
    return struct.pack("<HH", code, len(value)) + value + b"\0" * pad


def _block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def header(if_name: str = "tacc", description: str = "tacc TLP capture v1") -> bytes:
    shb = _block(SHB, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1) + _opt(0, b""))
    opts = (_opt(2, if_name.encode()) + _opt(3, description.encode())
            + _opt(9, bytes([9])) + _opt(0, b""))
    idb = _block(IDB, struct.pack("<HHI", LINKTYPE, 0, REC) + opts)
    return shb + idb


def packets(recs: np.ndarray) -> bytes:
    """The Enhanced Packet Blocks of ``recs`` (TLP_DTYPE), in order."""
    recs = np.ascontiguousarray(recs, dtype=TLP_DTYPE)
    n = len(recs)
    blen = 12 + 20 + REC  # 96: type, len, iface, ts hi, ts lo, cap, orig, data, len
    out = np.zeros(n, np.dtype([("type", "<u4"), ("len", "<u4"), ("iface", "<u4"),
                                ("ts_hi", "<u4"), ("ts_lo", "<u4"), ("cap", "<u4"),
                                ("orig", "<u4"), ("data", f"V{REC}"), ("len2", "<u4")]))
    ns = recs["t_ps"] // 1000
    out["type"], out["len"], out["len2"] = EPB, blen, blen
    out["ts_hi"], out["ts_lo"] = ns >> 32, ns & 0xFFFFFFFF
    out["cap"] = out["orig"] = REC
    out["data"] = recs.view(f"V{REC}")
    return out.tobytes()


def write(path: Path, recs: np.ndarray, if_name: str = "tacc") -> None:
    with open(path, "wb") as f:
        f.write(header(if_name))
        f.write(packets(recs))


def read(path: Path) -> np.ndarray:
    """The TLP records of a pcapng file this module wrote (or any pcapng whose
    interface is LINKTYPE_USER0 with 64-byte packets of this format)."""
    data = Path(path).read_bytes()
    out: list[bytes] = []
    off = 0
    ours = False
    while off + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        if blen < 12 or off + blen > len(data):
            raise ValueError(f"{path}: truncated pcapng block at {off}")
        if btype == IDB:
            ours = struct.unpack_from("<H", data, off + 8)[0] == LINKTYPE
        elif btype == EPB and ours:
            cap = struct.unpack_from("<I", data, off + 20)[0]
            if cap == REC:
                out.append(data[off + 28:off + 28 + REC])
        off += blen
    return np.frombuffer(b"".join(out), TLP_DTYPE).copy()
