"""accel-bpftrace pure-Python parts: tracefs formats, ring-buffer bulk drain, event
conversion, rendering, one-line errors."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tacc.bpftrace import output
from tacc.bpftrace.bpfsrc import NOT_TRACED, PRELUDE, RAW_ARGS, TACC_EVENTS, raw_wrapper
from tacc.bpftrace.events import EV_DTYPE, HOST_BASE, to_driver, to_host
from tacc.bpftrace.program import PROG_INFO_SIZE, RECURSION_MISSES_OFF
from tacc.bpftrace.ringbuf import BUSY_BIT, DISCARD_BIT, RingReader, stride_of
from tacc.bpftrace.tpformat import c_struct, parse_format
from tacc.capture.schema import NO_FID, DriverKind, HostKind
from tacc.cli import bpftrace as cli
from tacc.devices import devid_to_pci, parse_pci
from tacc.errors import DeviceError

FORMAT = """name: tacc_job_done
ID: 1234
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:u32 dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:u32 ctx;\toffset:12;\tsize:4;\tsigned:0;
\tfield:u64 seqno;\toffset:24;\tsize:8;\tsigned:0;
\tfield:int error;\toffset:36;\tsize:4;\tsigned:1;
\tfield:const void * bo;\toffset:40;\tsize:8;\tsigned:0;
\tfield:char comm[16];\toffset:48;\tsize:16;\tsigned:0;

print fmt: "dev=%x", REC->dev
"""


def test_parse_format_and_struct() -> None:
    f = parse_format(FORMAT, "tacc")
    assert f.name == "tacc_job_done" and f.id == 1234
    names = [x.name for x in f.fields if not x.common]
    assert names == ["dev", "ctx", "seqno", "error", "bo", "comm"]
    assert f.field("comm").array == 16 and f.field("error").signed
    src = c_struct(f, "tp_x")
    assert "u8 __pad1[4];" in src and "u64 seqno;" in src and "s32 error;" in src
    assert "u64 bo;" in src and "u8 comm[16];" in src


ROOT = Path(__file__).resolve().parents[2]


def _header_protos() -> dict[str, tuple[str, ...]]:
    """event -> record field filled from each TP_PROTO argument, from kernel/tacc_trace.h."""
    text = (ROOT / "kernel" / "tacc_trace.h").read_text()
    classes: dict[str, tuple[list[str], dict[str, str]]] = {}
    out: dict[str, tuple[str, ...]] = {}
    for m in re.finditer(r"(TRACE_EVENT|DECLARE_EVENT_CLASS|DEFINE_EVENT)\((.*?)\n\n", text,
                         re.S):
        kind, body = m.group(1), m.group(2)
        if kind == "DEFINE_EVENT":
            cls, name = re.match(r"\s*(\w+),\s*(\w+)", body).groups()
            args, assign = classes[cls]
        else:
            name = re.match(r"\s*(\w+)", body).group(1)
            proto = re.search(r"TP_PROTO\((.*?)\),\s*\n", body, re.S).group(1)
            args = [re.findall(r"\w+", a)[-1] for a in proto.split(",")]
            assign = {v: f for f, v in re.findall(r"__entry->(\w+) = (\w+);", body)}
            classes[name] = (args, assign)
        if kind != "DECLARE_EVENT_CLASS":
            out[name] = tuple(assign[a] for a in args)
    return out


def test_raw_tracepoint_args_match_header() -> None:
    # raw tracepoint programs read TP_PROTO arguments by position: the table must follow
    # the header (argument order, and which record field each argument fills)
    protos = _header_protos()
    assert set(NOT_TRACED) <= set(protos)
    assert {k: v for k, v in protos.items() if k not in NOT_TRACED} == RAW_ARGS
    assert set(RAW_ARGS) == set(TACC_EVENTS)
    src = raw_wrapper("tacc_job_done", parse_format(FORMAT.replace("\tfield:char comm", (
        "\tfield:u32 queue;\toffset:16;\tsize:4;\tsigned:0;\n\tfield:u32 hw_job;\toffset:20;"
        "\tsize:4;\tsigned:0;\n\tfield:u64 tag;\toffset:64;\tsize:8;\tsigned:0;\n"
        "\tfield:u32 status;\toffset:72;\tsize:4;\tsigned:0;\n\tfield:u64 dev_start;"
        "\toffset:80;\tsize:8;\tsigned:0;\n\tfield:u64 dev_end;\toffset:88;\tsize:8;"
        "\tsigned:0;\n\tfield:char comm")), "tacc"))
    assert "a.seqno = ctx->args[3];" in src and "return on_job_done(&a);" in src
    with pytest.raises(ValueError, match="has no field queue"):
        raw_wrapper("tacc_job_done", parse_format(FORMAT, "tacc"))


def test_prog_info_offsets_match_system_header(tmp_path: Path) -> None:
    c = tmp_path / "o.c"
    c.write_text("#include <linux/bpf.h>\n#include <stddef.h>\n#include <stdio.h>\n"
                 "int main(void) { printf(\"%zu %zu\", offsetof(struct bpf_prog_info, "
                 "recursion_misses), sizeof(struct bpf_prog_info)); return 0; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "o"), str(c)], check=True)
    off, size = map(int, subprocess.run([str(tmp_path / "o")], check=True, capture_output=True,
                                         text=True).stdout.split())
    assert off == RECURSION_MISSES_OFF and size >= PROG_INFO_SIZE


def test_ev_layout_matches_c() -> None:
    # field order/sizes of struct tacc_ev in the BPF prelude == EV_DTYPE
    assert "u64 ts, tag, a, b, c, d;" in PRELUDE
    assert "u32 pid, tid, dev, x, w, v;" in PRELUDE
    assert EV_DTYPE.itemsize == 112 and EV_DTYPE.fields["comm"][1] == 80


def _ring(size: int = 4096, page: int = 4096) -> tuple[bytearray, bytearray, memoryview]:
    cons = bytearray(page)
    prod = bytearray(page + 2 * size)
    return cons, prod, memoryview(prod)


def _put(prod: bytearray, size: int, page: int, pos: int, rec: bytes, flags: int = 0) -> int:
    """Write one record at producer position pos (both data mappings), return new pos."""
    frame = struct.pack("<II", len(rec) | flags, 0) + rec
    frame += b"\0" * (stride_of(len(rec)) - len(frame))
    for i, b in enumerate(frame):
        off = (pos + i) & (size - 1)
        prod[page + off] = b
        prod[page + size + off] = b
    return pos + len(frame)


def _ev(n: int, kind: int = int(DriverKind.SUBMIT)) -> np.ndarray:
    e = np.zeros(n, EV_DTYPE)
    e["ts"] = np.arange(n) + 1000
    e["kind"] = kind
    e["a"] = np.arange(n)
    return e


def test_ringbuf_bulk_drain_wrap_busy_discard() -> None:
    size, page = 4096, 4096
    cons, prod, _ = _ring(size, page)
    r = RingReader(cons, prod, size, EV_DTYPE, page)
    evs = _ev(60)
    pos = 0
    for i in range(30):
        pos = _put(prod, size, page, pos, evs[i].tobytes())
    struct.pack_into("<Q", prod, 0, pos)
    got = r.drain()
    assert len(got) == 30 and list(got["a"]) == list(range(30))
    assert struct.unpack_from("<Q", cons, 0)[0] == pos
    # wrap around the end of the data area; one discarded, the last one still busy
    for i in range(30, 60):
        flags = DISCARD_BIT if i == 40 else (BUSY_BIT if i == 59 else 0)
        pos = _put(prod, size, page, pos, evs[i].tobytes(), flags)
    struct.pack_into("<Q", prod, 0, pos)
    got = r.drain()
    assert list(got["a"]) == [i for i in range(30, 59) if i != 40]
    assert r.discarded == 1
    assert struct.unpack_from("<Q", cons, 0)[0] == pos - stride_of(EV_DTYPE.itemsize)


def test_ringbuf_odd_size_record_slow_path() -> None:
    size, page = 4096, 4096
    cons, prod, _ = _ring(size, page)
    r = RingReader(cons, prod, size, EV_DTYPE, page)
    pos = _put(prod, size, page, 0, _ev(1)[0].tobytes())
    pos = _put(prod, size, page, pos, b"x" * 20)
    pos = _put(prod, size, page, pos, _ev(2)[1].tobytes())
    struct.pack_into("<Q", prod, 0, pos)
    got = r.drain()
    assert list(got["a"]) == [0, 1] and r.odd == 1


def test_to_driver_and_host() -> None:
    e = _ev(4)
    e["kind"] = [DriverKind.IOCTL, DriverKind.SUBMIT, DriverKind.JOB_DONE, HOST_BASE + 1]
    e["dev"] = 0x108
    e["d"] = [500, 0, 7000, 0]
    e["b"] = [0, 4096, 10, 0]
    e["c"] = [0, 0, 30, 0]
    e["v"] = [0, 3, 0, 0]
    e["x"] = [1, 1, 1, 77]
    d = to_driver(e, {0x108: 0})
    assert len(d) == 3 and list(d["fid"]) == [0, 0, 0]
    assert d["t_ns"][0] == 1000 - 500 and d["dur_ns"][0] == 500
    assert d["size"][1] == 4096 and d["ncmds"][1] == 3
    assert d["dev_start"][2] == 10 and d["dev_end"][2] == 30 and d["dur_ns"][2] == 7000
    assert to_driver(e, {})["fid"][0] == NO_FID
    h = to_host(e)
    assert len(h) == 1 and h["kind"][0] == HostKind.SCHED_SWITCH and h["next_pid"][0] == 77


def test_snoop_rows_and_hist() -> None:
    e = _ev(2)
    e["kind"] = [DriverKind.SUBMIT, DriverKind.JOB_DONE]
    e["comm"] = b"python3"
    e["d"] = [0, 12000]
    rows = output.snoop_rows(e, 1000)
    assert [r["event"] for r in rows] == ["submit", "done"]
    assert rows[1]["latency_us"] == 12.0
    assert "python3" in output.snoop_line(rows[0])
    lines = output.log2_hist({0: 1, 3: 4}, "nsecs")
    assert len(lines) == 5 and "8 -> 15" in lines[4]


def test_pci_parse() -> None:
    assert parse_pci("0000:01:00.0") == ("0000:01:00.0", 0x100)
    assert parse_pci("01:00.3")[1] == 0x103
    assert devid_to_pci(0x10108) == "0001:01:01.0"
    with pytest.raises(DeviceError):
        parse_pci("zz")


@pytest.mark.parametrize("argv", [["--bogus"], ["snoop", "-p", "x"], ["top", "--duration", "-1"],
                                  ["frobnicate"], [], ["snoop", "-d", "nope"],
                                  ["record", "-o", "/nonexistent/c", "--trace-entries", "100"]])
def test_bad_options_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("accel-bpftrace: ")


def test_console_script_not_root_or_no_module() -> None:
    # whatever the host lacks (root, the module), one line and a non-zero status
    p = subprocess.run([sys.executable, "-m", "tacc.cli.bpftrace", "snoop"], text=True,
                       capture_output=True, timeout=60)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("accel-bpftrace: ")


def _ref_driver_row(e: np.void, fid_of_dev: dict[int, int]) -> dict[str, int]:
    """One event -> its driver record, per the table in tacc.bpftrace.events, record by
    record (the reference the vectorised to_driver must match)."""
    K = DriverKind
    k = int(e["kind"])
    a, b, c, d = (int(e[f]) for f in "abcd")
    x, w, v, z, y = int(e["x"]), int(e["w"]), int(e["v"]), int(e["z"]), int(e["y"])
    r = {"t_ns": int(e["ts"]), "tag": int(e["tag"]), "pid": int(e["pid"]),
         "tid": int(e["tid"]), "kind": k, "cpu": int(e["cpu"]), "ctx": x & 0xFFFF,
         "queue": y & 0xFF, "fid": fid_of_dev.get(int(e["dev"]), NO_FID)}
    if k == K.IOCTL:
        r.update(dur_ns=d, arg=a, status=z, t_ns=int(e["ts"]) - d)
    elif k == K.SUBMIT:
        r.update(job=a, size=b, ncmds=v, arg=w)
    elif k == K.DOORBELL:
        r.update(job=a, arg=w, nsegs=v)
    elif k == K.IRQ:
        r.update(arg=w, status=v)
    elif k == K.JOB_START:
        r.update(job=a, arg=w, dur_ns=d, nsegs=v)
    elif k == K.JOB_DONE:
        r.update(job=a, dev_start=b, dev_end=c, arg=w, status=z, flags=v, dur_ns=d)
    elif k in (K.BO_CREATE, K.BO_DESTROY):
        r.update(arg=a, size=b, nsegs=w, flags=(1 if w == 2 else 0) | (8 if w == 1 else 0))
    elif k in (K.DMA_MAP, K.DMA_UNMAP):
        r.update(addr=a, size=b, arg=c, nsegs=w, dir=v, dur_ns=d, t_ns=int(e["ts"]) - d,
                 ctx=0)
    elif k in (K.VM_BIND, K.VM_UNBIND):
        r.update(addr=a, size=b, arg=c, page_size=d)
    elif k == K.MMU_FAULT:
        r.update(addr=a, status=w, arg=v)
    elif k == K.PM:
        r.update(arg=v, nsegs=w)
    elif k == K.RESET:
        r.update(job=a, status=z)
    elif k == K.TRACE_DROP:
        r.update(size=w, arg=v)
    return r


@pytest.mark.parametrize("seed", range(4))
def test_to_driver_matches_per_record_reference(seed: int) -> None:
    from tacc.capture.schema import DRIVER_DTYPE

    rng = np.random.default_rng(seed)
    n = 600
    e = rng.integers(0, 1 << 8, n * EV_DTYPE.itemsize, dtype=np.uint8).view(EV_DTYPE).copy()
    e["ts"] = rng.integers(1 << 40, 1 << 50, n)  # spans subtract d: keep t_ns meaningful
    e["d"] = rng.integers(0, 1 << 30, n)
    kinds = [int(k) for k in DriverKind] + [0, 17, 31] + [HOST_BASE + int(k) for k in HostKind]
    e["kind"] = rng.choice(kinds, n)
    e["dev"] = rng.choice([0x100, 0x101, 0x200], n)
    fid_of_dev = [{0x100: 0, 0x101: 1}, {0x100: 4}, {}, {0x100: 0, 0x101: 1, 0x200: 2}][seed]
    got = to_driver(e, fid_of_dev)
    drv = e[e["kind"] < HOST_BASE]
    assert len(got) == len(drv)
    want = np.zeros(len(drv), DRIVER_DTYPE)
    for i, row in enumerate(drv):
        for f, val in _ref_driver_row(row, fid_of_dev).items():
            want[f][i] = np.array(val).astype(np.int64).astype(want.dtype[f])
    for f in DRIVER_DTYPE.names or ():
        assert np.array_equal(got[f], want[f]), f
    assert got.tobytes() == want.tobytes()
    # one device, every event on it: the shortcut gives the same fids
    e["dev"] = 0x100
    assert set(to_driver(e, {0x100: 3})["fid"].tolist()) == {3}
    # the caller's mask gives the same records
    m = e["kind"] < HOST_BASE
    assert to_driver(e, {0x100: 3}, m).tobytes() == to_driver(e, {0x100: 3}).tobytes()
    assert to_host(e, m).tobytes() == to_host(e).tobytes()


def test_ringbuf_drains_in_slices() -> None:
    size, page = 1 << 15, 4096
    cons, prod, _ = _ring(size, page)
    r = RingReader(cons, prod, size, EV_DTYPE, page)
    evs = _ev(250)
    pos = 0
    for i in range(250):  # wraps the 32 KiB data area
        if i == 100:
            struct.pack_into("<Q", prod, 0, pos)
            assert len(r.drain()) == 100
        pos = _put(prod, size, page, pos, evs[i].tobytes(), DISCARD_BIT if i == 170 else 0)
    struct.pack_into("<Q", prod, 0, pos)
    assert r.pending_bytes() == 150 * stride_of(EV_DTYPE.itemsize)
    got = [r.drain(40) for _ in range(4)]
    assert [len(g) for g in got] == [40, 39, 40, 30]  # the discarded one is skipped
    a = np.concatenate([g["a"] for g in got]).tolist()
    assert a == [i for i in range(100, 250) if i != 170]
    assert r.pending_bytes() == 0 and r.records == 249 and r.discarded == 1
    assert len(r.drain()) == 0


def test_to_host_fields_per_kind() -> None:
    e = _ev(5)
    e["kind"] = [HOST_BASE + int(k) for k in (HostKind.SCHED_SWITCH, HostKind.BLOCK_COMPLETE,
                                              HostKind.NET_RX, HostKind.SCHED_WAKEUP)] + [
        int(DriverKind.SUBMIT)]
    e["x"], e["z"], e["v"] = [77, 8, 3, 9, 1], [-1, 5, 5, 5, 5], [6, 1, 6, 6, 6]
    e["a"], e["b"], e["d"] = [1, 4096, 9, 9, 9], [2, 512, 1500, 9, 9], [3, 700, 9, 9, 9]
    e["comm"] = b"python3"
    h = to_host(e)
    assert h["kind"].tolist() == [1, 4, 6, 2]
    assert h["next_pid"].tolist() == [77, 0, 0, 0] and h["prev_state"].tolist() == [-1, 1, 0, 0]
    assert h["dev"].tolist() == [0, 8, 3, 0] and h["size"].tolist() == [0, 512, 1500, 0]
    assert h["sector"].tolist() == [0, 4096, 0, 0] and h["dur_ns"].tolist() == [0, 700, 0, 0]
    assert h["t_ns"].tolist() == [1000, 1001, 1002, 1003]
    assert set(h["comm"].tolist()) == {b"python3"} and h.tobytes().count(b"python3") == 4


def test_log2l_no_loop_and_matches_floor_log2(tmp_path: Path) -> None:
    """The histogram slot function: floor(log2(v)) (0 for v <= 1), written without a
    loop, so clang has nothing to fail to unroll ("loop not unrolled" printed
    at every capture start).  Compiled with the host's C compiler and checked."""
    import re
    import shutil

    from tacc.bpftrace.bpfsrc import PRELUDE

    m = re.search(r"static __always_inline u8 log2l\(u64 v\)\n\{.*?\n\}\n", PRELUDE, re.S)
    assert m, "log2l not found in the BPF prelude"
    body = m.group(0)
    assert "for (" not in body and "while" not in body and "#pragma" not in body, body
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler on the host (setup installs build-essential)")
    src = tmp_path / "l.c"
    vals = [0, 1, 2, 3, 4, 5, 7, 8, 1023, 1024, 1025, (1 << 32) - 1, 1 << 32, (1 << 63) - 1,
            1 << 63, (1 << 64) - 1]
    head = ("#include <stdio.h>\n#include <stdint.h>\ntypedef uint8_t u8;\n"
            "typedef uint64_t u64;\n#undef __always_inline\n#define __always_inline inline\n")
    calls = "".join(f'printf("%u\\n", log2l({v}ULL));\n' for v in vals)
    src.write_text(head + body + "int main(void) {\n" + calls + "return 0; }\n")
    exe = tmp_path / "l"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-fno-builtin", "-o", str(exe), str(src)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert got == [max(v.bit_length() - 1, 0) for v in vals]
