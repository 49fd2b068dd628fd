#!/usr/bin/env python3
"""In-guest: taccd's chunk write path: CRC-32 by zlib vs ISA-L
(``isal_zlib.crc32``, the same CRC) and the whole chunk write (crc + header + writev(2)
to tmpfs, CaptureWriter's _Stream.write_chunk) per chunk size, in guest CPU ns per byte
and per 104-byte driver record (under -icount guest time is instructions).

    vm_capture_write.py [--mib 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))

import numpy as np  # noqa: E402
from tacc.capture import framing  # noqa: E402
from tacc.capture.schema import STREAMS  # noqa: E402
from tacc.capture.writer import _Stream  # noqa: E402

SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
REC = 104  # a driver record


def cpu_ns() -> int:
    return time.process_time_ns()


def bench_crc(fn, buf: np.ndarray, total: int) -> float:
    n = max(1, total // buf.nbytes)
    fn(buf)
    t = cpu_ns()
    for _ in range(n):
        fn(buf)
    return (cpu_ns() - t) / (n * buf.nbytes)


def bench_write(size: int, total: int, tmp: Path, crc) -> float:
    version, dtype = STREAMS["driver"]
    recs = np.zeros(size // dtype.itemsize, dtype)
    recs.view(np.uint8)[:] = np.random.default_rng(1).integers(0, 255, recs.nbytes, np.uint8)
    saved = framing.crc32
    framing.crc32 = crc
    try:
        p = tmp / f"s{size}.tcs"
        st = _Stream(p, "driver", version, dtype)
        n = max(1, total // recs.nbytes)
        t = cpu_ns()
        for _ in range(n):
            st.write_chunk(recs)
        dt = cpu_ns() - t
        p.unlink()
    finally:
        framing.crc32 = saved
    return dt / (n * recs.nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="bytes per measurement, MiB")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        from isal.isal_zlib import crc32 as icrc
    except ImportError:
        print("vm_capture_write: isal not installed (make setup)", file=sys.stderr)
        return 1
    total = a.mib << 20
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="capwrite-", dir="/tmp"))
    for size in SIZES:
        buf = np.random.default_rng(2).integers(0, 255, size, np.uint8)
        assert icrc(buf) == zlib.crc32(buf)
        row = {"chunk_bytes": size,
               "crc_zlib_ns_per_byte": bench_crc(zlib.crc32, buf, total),
               "crc_isal_ns_per_byte": bench_crc(icrc, buf, total),
               "write_zlib_ns_per_byte": bench_write(size, total, tmp, zlib.crc32),
               "write_isal_ns_per_byte": bench_write(size, total, tmp, icrc)}
        rows.append(row)
    print(f"capture chunk write, guest CPU (ns per byte; x{REC} = per driver record)")
    print(f"{'chunk':>8} {'crc zlib':>9} {'crc isal':>9} {'x':>6} {'write zlib':>11} "
          f"{'write isal':>11} {'us/rec zlib':>12} {'us/rec isal':>12}")
    for r in rows:
        print(f"{r['chunk_bytes'] >> 10:>6}Ki {r['crc_zlib_ns_per_byte']:9.3f} "
              f"{r['crc_isal_ns_per_byte']:9.3f} "
              f"{r['crc_zlib_ns_per_byte'] / max(r['crc_isal_ns_per_byte'], 1e-9):6.1f} "
              f"{r['write_zlib_ns_per_byte']:11.3f} {r['write_isal_ns_per_byte']:11.3f} "
              f"{r['write_zlib_ns_per_byte'] * REC / 1e3:12.3f} "
              f"{r['write_isal_ns_per_byte'] * REC / 1e3:12.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"bench": "capture_write", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
