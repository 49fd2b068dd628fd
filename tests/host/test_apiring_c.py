"""The runtime API ring's C producer (tacc.runtime._apiring) against the Python
producer of apitrace.py: the same calls write the same bytes (records, head, dropped),
batching, a full ring's drops and argument strings included; the module-level begin/end
the runtime calls record this thread's call into its ring."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.runtime import apitrace as tr

pytestmark = pytest.mark.skipif(tr._c is None, reason="the C producer is not built "
                                "(scripts/setup.sh builds it; this must not happen in CI)")

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
CALL = st.tuples(st.integers(0, 2**16 - 1), st.integers(-2**63, 2**63 - 1),
                 st.integers(-2**63, 2**63 - 1), u64, u64, u32, u32, st.integers(-2**15, 2**15 - 1),
                 st.text(max_size=90) | st.sampled_from(["", "a\udc80b", "é" * 50]))
# a step: a call, the consumer catching up (tail = head), or an explicit publish
STEP = CALL | st.just("consume") | st.just("publish")


def _pair(tmp: Path, capacity: int, batch: int) -> tuple[tr.Ring, tr.Ring]:
    c = tr.Ring(tmp / "c", 1234, 5678, capacity, True, batch)
    p = tr.Ring(tmp / "p", 1234, 5678, capacity, True, batch)
    p._p.close()  # this one writes with the Python producer
    p._p = None
    assert c._p is not None
    return c, p


def _body(r: tr.Ring) -> bytes:
    return bytes(r.mm[tr.OFF_HEAD:tr.OFF_HEAD + 24]) + bytes(r.mm[tr.HEADER_SIZE:])


@settings(max_examples=150, deadline=None)
@given(capacity=st.sampled_from([2, 4, 16]), batch=st.integers(1, 5),
       steps=st.lists(STEP, max_size=40))
def test_c_and_python_producers_write_the_same_bytes(tmp_path_factory: pytest.TempPathFactory,
                                                     capacity: int, batch: int,
                                                     steps: list) -> None:
    c, p = _pair(tmp_path_factory.mktemp("r"), capacity, batch)
    try:
        for s in steps:
            for r in (c, p):
                if s == "consume":
                    r._tail.value = r.head
                elif s == "publish":
                    r.publish()
                else:
                    r.emit(*s)
            assert (c.head, c.published, c.tail) == (p.head, p.published, p.tail)
            assert _body(c) == _body(p)
    finally:
        c.close()
        p.close()


def test_module_begin_end_record_this_threads_call(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """begin() is 0 while the ring is off; end() writes the call with end()'s defaults and
    keywords; flush() publishes; another thread gets its own ring."""
    monkeypatch.setattr(tr, "ring_dir", lambda: tmp_path)
    old = tr._tracer
    tr._tracer = tr._Tracer()
    tr._tracer.mode = "on"
    tr._tracer.batch = 8
    tr._c.forget_thread()
    try:
        t0 = tr.begin()
        assert t0 > 0
        tr.end(t0, tr.NAME_ID["gemm"], 7, nbytes=4096, args="m=64 n=64")
        tr.end(t0, tr.NAME_ID["nop"])
        r = tr.current_ring()
        assert r is not None and r._p is not None and (r.head, r.published) == (2, 0)
        tr.flush()
        assert r.published == 2
        rec = tr.RingReader(r.path).drain()
        assert rec["name_id"].tolist() == [tr.NAME_ID["gemm"], tr.NAME_ID["nop"]]
        assert rec["tag"].tolist() == [7, 0] and rec["bytes"].tolist() == [4096, 0]
        assert rec["dev"].tolist() == [tr.NO_DEV] * 2 and rec["ctx"].tolist() == [tr.NO_CTX] * 2
        assert rec["args"][0] == b"m=64 n=64" and (rec["t_end"] >= t0).all()
        with pytest.raises(TypeError, match="unexpected keyword argument 'nbytez'"):
            tr.end(t0, 1, nbytez=3)
        r.set_enabled(False)
        assert tr.begin() == 0
        other: list[int] = []

        def work() -> None:
            t = tr.begin()
            tr.end(t, tr.NAME_ID["net_send"])
            other.append(threading.get_native_id())

        th = threading.Thread(target=work)
        th.start()
        th.join()
        rings = sorted(tmp_path.glob("tacc-api.*"))
        assert len(rings) == 2 and rings[1].name.endswith(f".{other[0]}")
        assert np.array_equal(tr.RingReader(rings[1]).drain()["name_id"],
                              [tr.NAME_ID["net_send"]])  # published at thread exit
    finally:
        tr._tracer.close_all()
        tr._tracer = old
        tr._c.forget_thread()
