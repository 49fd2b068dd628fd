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

A realistic row besides the NOP flood: the ``mlp`` workload (tacc.workloads, double-
buffered MLP inference through the runtime: API calls, copies, GEMMs), the same number of
batches in every phase (calibrated once to last about ``--seconds``), throughput in
batches/s (the workload's measured section, ``Result.wall_ns``) with nothing vs a capture,
interleaved in the same rounds.

Where the cost goes: the CPU time the tracer process used during each phase (utime +
stime from /proc), the events it recorded and the drops (tools/bench/prof_capture.py
breaks taccd's time down by stage).

    vm_tracing.py [--seconds 2] [--rounds 3] [--batch 64] [--no-mlp] [--json OUT]
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


class Mlp:
    """The ``mlp`` workload on one runtime context, a fixed number of batches per run."""

    def __init__(self, seconds: float) -> None:
        from tacc.runtime import Context

        self.ctx = Context()
        self.run(8)  # warm: first-call costs (imports, BO caches)
        per = self.run(16)[1] / 16
        self.batches = max(16, int(seconds / per) // 8 * 8)

    def run(self, batches: int | None = None) -> tuple[float, float]:
        """(batches/s over the measured section, its wall seconds)."""
        from tacc.workloads import run

        nb = batches or self.batches
        r = run("mlp", self.ctx, False, batches=nb, check=False)
        wall = r.wall_ns / 1e9
        return nb / wall, wall

    def close(self) -> None:
        self.ctx.close()


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


def table(res: dict[str, list[float]], cpu: dict[str, list[float]], key: str, unit: str,
          fmt: str, title: str) -> list[dict[str, Any]]:
    """Median rate per mode, its ratio to "nothing" and the tracer's CPU share: rows for
    the JSON output, printed as a table under ``title``."""
    base = statistics.median(res["nothing"])
    rows = []
    for mode, rates in res.items():
        med = statistics.median(rates) if rates else 0.0
        rows.append({"mode": mode, key: med, "ratio": med / base if base else 0.0,
                     "runs": rates,
                     "tracer_cpu_share": statistics.median(cpu[mode]) if cpu[mode] else 0.0})
    print(f"\n{title}")
    print(f"{'mode':<10} {unit:>10} {'x nothing':>10} {'tracer CPU':>11}")
    for row in rows:
        print(f"{row['mode']:<10} {row[key]:10{fmt}} {row['ratio']:10.3f} "
              f"{row['tracer_cpu_share'] * 100:10.1f}%")
    return rows


class Taccd:
    def __init__(self, tmp: Path) -> None:
        from tacc.testing.taccd import start_taccd

        self.sock = str(tmp / "taccd.sock")
        self.tmp = tmp
        try:  # not verbose: its log lines would be part of the cost measured
            self.p = start_taccd(Path(self.sock), tmp, timeout=60.0, verbose=False)
        except RuntimeError as exc:
            raise SystemExit(f"vm_tracing: {exc}") from None
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
    ap.add_argument("--no-mlp", action="store_true", help="NOP flood only")
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
    mres: dict[str, list[float]] = {"nothing": [], "capture": []}
    mcpu: dict[str, list[float]] = {k: [] for k in mres}
    extra: dict[str, Any] = {"captures": [], "mlp_captures": []}
    tmp = Path(tempfile.mkdtemp(prefix="vm-tracing-"))
    d = Taccd(tmp)
    mlp = None if args.no_mlp else Mlp(args.seconds)
    if mlp is not None:
        extra["mlp_batches"] = mlp.batches
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
            for mode in ("nothing", "capture") if mlp is not None else ():
                assert mlp is not None
                if mode == "nothing":
                    d.pause()
                else:
                    d.start()
                c0, t0 = cpu_s(d.p.pid), time.monotonic()
                rate, _wall = mlp.run()
                mcpu[mode].append((cpu_s(d.p.pid) - c0) / (time.monotonic() - t0))
                if mode == "nothing":
                    d.resume()
                else:
                    s = d.stop()
                    extra["mlp_captures"].append({"batches": mlp.batches,
                                                  "records": s.get("records", {}),
                                                  "drops": s.get("drops", {})})
                mres[mode].append(rate)
                print(f"  round {r + 1} mlp {mode:<6} {rate:10.1f} batches/s", flush=True)
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
        if mlp is not None:
            mlp.close()
    rows = table(res, cpu, "jobs_per_s", "jobs/s", ".0f",
                 f"NOP-job throughput, {args.seconds:g} s per phase, medians of "
                 f"{args.rounds}+ rounds (1 NOP per job, wait every {args.batch})")
    for c in extra["captures"]:
        print(f"capture: {c['jobs']} jobs, records {c['records']}, drops {c['drops']}")
    print(f"snoop: {extra['snoop_lines']} lines; {extra['snoop_summary']}")
    mrows = []
    if mlp is not None and mres["nothing"]:
        mrows = table(mres, mcpu, "batches_per_s", "batches/s", ".1f",
                      f"mlp throughput (tacc.workloads mlp, {mlp.batches} batches of 256 per "
                      f"phase), medians of {args.rounds} rounds")
        for c in extra["mlp_captures"]:
            print(f"mlp capture: {c['batches']} batches, records {c['records']}, "
                  f"drops {c['drops']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "tracing", "seconds": args.seconds,
                                               "rounds": args.rounds, "batch": args.batch,
                                               "results": rows, "mlp_results": mrows,
                                               **extra}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
