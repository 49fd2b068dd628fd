#!/usr/bin/env python3
"""In-guest: what a capture costs the traced process, stage by stage.

The NOP flood of vm_tracing.py (one process, 1-NOP jobs) with, in turn:

  nothing        no program attached
  driver         the capture's BPF program in ``record`` mode (every driver tracepoint
                 it attaches, records to its ring buffer; the ring holds a whole phase, so
                 no consumer runs during it)
  driver+sched   the same plus the scheduler events of the traced process (F_HOST)
  doorbell       the driver set plus tacc_doorbell (what captures attached before this
                 issue: a second event per job with the facts of tacc_job_start)
  submit-kprobe  the driver set plus the kprobe the capture used to attach on
                 tacc_submit_ioctl and its user-memory read of up to 32 commands in the
                 tacc_submit handler (removed: the driver's tracepoint carries the bytes)

Modes rotate per round (as vm_tracing.py); the cost of a stage is the median over rounds
of 1e6/rate(mode) - 1e6/rate(nothing), µs per job, with the paired ratio's 95 % CI.  BPF
run time per handler comes from the kernel (kernel.bpf_stats_enabled: run_time_ns /
run_cnt of each attached program, bpftool), ns per event.

    vm_stages.py [--seconds 1] [--rounds 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchstats import median_ci, ratio_ci  # noqa: E402
from vm_tracing import guest_function, measure  # noqa: E402  (the same NOP flood)

MODES = ("nothing", "driver", "driver+sched", "doorbell", "submit-kprobe")
# the pre-issue-18 submit kprobe, as the capture program had it (bpfsrc.py before)
OLD_KPROBE = r"""
#include <uapi/linux/ptrace.h>
BPF_HASH(submit_arg, u32, u64, 4096);
BPF_ARRAY(sink, u64, 1);
int kp_submit_ioctl(struct pt_regs *ctx)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 data = PT_REGS_PARM2(ctx);
	submit_arg.update(&tid, &data);
	return 0;
}
RAW_TRACEPOINT_PROBE(tacc_submit)
{
	u32 tid = (u32)bpf_get_current_pid_tgid(), z = 0;
	u64 *data = submit_arg.lookup(&tid);
	u64 cmds = 0, bytes = 0, *s;
	u32 n = 0;
	if (!data)
		return 0;
	bpf_probe_read_kernel(&cmds, 8, (void *)*data);
	bpf_probe_read_kernel(&n, 4, (void *)(*data + 16));
	for (int i = 0; i < 32; i++) {
		u32 op = 0;
		u64 sz = 0;
		if (i >= n)
			break;
		bpf_probe_read_user(&op, 4, (void *)(cmds + i * 128));
		if (op >= 1 && op <= 3) {
			bpf_probe_read_user(&sz, 8, (void *)(cmds + i * 128 + 64));
			bytes += sz;
		}
	}
	submit_arg.delete(&tid);
	s = sink.lookup(&z);
	if (s)
		*s += bytes;
	return 0;
}
"""


def prog_stats() -> dict[str, tuple[int, int]]:
    """name -> (run_time_ns, run_cnt) of every loaded BPF program (bpftool)."""
    r = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True,
                       check=False)
    try:
        progs = json.loads(r.stdout)
    except ValueError:
        return {}
    out: dict[str, tuple[int, int]] = {}
    for p in progs:
        name = p.get("name", "")
        t, c = int(p.get("run_time_ns", 0)), int(p.get("run_cnt", 0))
        a, b = out.get(name, (0, 0))
        out[name] = (a + t, b + c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    node = guest_function("vm_stages").accel
    from bcc import BPF
    from tacc.bpftrace.preflight import require_tracefs
    from tacc.bpftrace.program import Program

    prog = Program(require_tracefs(), rb_pages=8192, host=True)
    old = BPF(text=OLD_KPROBE, cflags=["-w"])
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    handler_ns: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    try:
        for r in range(a.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                if mode != "nothing":
                    prog.attach("record", host=mode == "driver+sched", autotrace=True)
                    prog.trace_pids([os.getpid()])
                    if mode == "doorbell":
                        prog._tp("tacc", "tacc_doorbell")
                    if mode == "submit-kprobe":
                        old.attach_kprobe(event="tacc_submit_ioctl", fn_name="kp_submit_ioctl")
                gc.collect()
                gc.disable()
                s0 = prog_stats()
                rate = measure(node, a.seconds, 64)[0]
                s1 = prog_stats()
                gc.enable()
                if mode == "submit-kprobe":
                    old.detach_kprobe(event="tacc_submit_ioctl")
                prog.detach()
                prog.drain()
                rates[mode].append(rate)
                for name, (t1, c1) in s1.items():
                    t0, c0 = s0.get(name, (0, 0))
                    if c1 > c0:
                        handler_ns[mode].setdefault(name, []).append((t1 - t0) / (c1 - c0))
                print(f"  round {r + 1} {mode:<14} {rate:9.0f} jobs/s", flush=True)
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
        prog.detach()
    base = rates["nothing"]
    rows = []
    for m in MODES:
        med, lo, hi = median_ci(rates[m])
        rat, rlo, rhi = ratio_ci(rates[m], base)
        us = [1e6 / x - 1e6 / b for x, b in zip(rates[m], base, strict=True)]
        ns = {k: sorted(v)[len(v) // 2] for k, v in handler_ns[m].items()}
        rows.append({"mode": m, "median": med, "ci": [lo, hi], "ratio": rat,
                     "ratio_ci": [rlo, rhi], "runs": rates[m],
                     "us_per_job": sorted(us)[len(us) // 2], "handler_ns": ns})
    print(f"\nNOP flood, traced process's cost by stage ({a.rounds} rounds, {a.seconds:g} s)")
    print(f"{'mode':<14} {'jobs/s':>9} {'x nothing':>9} {'95% CI':>15} {'us/job':>7}")
    for row in rows:
        print(f"{row['mode']:<14} {row['median']:9.0f} {row['ratio']:9.3f} "
              f"[{row['ratio_ci'][0]:.3f},{row['ratio_ci'][1]:.3f}] {row['us_per_job']:7.2f}")
        for k, v in sorted(row["handler_ns"].items()):
            print(f"    {k:<20} {v:8.0f} ns per run")
    if a.json:
        Path(a.json).write_text(json.dumps({"bench": "stages", "rounds": a.rounds,
                                            "seconds": a.seconds, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
