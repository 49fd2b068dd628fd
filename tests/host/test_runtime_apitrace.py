"""The per-thread API trace rings: format, enable flag from another process, drops."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from tacc.runtime import apitrace as tr

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, TACC_API_DIR=str(tmp), TACC_RUNTIME_SIM="1", **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60, check=True)


def test_layouts() -> None:
    assert tr.RECORD_DTYPE.itemsize == tr.REC_SIZE == 128
    assert tr.HEADER_DTYPE.itemsize <= tr.NAMES_OFFSET
    for name, off in (("enable", tr.OFF_ENABLE), ("head", tr.OFF_HEAD), ("tail", tr.OFF_TAIL),
                      ("dropped", tr.OFF_DROPPED), ("flags", tr.OFF_FLAGS)):
        assert tr.HEADER_DTYPE.fields[name][1] == off


def test_ring_roundtrip_and_overflow(tmp_path: Path) -> None:
    r = tr.Ring(tmp_path / "tacc-api.1", 1, 1, 8, enabled=True)
    for i in range(10):
        r.emit(tr.NAME_ID["gemm"], 100 + i, 200 + i, tag=(1 << 32) | i, nbytes=i, args=f"x{i}")
    rd = tr.RingReader(tmp_path / "tacc-api.1")
    assert rd.dropped == 2 and rd.names[tr.NAME_ID["gemm"]] == "gemm"
    recs = rd.drain()
    assert len(recs) == 8
    assert list(recs["t_start"]) == list(range(100, 108))
    assert recs["args"][3] == b"x3" and int(recs["tag"][7]) == (1 << 32) | 7
    assert len(rd.drain()) == 0
    r.emit(tr.NAME_ID["nop"], 1, 2)  # space again after the drain
    assert len(rd.drain()) == 1 and rd.dropped == 2
    rd.close()


def test_reader_rejects_other_files(tmp_path: Path) -> None:
    p = tmp_path / "tacc-api.5"
    p.write_bytes(b"\0" * 8192)
    with pytest.raises(ValueError, match="magic"):
        tr.RingReader(p)
    p.write_bytes(b"x")
    with pytest.raises(ValueError):
        tr.RingReader(p)


def test_env_on_records_every_call(tmp_path: Path) -> None:
    code = """
import os, numpy as np
from tacc.runtime import Context, apitrace
with Context() as ctx:
    s = ctx.stream(); d = ctx.device_buffer(64); s.copy_h2d(d, np.ones(64, np.float32))
    s.relu(d, d); s.synchronize()
if True:
    print(os.getpid())
    r = apitrace.RingReader(apitrace.list_rings(pid=os.getpid())[0])
    recs = r.drain()
    print(",".join(r.names[i] for i in recs["name_id"]))
    print(int(recs[recs["name_id"] == apitrace.NAME_ID["eltwise"]]["tag"][0]) >> 32)
"""
    out = _run(code, tmp_path, TACC_API_TRACE="1").stdout.split()
    pid, names, tagpid = int(out[0]), out[1].split(","), int(out[2])
    assert names[:3] == ["context_open", "stream_create", "device_buffer"]
    assert "copy_h2d" in names and "eltwise" in names and "stream_synchronize" in names
    assert tagpid == pid
    assert not list(tmp_path.glob(f"tacc-api.{pid}*")), "drained rings are removed at exit"


def test_off_by_default_then_enabled_from_outside(tmp_path: Path) -> None:
    code = """
import os, sys, numpy as np
from tacc.runtime import Context, apitrace
ctx = Context(); s = ctx.stream(); d = ctx.device_buffer(64)
print(os.getpid(), flush=True)
sys.stdin.readline()          # the test enables tracing here
s.relu(d, d); s.relu(d, d)
apitrace.flush()              # queued records (a batch) published before a non-tacc wait
print("done", flush=True)
sys.stdin.readline()
"""
    e = dict(os.environ, TACC_API_DIR=str(tmp_path), TACC_RUNTIME_SIM="1")
    e.pop("TACC_API_TRACE", None)
    p = subprocess.Popen([sys.executable, "-c", code], env=e, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        pid = int(p.stdout.readline())
        rings = tr.list_rings(tmp_path, pid)
        assert len(rings) == 1
        rd = tr.RingReader(rings[0])
        assert not rd.info().enabled and len(rd.drain()) == 0  # off: nothing recorded
        assert tr.set_enabled(rings[0], True) == 1
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        recs = rd.drain()
        assert [rd.names[i] for i in recs["name_id"]] == ["eltwise", "eltwise"]
        assert np.all(recs["pid"] == pid) and np.all(recs["t_end"] >= recs["t_start"])
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(timeout=30)
        rd.close()
    finally:
        p.kill()


def test_one_ring_per_thread(tmp_path: Path) -> None:
    code = """
import os, threading
from tacc.runtime import Context, apitrace
ctx = Context()
def work():
    s = ctx.stream(); d = ctx.device_buffer(16); s.relu(d, d); s.synchronize()
ts = [threading.Thread(target=work) for _ in range(3)]
[t.start() for t in ts]; [t.join() for t in ts]
work()
rings = apitrace.list_rings(pid=os.getpid())
print(len(rings))
tids = set()
for p in rings:
    r = apitrace.RingReader(p); recs = r.drain()
    tids |= set(int(t) for t in recs["tid"])
    assert len(set(int(t) for t in recs["tid"])) == 1
print(len(tids))
"""
    out = _run(code, tmp_path, TACC_API_TRACE="1").stdout.split()
    assert out == ["4", "4"]


def test_none_mode_creates_nothing(tmp_path: Path) -> None:
    code = """
from tacc.runtime import Context
with Context() as ctx:
    ctx.device_buffer(16)
import os; print(os.getpid())
"""
    _run(code, tmp_path, TACC_API_TRACE="none")
    assert not list(tmp_path.glob("tacc-api.*"))


def test_thread_safety_of_tags() -> None:
    tags: list[int] = []

    def take() -> None:
        for _ in range(1000):
            tags.append(tr.next_tag())

    ts = [threading.Thread(target=take) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(tags)) == len(tags) == 4000


def test_decoded_reader_for_taccd(tmp_path: Path) -> None:
    from tacc.runtime.device import pci_id

    r = tr.Ring(tmp_path / "tacc-api.7.9", 7, 9, 16, enabled=True)
    r.emit(tr.NAME_ID["copy_h2d"], 5, 9, tag=(7 << 32) | 1, nbytes=4096,
           dev=pci_id("0000:01:00.2"), args="h1->d2 4096")
    r.emit(tr.NAME_ID["synchronize"], 10, 20)
    rd = tr.open_reader(tmp_path / "tacc-api.7.9")
    out = rd.drain()
    assert list(out["name"]) == [b"copy_h2d", b"synchronize"]
    assert list(out["device"]) == [b"0000:01:00.2", b""]
    assert out["bytes"][0] == 4096 and out["args"][0] == b"h1->d2 4096"
    assert rd.dropped == 0 and rd.pid == 7
    assert tr.ring_pid(tmp_path / "tacc-api.7.9") == 7 == tr.ring_pid("tacc-api.7")
    rd.close()


def test_batched_publish_and_flush(tmp_path: Path) -> None:
    """The runtime's rings publish records in batches: nothing is visible
    before the batch fills, a flush() or the age limit; close() publishes the rest; a
    batch that does not fit is dropped and counted record by record."""
    r = tr.Ring(tmp_path / "tacc-api.3", 3, 3, 8, enabled=True, batch=4)
    rd = tr.RingReader(tmp_path / "tacc-api.3")
    for i in range(3):
        r.emit(tr.NAME_ID["nop"], 100 + i, 200 + i, tag=i)
    assert len(rd.drain()) == 0, "queued, not yet published"
    r.emit(tr.NAME_ID["nop"], 103, 203, tag=3)  # the 4th fills the batch
    assert rd.drain()["tag"].tolist() == [0, 1, 2, 3]
    r.emit(tr.NAME_ID["nop"], 104, 204, tag=4)
    r.emit(tr.NAME_ID["nop"], 105, 205 + tr.BATCH_AGE_NS, tag=5)  # the first is too old
    assert rd.drain()["tag"].tolist() == [4, 5]
    for i in range(11):  # 8 fit, then 3 dropped
        r.emit(tr.NAME_ID["nop"], 1, 2, tag=10 + i)
    r.publish()
    assert rd.dropped == 3 and rd.drain()["tag"].tolist() == list(range(10, 18))
    r.emit(tr.NAME_ID["gemm"], 1, 2, tag=99, args="m=1")
    r.close()  # publishes what is queued; pending for the reader: the file stays
    recs = rd.drain()
    assert recs["tag"].tolist() == [99] and recs["args"][0] == b"m=1"
    rd.close()


def test_runtime_flushes_before_blocking(tmp_path: Path) -> None:
    """A consumer sees every call made before a synchronize while the thread waits.
    The age that publishes a queued record at the next call (10 ms) is set past the
    test's span: on a loaded host the calls before the first drain took more than it."""
    code = """
import os, threading, numpy as np
from tacc.runtime import Context, apitrace
apitrace.BATCH_AGE_NS = 600 * 10**9
with Context() as ctx:
    s = ctx.stream(); d = ctx.device_buffer(64); s.copy_h2d(d, np.ones(64, np.float32))
    r = apitrace.RingReader(apitrace.list_rings(pid=os.getpid())[0])
    before = len(r.drain())
    s.relu(d, d); s.synchronize()
    after = [r.names[i] for i in r.drain()["name_id"]]
    print(before, ",".join(after))
"""
    out = _run(code, tmp_path, TACC_API_TRACE="1", TACC_API_BATCH="32").stdout.split()
    assert out[0] == "0", "records are queued until a batch, flush or wait"
    assert out[1].split(",") == ["context_open", "stream_create", "device_buffer",
                                 "copy_h2d", "eltwise"]


def test_thread_exit_publishes_its_queued_records(tmp_path: Path) -> None:
    """A thread that makes its last traced call and ends (a pipeline's sender thread)
    leaves no record queued: the records are published when the thread ends, while the
    process (and a capture of it) goes on.  Before, the last send of node 1's sender
    thread stayed queued until process exit, so the cluster capture of the good
    pipeline twin had 15 of its 16 messages."""
    code = """
import os, threading
from tacc.runtime import apitrace
def work():
    t0 = apitrace.begin()
    apitrace.end(t0, apitrace.NAME_ID["net_send"], tag=7, nbytes=64)
t = threading.Thread(target=work); t.start(); t.join()
mine = [p for p in apitrace.list_rings(pid=os.getpid()) if p.name.count(".") == 2]
r = apitrace.RingReader(mine[0])
print(len(r.drain()), r.dropped)
"""
    code = "import threading\nfrom tacc.runtime import apitrace\n" \
           "t0 = apitrace.begin(); apitrace.end(t0, apitrace.NAME_ID['nop'])\n" + code
    out = _run(code, tmp_path, TACC_API_TRACE="1", TACC_API_BATCH="32").stdout.split()
    assert out == ["1", "0"], out
