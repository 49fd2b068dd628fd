"""The tracers vm_tracing.py compares, each started before and stopped after one phase,
and the per-job facts each kept, counted one way for every tool (docs/capture-format.md:
submit, start, end, bytes, status, tag, per command).

Facts, counted per job (key: function, context, seqno, tag: a closed file's context id is
reused by the next open, whose seqnos restart at 1) and per command:

* job facts: ``submit`` (a record of the submission), ``start`` (the job reached the
  ring), ``end`` (its completion), ``status`` (its completion status), ``tag`` (the user
  tag, on any of those records), ``bytes`` (the bytes its commands move: the taccd/
  accel-bpftrace submit record's ``size``; the tracepoints carry no byte count).
* command facts: per command, its own ``start``/``end`` device times, ``bytes``,
  ``status`` and ``tag`` (the device trace record; a tool without one keeps these for a
  one-command job from the job's completion event, which carries that command's device
  times, status and tag, but not its bytes).

``kept`` = job facts + command facts found; ``possible`` = 6 x jobs + 5 x commands of the
jobs the device completed while the tool was attached (sysfs counters).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

JOB_FACTS = ("submit", "start", "end", "status", "tag", "bytes")
CMD_FACTS = ("start", "end", "bytes", "status", "tag")
TRACEFS = Path("/sys/kernel/tracing")


def empty_facts() -> dict[str, int]:
    return {**{f"job_{f}": 0 for f in JOB_FACTS}, **{f"cmd_{f}": 0 for f in CMD_FACTS}}


def facts_total(f: dict[str, int]) -> int:
    return sum(v for k, v in f.items() if k.startswith(("job_", "cmd_")))


def capture_facts(path: Path) -> dict[str, int]:
    """Facts kept in a tacc capture (taccd or accel-bpftrace record)."""
    import numpy as np
    from tacc.capture import open_capture
    from tacc.capture.schema import DriverKind

    cap = open_capture(path)
    out = empty_facts()
    d = cap.read("driver", ["kind", "fid", "ctx", "job", "tag", "status"])
    # the tag too: a context id is reused by the next open, and its seqnos restart at 1
    key = np.unique(np.stack([d["fid"].astype(np.uint64), d["ctx"].astype(np.uint64),
                              d["job"].astype(np.uint64), d["tag"].astype(np.uint64)],
                             axis=1), axis=0, return_inverse=True)[1].ravel()
    sub = d["kind"] == int(DriverKind.SUBMIT)
    st = d["kind"] == int(DriverKind.JOB_START)
    dn = d["kind"] == int(DriverKind.JOB_DONE)
    out["job_submit"] = len(np.unique(key[sub]))
    out["job_bytes"] = out["job_submit"]  # the submit record's size (F_BYTES)
    out["job_start"] = len(np.unique(key[st]))
    out["job_end"] = len(np.unique(key[dn]))
    out["job_status"] = out["job_end"]
    out["job_tag"] = len(np.unique(key[sub | st | dn]))
    t = cap.read("device_trace", ["fid", "ctx", "job", "index"])
    n = len(np.unique((t["fid"].astype(np.uint64) << np.uint64(48))
                      ^ (t["ctx"].astype(np.uint64) << np.uint64(32))
                      ^ (t["job"].astype(np.uint64) << np.uint64(16))
                      ^ t["index"].astype(np.uint64)))
    for f in CMD_FACTS:
        out[f"cmd_{f}"] = n
    return out


_KV = re.compile(r"(\w+)=(0x[0-9a-fA-F]+|-?\d+)")


def _event_facts(lines: Any) -> dict[str, int]:
    """Facts from text lines ``... tacc_<event>: k=v k=v ...`` (perf script, bpftrace)."""
    Key = tuple[int, int, int, int]
    sub: set[Key] = set()
    st: set[Key] = set()
    dn: dict[Key, int] = {}
    ncmds: dict[Key, int] = {}
    for ln in lines:
        if "tacc_submit" in ln:
            which = sub
        elif "tacc_job_start" in ln:
            which = st
        elif "tacc_job_done" in ln:
            which = None
        else:
            continue
        kv = {k: int(v, 0) for k, v in _KV.findall(ln)}
        try:
            k = (kv["dev"], kv["ctx"], kv["seqno"], kv["tag"])  # contexts are reused
        except KeyError:
            continue
        if which is None:
            dn[k] = 1
        else:
            which.add(k)
            if which is sub:
                ncmds[k] = kv.get("ncmds", 0)
    out = empty_facts()
    out["job_submit"] = len(sub)
    out["job_start"] = len(st)
    out["job_end"] = out["job_status"] = len(dn)
    out["job_tag"] = len(sub | st | set(dn))
    one = sum(1 for k in dn if ncmds.get(k) == 1)  # one-command jobs with a completion
    for f in ("start", "end", "status", "tag"):
        out[f"cmd_{f}"] = one
    return out


class Tool:
    """One tracer process for one phase: start() returns once it records."""

    name = ""

    def __init__(self, tmp: Path, seq: int) -> None:
        self.tmp = tmp
        self.seq = seq
        self.p: subprocess.Popen[bytes] | None = None
        self.lost = 0
        self.note = ""

    @property
    def pid(self) -> int:
        assert self.p is not None
        return self.p.pid

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        assert self.p is not None
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(300)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(30)

    def facts(self) -> dict[str, int]:
        raise NotImplementedError

    def cleanup(self) -> None:
        subprocess.run(["rm", "-rf", str(self.out)], check=False)

    @property
    def out(self) -> Path:
        return self.tmp / f"{self.name}{self.seq}"


class Perf(Tool):
    """``perf record -e 'tacc:*' -a`` (Debian's linux-perf), enabled through a control
    FIFO once its events are open, so the phase starts when it records."""

    name = "perf"
    MMAP = "8M"  # per-CPU ring; perf's default (512 KiB) loses most of a NOP flood

    def __init__(self, tmp: Path, seq: int, mmap: str | None = MMAP) -> None:
        super().__init__(tmp, seq)
        # None: perf's default ring.  An 8 MiB ring holds a whole 1 s mlp phase, so perf
        # wrote nothing until the phase had ended (its CPU read 0.0 %): its cost was
        # not measured.  The smallest ring that loses nothing is the fair one.
        self.mmap = mmap

    def start(self) -> None:
        ctl, ack = self.tmp / f"perf{self.seq}.ctl", self.tmp / f"perf{self.seq}.ack"
        for f in (ctl, ack):
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        self.err = (self.tmp / f"perf{self.seq}.err").open("w+")
        self.p = subprocess.Popen(
            ["perf", "record", "-q", "-e", "tacc:*", "-a",
             *(["-m", self.mmap] if self.mmap else []), "-D", "-1",
             "--control", f"fifo:{ctl},{ack}", "-o", str(self.out)],
            stdout=subprocess.DEVNULL, stderr=self.err)
        wfd = os.open(ctl, os.O_WRONLY)  # blocks until perf opened its end
        rfd = os.open(ack, os.O_RDONLY)
        os.write(wfd, b"enable\n")
        got = os.read(rfd, 16)
        os.close(wfd)
        os.close(rfd)
        if not got.startswith(b"ack"):
            raise RuntimeError(f"perf record: no ack ({got!r})")

    def stop(self) -> None:
        super().stop()
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        m = re.search(r"lost (\d+) chunks", text) or re.search(r"LOST (\d+) events", text)
        if m:
            self.lost = int(m.group(1))

    def facts(self) -> dict[str, int]:
        p = subprocess.run(["perf", "script", "-i", str(self.out), "-F", "event,trace"],
                           capture_output=True, text=True, check=False)
        rep = subprocess.run(["perf", "report", "-i", str(self.out), "--stats"],
                             capture_output=True, text=True, check=False)
        m = re.search(r"LOST events:\s*(\d+)", rep.stdout) or \
            re.search(r"LOST\s+events\s*:\s*(\d+)", rep.stdout)
        if m:
            self.lost = max(self.lost, int(m.group(1)))
        return _event_facts(p.stdout.splitlines())

    def cleanup(self) -> None:
        for f in self.tmp.glob(f"perf{self.seq}*"):
            f.unlink(missing_ok=True)


def bpftrace_script(tracefs: Path = TRACEFS) -> str:
    """A bpftrace program printing every tacc tracepoint's fields, one line per event,
    in perf script's ``k=v`` style (generated from the live formats)."""
    from tacc.bpftrace.tpformat import list_system

    out = ['BEGIN { printf("ready\\n"); }']
    for fmt in list_system(tracefs, "tacc"):
        fs = [f for f in fmt.fields if not f.common and not f.array]
        spec = " ".join(f"{f.name}=%{'lld' if f.signed else 'llu'}" for f in fs)
        args = "".join(f", args->{f.name}" for f in fs)
        out.append(f'tracepoint:tacc:{fmt.name} {{ printf("%llu {fmt.name}: {spec}\\n", '
                   f'nsecs{args}); }}')
    return "\n".join(out) + "\n"


class Bpftrace(Tool):
    """Debian's bpftrace with a script printing every tacc event to a file (its default
    output buffering).  BEGIN runs before the probes are live, so start() submits marker
    NOP jobs until one shows in the file."""

    name = "bpftrace"
    MARK = 0x7FEE0000

    def __init__(self, tmp: Path, seq: int, node: str) -> None:
        super().__init__(tmp, seq)
        self.node = node

    def start(self) -> None:
        from tacc.runtime import uapi

        script = self.tmp / "tacc-record.bt"
        if not script.exists():
            script.write_text(bpftrace_script())
        self.err = (self.tmp / f"bt{self.seq}.err").open("w+")
        self.p = subprocess.Popen(["bpftrace", "-o", str(self.out), str(script)],
                                  stdout=subprocess.DEVNULL, stderr=self.err)
        fd = uapi.open_node(self.node)
        mark = f"tag={self.MARK}"
        try:
            end = time.monotonic() + 180
            while time.monotonic() < end and self.p.poll() is None:
                uapi.submit_nops(fd, 16, tag_base=self.MARK)
                try:
                    if mark in self.out.read_text(errors="replace"):
                        return
                except OSError:
                    pass
                time.sleep(0.1)
        finally:
            os.close(fd)
        self.err.seek(0)
        raise RuntimeError(f"bpftrace did not start: {self.err.read()[-500:]}")

    def stop(self) -> None:
        super().stop()
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        m = re.search(r"Lost (\d+) events", text)
        self.lost = int(m.group(1)) if m else 0
        if not m:
            try:
                m = re.search(r"Lost (\d+) events", self.out.read_text()[-4000:])
            except OSError:
                m = None
            self.lost = int(m.group(1)) if m else 0

    def facts(self) -> dict[str, int]:
        with self.out.open(errors="replace") as f:
            return _event_facts(f)

    def cleanup(self) -> None:
        super().cleanup()
        (self.tmp / f"bt{self.seq}.err").unlink(missing_ok=True)


class Record(Tool):
    """``accel-bpftrace record -o DIR`` (bcc; compiles its program at every start)."""

    name = "record"

    def __init__(self, tmp: Path, seq: int, binpath: Path) -> None:
        super().__init__(tmp, seq)
        self.binpath = binpath
        self.summary: dict[str, Any] = {}

    def start(self) -> None:
        self.err = (self.tmp / f"rec{self.seq}.err").open("w+")
        self.p = subprocess.Popen([str(self.binpath / "accel-bpftrace"), "record", "--json",
                                   "-o", str(self.out)],
                                  stdout=subprocess.PIPE, stderr=self.err)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            self.err.seek(0)
            if "Ctrl-C to end" in self.err.read():
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        self.err.seek(0)
        raise RuntimeError(f"accel-bpftrace record did not start: {self.err.read()[-500:]}")

    def stop(self) -> None:
        assert self.p is not None
        self.p.send_signal(signal.SIGINT)
        so, _ = self.p.communicate(timeout=300)
        self.err.close()
        import json
        for ln in so.decode().splitlines():
            try:
                obj = json.loads(ln)
            except ValueError:
                continue
            if obj.get("event") == "summary":
                self.lost = int(obj.get("lost", 0))
            elif obj.get("event") == "record":
                self.summary = obj

    def facts(self) -> dict[str, int]:
        return capture_facts(self.out)

    def cleanup(self) -> None:
        super().cleanup()
        (self.tmp / f"rec{self.seq}.err").unlink(missing_ok=True)


def drops_total(drops: dict[str, Any]) -> int:
    tot = 0
    for v in drops.values():
        if isinstance(v, dict):
            tot += drops_total(v)
        elif isinstance(v, int | float):
            tot += int(v)
    return tot


def merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for d in (a, b):
        for k, v in d.items():
            out[k] += v
    return dict(out)
