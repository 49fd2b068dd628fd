#!/usr/bin/env python3
"""In-guest: the cost of every tracer of the tacc driver on two workloads, as ratios to
"nothing" measured side by side in one run.

Runs inside the VM as root (``make bench BENCH=tracing``).  Workloads: ``nop`` (one
process submitting jobs of one NOP command through DRM_IOCTL_TACC_SUBMIT, waiting only
when the queue is full and at the end of each batch; jobs/s) and ``mlp``
(tacc.workloads mlp: double-buffered MLP inference through the runtime, the same number of
batches in every phase; batches/s over the workload's measured section).  Modes:

  nothing     taccd SIGSTOPped (a stopped process costs nothing), no tracer
  always-on   taccd running (1 Hz sysfs sampling, no BPF)
  taccd       a taccd capture (default options but ``counters_source: device``: the
              device samples the counters, so a late loop tick loses none) around the phase
  taccd-jobs  a taccd capture of perf's per-job facts: the driver's job events and the
              device trace (every per-job and per-command fact), counters and clock
              pairs; no runtime API records, no sched/host events and no IOCTL records
              (``api: false, host_events: false, ioctl_events: false``, device counters)
  record      ``accel-bpftrace record`` (started for the phase: one bcc compile each)
  perf        ``perf record -e 'tacc:*' -a`` (Debian's linux-perf)
  bpftrace    a bpftrace script printing every tacc event to a file (peers.py)

The baseline (tools/bench/diag_baseline.py shows the cause): the old
run put "nothing" right after an ``mlp`` phase in every round, and the benchmark
process's garbage collector then scanned the objects mlp left (gen-2 collections inside
the measured loop), so "nothing" read slower than "always-on".  Now every phase starts
from the same state: gc.collect() then the collector off for the measured section (the
NOP loop makes no cycles; mlp's phases all pay the same), the device resumed by a warm
submission (runtime-PM resumes are counted per phase and must be 0 inside it), and the
mode order rotates each round (round r starts at mode r), so every mode follows every
other equally often.  The figure per mode is the median over rounds with its 95 %
order-statistics interval; ratios carry a paired-bootstrap 95 % interval (benchstats.py).

Per phase: the tracer's CPU share (utime + stime from /proc), its drops, and the per-job
facts it kept (peers.py: counted the same way for every tool).

    vm_tracing.py [--seconds 1] [--rounds 9] [--batch 64] [--workloads nop,mlp]
                  [--modes nothing,always-on,taccd,record,perf,bpftrace] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))

from tacc.daemon import protocol  # noqa: E402
from tacc.devices import discover  # noqa: E402
from tacc.runtime import uapi  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402
from benchstats import median_ci, ratio_ci  # noqa: E402

BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU time of a process, seconds: its threads' time on a CPU from
    /proc/PID/task/*/schedstat (the scheduler's ns, exact) plus its reaped children's
    utime + stime.  utime + stime alone are sampled at the tick, and a daemon whose
    timer wakes it right after a tick and sleeps again before the next is hardly ever
    running at one: taccd's share read about half of what the phases' rates showed."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ns = 0
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                ns += int((t / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pass  # a thread that just exited
    except OSError:
        return 0.0
    return ns / 1e9 + sum(int(x) for x in f[13:15]) / CLK_TCK


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


def guest_function(prog: str) -> Any:
    """The first tacc function with an accel node, for a benchmark run as root in the
    guest; exits with status 1 and one line naming ``prog`` otherwise."""
    if os.geteuid() != 0:
        raise SystemExit(f"{prog}: must run as root inside the VM")
    fns = [f for f in discover() if f.accel]
    if not fns:
        raise SystemExit(f"{prog}: no tacc device")
    return fns[0]


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

    def start(self, options: dict[str, Any] | None = None) -> str:
        self.ncap += 1
        out = str(self.tmp / f"cap{self.ncap}")
        # capture defaults except the host events, which are about other processes than
        # this benchmark's; the driver events, device trace, counters, clock all run
        self.req({"cmd": "start", "output": out, "options": options or {}})
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



MODES = ("nothing", "always-on", "taccd", "taccd-jobs", "record", "perf", "bpftrace")
CAPTURE_OPTIONS: dict[str, dict[str, Any]] = {
    # counters sampled by the device (a late host tick is a counted drop; these phases
    # keep the device busy, so its PM is not what is measured)
    "taccd": {"counters_source": "device"},
    "taccd-jobs": {"api": False, "host_events": False, "ioctl_events": False,
                   "counters_source": "device"}}
PEERS = ("record", "perf", "bpftrace")
WORKLOADS = ("nop", "mlp")


def table(rows: list[dict[str, Any]], unit: str, title: str) -> None:
    print(f"\n{title}")
    print(f"{'mode':<10} {unit:>10} {'95% CI':>19} {'x nothing':>9} {'95% CI':>15} "
          f"{'tracer CPU':>10} {'facts kept':>14} {'drops':>7}")
    for r in rows:
        print(f"{r['mode']:<10} {r['median']:10.1f} [{r['ci'][0]:8.1f},{r['ci'][1]:8.1f}] "
              f"{r['ratio']:9.3f} [{r['ratio_ci'][0]:6.3f},{r['ratio_ci'][1]:6.3f}] "
              f"{r['tracer_cpu_share'] * 100:9.1f}% "
              f"{r['facts_kept_share'] * 100:13.1f}% {r['drops']:7d}")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per mode: median and CI of the rate, ratio to nothing (paired by round) and CI,
    median tracer CPU share, facts kept over possible (summed), drops (summed)."""
    base = [r["rate"] for r in runs["nothing"]]
    rows = []
    for mode, rs in runs.items():
        if not rs:
            continue
        rates = [r["rate"] for r in rs]
        med, lo, hi = median_ci(rates)
        rat, rlo, rhi = ratio_ci(rates, base)
        kept = sum(peers.facts_total(r["facts"]) for r in rs if r.get("facts"))
        poss = sum(r.get("possible", 0) for r in rs if r.get("facts"))
        cpu = sorted(r["cpu"] for r in rs)
        rows.append({"mode": mode, "median": med, "ci": [lo, hi], "ratio": rat,
                     "ratio_ci": [rlo, rhi], "runs": rates,
                     "tracer_cpu_share": cpu[len(cpu) // 2],
                     "facts_kept": kept, "facts_possible": poss,
                     "facts_kept_share": kept / poss if poss else 0.0,
                     "facts": _sum_facts([r["facts"] for r in rs if r.get("facts")]),
                     "drops": sum(r.get("drops", 0) for r in rs),
                     "pm_resumes_in_phase": sum(r.get("pm_resumes", 0) for r in rs),
                     "gc_in_phase": sum(r.get("gc", 0) for r in rs)})
    return rows


def _sum_facts(fs: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in fs:
        out = peers.merge(out, f)
    return out


class Phase:
    """One measured phase: the tracer of ``mode`` attached around the workload."""

    def __init__(self, d: Taccd, tmp: Path, sysfs: Path, node: str) -> None:
        self.d = d
        self.node = node
        self.tmp = tmp
        self.sysfs = sysfs
        self.seq = 0
        self.gcs = 0
        gc.callbacks.append(self._gc_cb)

    def _gc_cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self.gcs += 1

    def _pm(self) -> int:
        try:
            return int((self.sysfs / "tacc" / "pm_resumes").read_text())
        except (OSError, ValueError):
            return 0

    def _counts(self) -> tuple[int, int]:
        c = self.sysfs / "counters"
        return int((c / "jobs_completed").read_text()), int((c / "cmds_completed").read_text())

    def run(self, mode: str, work: Any, facts: bool = True) -> dict[str, Any]:
        self.seq += 1
        tool: peers.Tool | None = None
        if mode != "always-on" and mode not in CAPTURE_OPTIONS:
            self.d.pause()
        if mode in CAPTURE_OPTIONS:
            cap = self.d.start(CAPTURE_OPTIONS[mode])
        elif mode == "perf":
            # the NOP flood needs an 8 MiB ring not to lose events; mlp's rate fits
            # perf's default one, which makes perf write during the phase (peers.Perf)
            tool = peers.Perf(self.tmp, self.seq,
                              peers.Perf.MMAP if work.name == "nop" else None)
        elif mode == "bpftrace":
            tool = peers.Bpftrace(self.tmp, self.seq, self.node)
        elif mode == "record":
            tool = peers.Record(self.tmp, self.seq, BIN)
        if tool is not None:
            tool.start()
        pid = tool.pid if tool is not None else self.d.p.pid
        j0, c0n = self._counts()
        gc.collect()
        gc.disable()
        self.gcs = 0
        work.warm()
        pm0 = self._pm()
        c0, t0 = cpu_s(pid), time.monotonic()
        rate = work.run()
        dt = time.monotonic() - t0
        cpu = (cpu_s(pid) - c0) / dt if mode != "nothing" else 0.0
        lat = work.latency() if hasattr(work, "latency") else None
        pm1 = self._pm()
        gcs = self.gcs
        gc.enable()
        out: dict[str, Any] = {"mode": mode, "rate": rate, "cpu": cpu, "pm_resumes": pm1 - pm0,
                               "gc": gcs, "drops": 0}
        if lat is not None:
            out["lat_us"] = lat
        if mode in CAPTURE_OPTIONS:
            s = self.d.stop()
            out["records"] = s.get("records", {})
            out["drops"] = peers.drops_total(s.get("drops", {}))
            out["drops_by_source"] = s.get("drops", {})
        elif tool is not None:
            tool.stop()
        j1, c1n = self._counts()
        out["jobs"], out["cmds"] = j1 - j0, c1n - c0n
        if mode in CAPTURE_OPTIONS:
            if facts:
                out["facts"] = peers.capture_facts(Path(cap))
            subprocess.run(["rm", "-rf", cap], check=False)
        elif tool is not None:
            if facts:
                out["facts"] = tool.facts()
            out["drops"] = tool.lost
            tool.cleanup()
        if "facts" in out:
            out["possible"] = 6 * out["jobs"] + 5 * out["cmds"]
        if mode != "always-on" and mode not in CAPTURE_OPTIONS:
            self.d.resume()
        return out


class NopWork:
    name = "nop"

    def __init__(self, node: str, seconds: float, batch: int) -> None:
        self.node, self.seconds, self.batch = node, seconds, batch

    def warm(self) -> None:
        fd = uapi.open_node(self.node)
        uapi.submit_nops(fd, 8)
        os.close(fd)

    def run(self) -> float:
        return measure(self.node, self.seconds, self.batch)[0]

    def latency(self, n: int = 200) -> list[float]:
        """Submit -> completion of ``n`` single NOP jobs, µs (guest clock), the tracer on."""
        fd = uapi.open_node(self.node)
        out = []
        try:
            for i in range(n):
                t = time.monotonic_ns()
                uapi.submit_nops(fd, 1, tag_base=0x7D000000 + i)
                out.append((time.monotonic_ns() - t) / 1e3)
        finally:
            os.close(fd)
        return out


class MlpWork:
    name = "mlp"

    def __init__(self, seconds: float) -> None:
        self.m = Mlp(seconds)

    def warm(self) -> None:
        self.m.run(2)

    def run(self) -> float:
        return self.m.run()[0]


LOG_LINE = re.compile(r"^\s*round (\d+) (\w+) ([\w-]+)\s+([\d.]+)/s cpu\s+([\d.]+)% "
                      r"drops (\d+)(?: facts (\d+)/(\d+))? pm (\d+) gc (\d+)")


def from_log(path: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The phases of a run from its printed lines (a run stopped before its JSON was
    written: the rounds it finished are all there, one line per phase)."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for ln in path.read_text(errors="replace").replace("\r", "").splitlines():
        m = LOG_LINE.match(ln)
        if not m:
            continue
        r, w, mode, rate, cpu, drops, kept, poss, pm, gcs = m.groups()
        res: dict[str, Any] = {"round": int(r) - 1, "mode": mode, "rate": float(rate),
                               "cpu": float(cpu) / 100, "drops": int(drops),
                               "pm_resumes": int(pm), "gc": int(gcs)}
        if kept is not None:
            res["facts"] = {"job_and_cmd_total": int(kept)}
            res["possible"] = int(poss)
        runs.setdefault(w, {}).setdefault(mode, []).append(res)
    for w in runs:  # "nothing" first: ratios are to it
        runs[w] = {"nothing": runs[w].get("nothing", []),
                   **{m: v for m, v in runs[w].items() if m != "nothing"}}
    return runs


def report_log(path: Path, out: str | None) -> int:
    runs = from_log(path)
    if not runs:
        print(f"vm_tracing: {path}: no phase lines", file=sys.stderr)
        return 1
    results = {w: summarize(r) for w, r in runs.items()}
    for w, rows in results.items():
        n = max(len(v) for v in runs[w].values())
        table(rows, "jobs/s" if w == "nop" else "batches/s",
              f"{w}: from {path.name}, medians of up to {n} interleaved rounds, 95 % CIs")
    if out:
        Path(out).write_text(json.dumps({"bench": "tracing", "from_log": str(path),
                                         "results": results, "runs": runs}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-log", type=Path, default=None,
                    help="summarize the phase lines of a run's log instead of running")
    ap.add_argument("--seconds", type=float, default=1.0, help="per phase")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch", type=int, default=64, help="jobs between waits")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--peer-rounds", type=int, default=None,
                    help="rounds that include record/perf/bpftrace (each starts a tracer "
                         "process per phase: minutes under TCG on a loaded host); "
                         "default: every round")
    ap.add_argument("--mlp-modes", default=None, help="modes for mlp (default: --modes)")
    ap.add_argument("--mlp-rounds", type=int, default=None,
                    help="rounds that include the mlp workload (default: every round)")
    ap.add_argument("--facts-rounds", type=int, default=3,
                    help="count the facts each tool kept in the first N rounds (parsing "
                         "perf's and bpftrace's output is slow under TCG); drops: every round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.from_log is not None:
        return report_log(args.from_log, args.json)
    fn = guest_function("vm_tracing")
    modes = [m for m in args.modes.split(",") if m]
    wls = [w for w in args.workloads.split(",") if w]
    bad = [m for m in modes if m not in MODES] + [w for w in wls if w not in WORKLOADS]
    if bad or "nothing" not in modes:
        print(f"vm_tracing: bad --modes/--workloads {bad} (need nothing)", file=sys.stderr)
        return 2
    node, sysfs = fn.accel, fn.sysfs
    tmp = Path(tempfile.mkdtemp(prefix="vm-tracing-"))
    d = Taccd(tmp)
    works: dict[str, Any] = {}
    if "nop" in wls:
        works["nop"] = NopWork(node, args.seconds, args.batch)
    if "mlp" in wls:
        works["mlp"] = MlpWork(args.seconds)
    wmodes = {w: modes for w in works}
    if args.mlp_modes:
        wmodes["mlp"] = [m for m in MODES if m in args.mlp_modes.split(",")]
        if "nothing" not in wmodes["mlp"]:
            print("vm_tracing: --mlp-modes needs nothing", file=sys.stderr)
            return 2
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {m: [] for m in wmodes[w]} for w in works}
    extra: dict[str, Any] = {}
    if "mlp" in works:
        extra["mlp_batches"] = works["mlp"].m.batches
    ph = Phase(d, tmp, sysfs, node)
    try:
        t = time.monotonic()
        d.start()  # compile the capture program once, outside any measured phase
        d.stop()
        extra["capture_first_start_s"] = time.monotonic() - t
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for w, work in works.items():
                if w == "mlp" and args.mlp_rounds is not None and r >= args.mlp_rounds:
                    continue
                for mode in order:
                    if mode not in wmodes[w]:
                        continue
                    if (mode in PEERS and args.peer_rounds is not None
                            and r >= args.peer_rounds):
                        continue
                    res = ph.run(mode, work, facts=r < args.facts_rounds)
                    res["round"] = r
                    runs[w][mode].append(res)
                    kept = (f" facts {peers.facts_total(res['facts'])}/{res['possible']}"
                            if "facts" in res else "")
                    print(f"  round {r + 1} {w} {mode:<10} {res['rate']:10.1f}/s cpu "
                          f"{res['cpu'] * 100:5.1f}% drops {res['drops']}{kept} "
                          f"pm {res['pm_resumes']} gc {res['gc']}"
                          + (f" drops_by {json.dumps(res['drops_by_source'])}"
                             if res.get("drops") and "drops_by_source" in res else ""),
                          flush=True)
    finally:
        d.close()
        if "mlp" in works:
            works["mlp"].m.close()
    results = {w: summarize(runs[w]) for w in works}
    if "nop" in runs:  # report.py's latency histograms, one per mode
        extra["latency_us"] = {m: [x for r in rs for x in r.get("lat_us", [])]
                               for m, rs in runs["nop"].items()}
        for rs in runs["nop"].values():
            for r in rs:
                r.pop("lat_us", None)
    for w, rows in results.items():
        unit = "jobs/s" if w == "nop" else "batches/s"
        table(rows, unit, f"{w}: {args.seconds:g} s per phase, medians of {args.rounds} "
                          f"interleaved rounds, 95 % CIs")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"bench": "tracing", "seconds": args.seconds, "rounds": args.rounds,
             "batch": args.batch, "results": results, "runs": runs, **extra}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
