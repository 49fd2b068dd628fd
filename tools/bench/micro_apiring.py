#!/usr/bin/env python3
"""Micro-benchmark of the runtime API ring: the producer's cost per traced
call and its parts, and taccd's consumer per record, for the ``userspace`` tree given
(run it in the guest, where -icount makes these instruction times; compare two trees
in one boot: ``micro_apiring.py OLD/userspace; micro_apiring.py userspace``).

    micro_apiring.py [USERSPACE_DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import timeit
from pathlib import Path

os.environ["TACC_API_DIR"] = tempfile.mkdtemp()
os.environ["TACC_API_TRACE"] = "1"
os.environ["TACC_API_RING_RECORDS"] = str(1 << 12)
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else
                str(Path(__file__).resolve().parents[2] / "userspace"))

from tacc.daemon.apiring import ApiRings  # noqa: E402
from tacc.runtime import apitrace as tr  # noqa: E402

N = 20000
ring = tr.current_ring()
assert ring is not None


class Buf:
    name, size = "w1", 1024


buf = Buf()


def reset() -> None:  # the consumer side of a producer-only loop: the ring never fills
    tr.flush()
    ring._tail.value = ring.head
    ring.tail = ring.head


def call() -> None:  # a gemm-like call site: begin, tag, the argument string, end
    t0 = tr.begin()
    tag = tr.next_tag()
    m = n = k = 64
    if t0:
        tr.end(t0, 11, tag, 0, 0x100, 3, 0,
               f"m={m} n={n} k={k} a={buf.name if isinstance(buf, Buf) else '?'}")


def begin() -> None:
    tr.begin()


def next_tag() -> None:
    tr.next_tag()


def end() -> None:
    tr.end(1, 11, 5, 0, 0x100, 3, 0, "m=64 n=64 k=64 a=w1")


def fstring() -> None:
    m = n = k = 64
    f"m={m} n={n} k={k} a={buf.name if isinstance(buf, Buf) else '?'}"  # noqa: B018


def per_call(f: object) -> float:
    best = float("inf")
    for _ in range(3):
        reset()
        t = 0.0
        for _ in range(N // 1000):  # 1000 calls, then the ring is emptied
            t += timeit.timeit(f, number=1000)  # type: ignore[arg-type]
            reset()
        best = min(best, t)
    return best / N * 1e6


print(f"producer: {tr.PRODUCER} (TACC_API_PRODUCER=python: the Python one)")
for f in (call, begin, next_tag, end, fstring):
    print(f"producer {f.__name__:9s} {per_call(f):7.2f} us/call")

strings: dict[str, int] = {}
api = ApiRings(lambda s: strings.setdefault(s, len(strings)), {"0000:01:00.0": 0})
api.scan()
argv = [f"m=64 n=128 k=64 a=w{i}" for i in range(4)] + ["relu n=8192", "add n=8192"]


def fill(n: int = 440) -> None:
    for i in range(n):
        t0 = tr.begin()
        tr.end(t0, 8 + i % 10, i, 4096, 0x100, 3, 0, argv[i % len(argv)])
    tr.flush()


def fill_only() -> None:
    fill()
    reset()


def fill_drain() -> None:
    fill()
    out, _ = api.drain()
    assert len(out) == 440


api.drain()
t_fill = min(timeit.repeat(fill_only, number=10, repeat=3)) / 10
t_both = min(timeit.repeat(fill_drain, number=10, repeat=3)) / 10
print(f"consumer drain of 440  {(t_both - t_fill) * 1e6 / 440:7.2f} us/record")
api.close()
