"""The guest side of the VM migration check (scripts/test-vm ``migration_check``; run in
the migratable VM of ``scripts/run-vm MIGRATE=1`` (make test) or ``MIGRATE=bad`` (make
test-long: damaged streams first), docs/hardware.md section 15 "A migrating test VM").

Under a capture (``tacc profile``, taccd without BPF) ``tacc run mlp`` runs again and
again (each run numpy-checked: its exit status is 1 when the result differs) until the VM
has moved; the move is asked for (``tacc-vm-migrate``) once the first run has finished,
so a run is in flight across the host's damaged streams (the source pauses, then runs on)
and across the move, and ends on the destination.  Then, on the destination:

* every run passed, some finished before the move and some after;
* the PF's counters read before and after are monotonic and counted the work;
* the capture opens (``tacc.capture``), is complete, and its device trace holds
  commands of runs before and after the move with device times that never go back;
* the pauses are where the model puts them: device time (QEMU's virtual clock) stops with
  the VM, HOSTCLK (the host's realtime clock) does not.  Between the capture's clock pair
  before each of the host's pauses (its QMP STOP ... RESUME events, out/migration.json)
  and the pair after it, HOSTCLK advanced by the host's pause more than DEVCLK did;
* the device counted each pause (VM_PAUSED_NS, hw 1.7): between those two pairs its step
  holds the host's pause, exceeding it by at most DEVICE_PAUSE_EXCESS_NS (QEMU sends
  STOP after its VM state handlers and RESUME before them), and is 0 elsewhere;
* the timeline (``tacc timeline``'s Chrome JSON) draws each pause on the ``VM paused`` track
  with the device's figure.

With ``--all-functions`` (make test-long's second migrating VM, or ``MIGRATE_ALL_FUNCTIONS=1
scripts/test-vm``
with ``VFS=1 VIRTIO=1``), ``tacc run mlp`` also loops on every VF and the virtio-tacc
function the guest has, side by side with the PF's, until the move: each one's runs
numpy-checked, some finished before the move and some after (a run of each in flight
across it: the VF's queues in the VF's section, the virtio function's held submit
buffers in its section's ``jobs`` subsection); and copies on the virtio function, submitted
ahead of their completion and checked, are held on the DMA engine (``x-fi-hang-engine``
through the guest's QMP port, from just before the move until the guest runs on the
destination: the PF's and VF's jobs on it wait too; ``job_timeout_ms`` is raised) so
that the virtio function moves with jobs in flight.

Prints one ``MIGRATE-CHECK ok|FAIL: ...`` line per check and ``MIGRATE-FIGURES {json}``;
exit status 0 when every check passed.  Run with ICOUNT=0 (host time: device time is the
host's time minus the VM's stops, so the pause is measured, not lost in -icount's rate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tacc.capture import open_capture
from tacc.devices import discover, read_counters_sysfs

CAP = Path("/tmp/migcap")
RUNS = Path("/tmp/mlp-runs")
MOVED = Path("/run/tacc-migrated")
WORK_COUNTERS = ("jobs_completed", "cmds_completed", "flops", "h2d_bytes", "d2h_bytes")
# between the two clock pairs around a pause, host time minus device time against the
# host's STOP..RESUME interval: the reads bracketing the pairs (taccd's sysfs reads) and
# the QMP events' own distance from the clock's stop and start
PAUSE_SLACK_NS = 150_000_000
# the device's own count against the host's STOP ... RESUME: QEMU sends STOP after the VM
# state handlers (the device's count starts in one) and RESUME before them (its count ends
# in one), so the count holds the host's interval and exceeds it by the main thread's time
# between the handler and the event: measured 0.08-0.10 ms with the machine otherwise idle,
# 2.7 ms with two more VMs on the 2 cores (the make test lanes).  Below the host's
# interval only by the events' microsecond timestamps
DEVICE_PAUSE_EXCESS_NS = 25_000_000
DEVICE_PAUSE_UNDER_NS = 2_000

# runs until the VM has moved: the run in flight at the move ends on the destination
LOOP = f"""
n=0
while [ ! -e {MOVED} ]; do
    n=$((n + 1))
    tacc run mlp --json > {RUNS}/run-$n.json 2> {RUNS}/run-$n.err || exit 1
    [ -e {MOVED} ] && touch {RUNS}/after-move-$n
done
"""

# the same loop on another function (--all-functions): its runs as <kind>-run-N.json
LOOP_ON = """
loop_on() {{
    n=0
    while [ ! -e {moved} ]; do
        n=$((n + 1))
        tacc run mlp -d "$2" --json > {runs}/$1-run-$n.json 2> {runs}/$1-run-$n.err || exit 1
        [ -e {moved} ] && touch {runs}/$1-after-move-$n
    done
}}
"""

# --all-functions: copies on the virtio-tacc function, submitted ahead of their completion
# (held submit buffers: jobs queued and in flight) until the VM has moved, each batch's
# bytes checked; prints "COPIER-READY" once its first batch is submitted, and at the end
# "COPIER <batches begun before the move> <after>"
COPIER = f"""
import sys
from pathlib import Path
import numpy as np
from tacc.runtime import Context
moved = Path("{MOVED}")
n = 8 << 20
with Context(sys.argv[1]) as ctx:
    s = ctx.default_stream
    rng = np.random.default_rng(1)
    srcs = [ctx.host_buffer(n, np.uint8) for _ in range(2)]
    for b in srcs:
        b.array[:] = rng.integers(0, 256, n, np.uint8)
    back, dev = ctx.host_buffer(n, np.uint8), ctx.device_buffer(n, np.uint8)
    counts = [0, 0]
    while True:
        after = moved.exists()
        src = srcs[sum(counts) % 2]
        for _ in range(16):
            s.copy_h2d(dev, src)
        s.copy_d2h(back, dev)
        if not any(counts):
            print("COPIER-READY", flush=True)
        s.synchronize()
        assert np.array_equal(back.array, src.array), "virtio copies differ"
        counts[after] += 1
        if after:
            break
print("COPIER", *counts, flush=True)
"""

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"MIGRATE-CHECK {'ok' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        failures.append(what)


def pf_counters() -> dict[str, int]:
    pf = next(f for f in discover() if f.kind == "pf")
    return read_counters_sysfs(pf)


def other_functions() -> dict[str, str]:
    """--all-functions: each VF and virtio-tacc function, by a name for its runs."""
    return {f"{f.kind}{i}": f.pci for i, f in enumerate(
        f for f in discover() if f.kind in ("vf", "virtio"))}


def loops(others: dict[str, str]) -> str:
    """The PF's loop and one per other function, side by side; fails if any fails."""
    if not others:
        return LOOP
    script = LOOP_ON.format(moved=MOVED, runs=RUNS)
    script += "".join(f'loop_on {name} {pci} & p{i}=$!\n'
                      for i, (name, pci) in enumerate(others.items()))
    script += f"({LOOP}) & pf=$!\nst=0\nwait $pf || st=1\n"
    script += "".join(f"wait $p{i} || st=1\n" for i in range(len(others)))
    return script + "exit $st\n"


def finished(prefix: str) -> bool:
    return any(p.stat().st_size for p in RUNS.glob(f"{prefix}run-*.json"))


def main() -> int:
    out = Path(os.environ["TACC_VM_OUT"])
    RUNS.mkdir(parents=True, exist_ok=True)
    others = other_functions() if "--all-functions" in sys.argv[1:] else {}
    if "--all-functions" in sys.argv[1:]:
        check(bool(others), f"--all-functions: other functions {others}")
    c0 = pf_counters()
    prof = subprocess.Popen(["tacc", "profile", "-o", str(CAP), "--no-host",
                             "--taccd-option=--no-bpf", "--", "sh", "-c", loops(others)],
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not finished("") or not all(finished(f"{name}-") for name in others):
        if prof.poll() is not None or time.monotonic() > deadline:
            print(f"MIGRATE-CHECK FAIL: the workload ended ({prof.poll()}) before a run "
                  "finished", flush=True)
            return 1
        time.sleep(0.2)
    before_runs = len(list(RUNS.glob("run-*.json")))
    virtio = [pci for name, pci in others.items() if name.startswith("virtio")]
    copier = subprocess.Popen([sys.executable, "-c", COPIER, virtio[0]], text=True,
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) \
        if virtio else None
    hung = False
    if copier:  # its first batch under way; then held on the DMA engine across the move
        check(copier.stdout.readline().strip() == "COPIER-READY", "virtio copies started")
        from tacc.guest_qmp import PF_QOM, GuestQMP

        with GuestQMP() as qmp:
            qmp.qom_set(PF_QOM, "x-fi-hang-engine", 0)
        hung = True
        time.sleep(0.5)
    dev = next(f for f in discover() if f.kind == "pf")
    clk0 = int((dev.sysfs / "tacc/clock_sync").read_text().split()[1])
    mv = subprocess.run(["tacc-vm-migrate"], capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
    print(mv.stdout.strip(), flush=True)
    check(mv.returncode == 0 and mv.stdout.startswith("TACC-MOVED"),
          f"the VM moved (tacc-vm-migrate: {mv.returncode}, {mv.stdout.strip()[:200]})")
    if mv.returncode != 0:
        prof.kill()
        return 1
    if hung:  # on the destination: the engine goes on, the held jobs complete there
        from tacc.guest_qmp import PF_QOM, GuestQMP

        with GuestQMP() as qmp:
            qmp.qom_set(PF_QOM, "x-fi-hang-engine", -1)
    fig = json.loads((out / "migration.json").read_text())
    rc = prof.wait(timeout=1200)
    c1 = pf_counters()
    runs = sorted(RUNS.glob("run-*.json"))
    check(rc == 0, f"tacc profile -- (tacc run mlp, numpy-checked) x {len(runs)}: exit {rc}"
          + ("" if rc == 0 else ": " + " ".join(p.read_text()[-300:]
                                                 for p in RUNS.glob("run-*.err"))))
    after = sorted(p.name for p in RUNS.glob("after-move-*"))
    check(before_runs >= 1 and len(after) >= 1,
          f"runs finished before the move ({before_runs}) and after it ({after})")
    if copier:
        cout = copier.communicate(timeout=600)[0]
        counts = [ln.split()[1:] for ln in cout.splitlines() if ln.startswith("COPIER")]
        check(copier.returncode == 0 and bool(counts) and int(counts[-1][0]) >= 1
              and int(counts[-1][1]) >= 1,
              f"virtio copies (16 x 8 MiB in and 8 MiB back per batch, checked) across the "
              f"move: exit {copier.returncode}, batches before/after {counts}")
    for name, pci in others.items():
        n = len(list(RUNS.glob(f"{name}-run-*.json")))
        moved = sorted(p.name for p in RUNS.glob(f"{name}-after-move-*"))
        check(n >= 2 and len(moved) >= 1, f"{name} ({pci}): {n} runs (numpy-checked), "
              f"finished after the move: {moved}")
    back = {k: (c0[k], c1[k]) for k in c0 if k in c1 and c1[k] < c0[k]}
    check(not back, f"PF counters monotonic across the move ({len(c0)} read; went back: {back})")
    grew = {k: c1.get(k, 0) - c0.get(k, 0) for k in WORK_COUNTERS}
    check(all(v > 0 for v in grew.values()), f"work counters grew: {grew}")

    # the capture
    cap = open_capture(CAP)
    complete = (CAP / "complete").exists()
    tr = cap.read("device_trace")
    clk = cap.read("clock_sync")
    check(complete and len(tr) > 0 and len(clk) >= 2,
          f"capture {CAP}: complete={complete}, {len(tr)} device trace records, "
          f"{len(clk)} clock pairs")
    if not len(tr) or len(clk) < 2:
        return 1
    before = int((tr["t_end"] < clk0).sum())
    check(before > 0 and before < len(tr),
          f"device trace: {before} commands ended before the move, {len(tr) - before} after")
    ends = tr["t_end"].astype(np.int64)
    bad = tr[tr["t_end"] < tr["t_start"]]
    check(not len(bad), f"device trace: each command ends after it starts ({len(bad)} not: "
          + "; ".join(f"seq {r['seq']} op {r['opcode']} start {r['t_start']} end {r['t_end']}"
                      for r in bad[:3]) + ")")
    check(int(ends.max()) > clk0, f"device time went on past the move ({int(ends.max())} > {clk0})")

    # the pauses: the host's (the bad streams' stop of the source, the move's downtime)
    pf_fid = 0
    c = np.sort(clk[clk["fid"] == pf_fid], order="mono_before")
    host = c["hostclk"].astype(np.int64)
    devt = c["devclk"].astype(np.int64)
    pauses = []
    if fig.get("bad_stop_host_s") and fig.get("bad_resume_host_s"):
        pauses.append(("damaged streams (the source stopped)", fig["bad_stop_host_s"],
                       fig["bad_resume_host_s"]))
    pauses.append(("the move", fig["stop_host_s"], fig["resume_host_s"]))
    spans = [(what, int(a * 1e9), int(b * 1e9)) for what, a, b in pauses]
    excess = np.diff(host) - np.diff(devt)  # host time the device did not see, per interval
    expected = np.zeros(len(excess), np.int64)
    seen = []
    for what, stop, resume in spans:
        i = int(np.searchsorted(host, stop)) - 1
        if i < 0 or i + 1 >= len(host) or host[i + 1] < resume:
            check(False, f"{what}: no clock pairs around the host's pause "
                         f"[{stop}, {resume}] (HOSTCLK {host.min()}..{host.max()})")
            continue
        expected[i] += resume - stop
        seen.append({"pause": what, "host_ms": (resume - stop) / 1e6, "interval": i})
    for p in seen:
        i = p["interval"]
        p["capture_ms"] = float(excess[i] / 1e6)
        check(abs(int(excess[i]) - int(expected[i])) <= PAUSE_SLACK_NS,
              f"{p['pause']}: between the capture's clock pairs {i} and {i + 1} HOSTCLK "
              f"advanced {excess[i] / 1e6:.1f} ms more than DEVCLK; the host's pauses there: "
              f"{expected[i] / 1e6:.1f} ms (+-{PAUSE_SLACK_NS / 1e6:.0f})")
    dev_ms = np.abs(excess - expected) / 1e6
    check(bool(np.all(dev_ms <= PAUSE_SLACK_NS / 1e6)),
          f"no other gap: over all {len(excess)} clock-pair intervals host-minus-device time "
          f"equals the host's pauses within {dev_ms.max():.1f} ms")
    # the device's count of them (VM_PAUSED_NS), interval by interval
    step = np.diff(c["vm_paused_ns"].astype(np.int64))
    over = step - expected
    cnt_ms = np.abs(over) / 1e6
    for p in seen:
        p["device_ms"] = float(step[p["interval"]] / 1e6)
    paused = expected > 0
    check(bool(np.all(step[~paused] == 0)
               and np.all((over[paused] >= -DEVICE_PAUSE_UNDER_NS)
                          & (over[paused] <= DEVICE_PAUSE_EXCESS_NS))),
          f"the device counted the pauses: over all {len(step)} clock-pair intervals its "
          f"VM_PAUSED_NS steps are 0 where the host did not pause and hold the host's pauses "
          f"elsewhere, exceeding them by {[round(float(o) / 1e6, 3) for o in over[paused]]} ms "
          f"(-{DEVICE_PAUSE_UNDER_NS / 1e6:.3f} .. +{DEVICE_PAUSE_EXCESS_NS / 1e6:.0f}); steps "
          f"{[round(float(s) / 1e6, 2) for s in step[step != 0]]} ms")
    # the timeline draws them
    from tacc.timeline.convert import convert
    js = Path("/tmp/migcap.json")
    convert([CAP], js, fmt="json")
    drawn = sorted(int(e["args"]["paused_ns"]) for e in json.loads(js.read_text())["traceEvents"]
                   if e.get("ph") == "X" and e["name"].startswith("VM paused"))
    want = sorted(int(s) for s in step[step > 0])
    check(drawn == want and len(drawn) == len(seen),
          f"the timeline's VM paused track: {[round(d / 1e6, 2) for d in drawn]} ms, the "
          f"device's steps {[round(w / 1e6, 2) for w in want]} ms, the host's "
          f"{len(seen)} pauses")
    print("MIGRATE-JSON " + json.dumps(fig), flush=True)  # run-vm's out/migration.json
    print("MIGRATE-FIGURES " + json.dumps({
        "runs": len(runs), "runs_before_move": before_runs,
        "other_functions": {name: len(list(RUNS.glob(f"{name}-run-*.json")))
                            for name in others}, "trace_records": len(tr),
        "clock_pairs": len(c), "pauses": seen, "max_clock_deviation_ms": float(dev_ms.max()),
        "max_device_pause_error_ms": float(cnt_ms.max()),
        "downtime_ms": fig.get("downtime_ms"), "transferred": fig.get("transferred"),
        "refused": [(r["stream"], r["rc"], r["message"][-120:]) for r in fig["refused"]],
    }), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
