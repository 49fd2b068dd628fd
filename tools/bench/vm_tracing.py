#!/usr/bin/env python3
"""In-guest: NOP-job throughput with nothing attached, taccd always-on, a taccd capture
running and ``accel-bpftrace snoop``, as ratios to "nothing" measured in one run.

Runs inside the VM as root (``make bench BENCH=tracing``).  The workload is one process
submitting jobs of one NOP command through DRM_IOCTL_TACC_SUBMIT (waiting only when the
queue is full, and at the end of each batch).  Phases are interleaved in rounds so that
drift (other VMs on the host) hits every mode alike; the figure per mode is the median
of its rounds.  taccd runs for the whole benchmark: for "nothing" it is stopped with
SIGSTOP (an idle, stopped process costs nothing), for "always-on" it runs (1 Hz sysfs
sampling), for "capture" a capture is started and stopped around the phase (its BPF
program is compiled on the first capture only).  ``snoop`` is one process started once
(one compile), measured after the interleaved rounds, bracketed by two "nothing" phases.

Where the cost goes: the CPU time the tracer process used during each phase (utime +
stime from /proc), the events it recorded and the drops.

    vm_tracing.py [--seconds 2] [--rounds 3] [--batch 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))

from tacc.daemon import protocol, uapi  # noqa: E402
from tacc.daemon.devices import discover  # noqa: E402

BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process (and its reaped children), seconds."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in f[11:15]) / CLK_TCK


def jobs_completed(fn_sysfs: Path) -> int:
    return int((fn_sysfs / "counters" / "jobs_completed").read_text())


def measure(node: str, seconds: float, batch: int) -> tuple[float, int]:
    """NOP jobs per second for ``seconds`` (wall, CLOCK_MONOTONIC); returns (rate, jobs)."""
    fd = uapi.open_node(node)
    try:
        uapi.submit_nops(fd, 8)  # warm
        n = 0
        t0 = time.monotonic()
        end = t0 + seconds
        while time.monotonic() < end:
            uapi.submit_nops(fd, batch, ncmds=1, tag_base=0x7B000000 + n)
            n += batch
        dt = time.monotonic() - t0
    finally:
        os.close(fd)
    return n / dt, n


class Taccd:
    def __init__(self, tmp: Path) -> None:
        self.sock = str(tmp / "taccd.sock")
        self.tmp = tmp
        self.log = tmp / "taccd.log"
        with self.log.open("w") as log:  # a file: an unread pipe could block taccd
            self.p = subprocess.Popen([str(BIN / "taccd"), "-f", "--socket", self.sock,
                                       "--capture-root", str(tmp)], stderr=log)
        for _ in range(600):
            if Path(self.sock).exists():
                break
            if self.p.poll() is not None:
                raise SystemExit(f"vm_tracing: taccd exited: {self.log.read_text()}")
            time.sleep(0.1)
        self.ncap = 0

    def req(self, obj: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
        r = protocol.request(obj, self.sock, timeout=timeout)
        if not r.get("ok"):
            raise SystemExit(f"vm_tracing: taccd: {r.get('error')}")
        return r

    def pause(self) -> None:
        os.kill(self.p.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.p.pid, signal.SIGCONT)

    def start(self) -> str:
        self.ncap += 1
        out = str(self.tmp / f"cap{self.ncap}")
        # capture defaults except the host events, which are about other processes than
        # this benchmark's; the driver events, device trace, counters, clock all run
        self.req({"cmd": "start", "output": out, "options": {}})
        return out

    def stop(self) -> dict[str, Any]:
        return self.req({"cmd": "stop"})["summary"]

    def close(self) -> None:
        self.resume()
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="jobs between waits")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("vm_tracing: must run as root inside the VM", file=sys.stderr)
        return 1
    fns = [f for f in discover() if f.accel]
    if not fns:
        print("vm_tracing: no tacc device", file=sys.stderr)
        return 1
    node, sysfs = fns[0].accel, fns[0].sysfs
    res: dict[str, list[float]] = {"nothing": [], "always-on": [], "capture": [], "snoop": []}
    cpu: dict[str, list[float]] = {k: [] for k in res}
    extra: dict[str, Any] = {"captures": []}
    tmp = Path(tempfile.mkdtemp(prefix="vm-tracing-"))
    d = Taccd(tmp)
    try:
        # compile the capture program once, outside any measured phase
        t = time.monotonic()
        d.start()
        d.stop()
        extra["capture_first_start_s"] = time.monotonic() - t
        for r in range(args.rounds):
            for mode in ("nothing", "always-on", "capture"):
                if mode == "nothing":
                    d.pause()
                elif mode == "capture":
                    d.start()
                c0 = cpu_s(d.p.pid)
                j0 = jobs_completed(sysfs)
                rate, n = measure(node, args.seconds, args.batch)
                cpu[mode].append((cpu_s(d.p.pid) - c0) / args.seconds)
                if jobs_completed(sysfs) - j0 < n:
                    print(f"vm_tracing: {mode}: device completed fewer jobs than submitted",
                          file=sys.stderr)
                if mode == "nothing":
                    d.resume()
                elif mode == "capture":
                    s = d.stop()
                    extra["captures"].append({"jobs": n, "records": s.get("records", {}),
                                              "drops": s.get("drops", {})})
                res[mode].append(rate)
                print(f"  round {r + 1} {mode:<10} {rate:10.0f} jobs/s", flush=True)
        # snoop: started once, bracketed by "nothing"
        d.pause()
        rate, _ = measure(node, args.seconds, args.batch)
        res["nothing"].append(rate)
        t = time.monotonic()
        sn = subprocess.Popen([str(BIN / "accel-bpftrace"), "snoop", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert sn.stderr is not None and sn.stdout is not None
        err = ""
        while "Ctrl-C to end" not in err:  # the ready line: probes attached
            ln = sn.stderr.readline()
            if not ln:
                raise SystemExit(f"vm_tracing: accel-bpftrace snoop failed: {err}")
            err += ln
        extra["snoop_start_s"] = time.monotonic() - t
        lines = 0

        last = [""]

        def reader() -> None:
            nonlocal lines
            assert sn.stdout is not None
            for ln in sn.stdout:
                lines += 1
                last[0] = ln

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        for _ in range(args.rounds):
            c0 = cpu_s(sn.pid)
            rate, n = measure(node, args.seconds, args.batch)
            cpu["snoop"].append((cpu_s(sn.pid) - c0) / args.seconds)
            res["snoop"].append(rate)
            print(f"  snoop      {rate:10.0f} jobs/s", flush=True)
        sn.send_signal(signal.SIGINT)
        sn.wait(120)
        th.join(30)
        err += sn.stderr.read()
        extra["snoop_lines"] = lines
        try:
            extra["snoop_summary"] = json.loads(last[0])  # {"event": "summary", ...}
        except ValueError:
            extra["snoop_summary"] = err.strip()[-300:]
        d.pause()
        rate, _ = measure(node, args.seconds, args.batch)
        res["nothing"].append(rate)
    finally:
        d.close()
    base = statistics.median(res["nothing"])
    rows = []
    for mode, rates in res.items():
        med = statistics.median(rates) if rates else 0.0
        rows.append({"mode": mode, "jobs_per_s": med, "ratio": med / base if base else 0.0,
                     "runs": rates, "tracer_cpu_share": statistics.median(cpu[mode])
                     if cpu[mode] else 0.0})
    print(f"\nNOP-job throughput, {args.seconds:g} s per phase, medians of "
          f"{args.rounds}+ rounds (1 NOP per job, wait every {args.batch})")
    print(f"{'mode':<10} {'jobs/s':>10} {'x nothing':>10} {'tracer CPU':>11}")
    for row in rows:
        print(f"{row['mode']:<10} {row['jobs_per_s']:10.0f} {row['ratio']:10.3f} "
              f"{row['tracer_cpu_share'] * 100:10.1f}%")
    for c in extra["captures"]:
        print(f"capture: {c['jobs']} jobs, records {c['records']}, drops {c['drops']}")
    print(f"snoop: {extra['snoop_lines']} lines; {extra['snoop_summary']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "tracing", "seconds": args.seconds,
                                               "rounds": args.rounds, "batch": args.batch,
                                               "results": rows, **extra}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
