"""``tacc stat``, ``tacc top`` and ``tacc counters {list,sample}`` (docs/counters.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tacc.counters.backends import default_catalogue, open_backend
from tacc.counters.base import Backend, Snapshot
from tacc.counters.catalogue import Catalogue, CounterError, Function, select_functions
from tacc.counters.derived import LinkInfo, deltas, derive

SUMMARY_METRICS = (
    ("h2d_gbps", "GB/s H2D payload"), ("d2h_gbps", "GB/s D2H payload"),
    ("h2d_link_share", "of H2D link max"), ("d2h_link_share", "of D2H link max"),
    ("h2d_engine_gbps", "GB/s H2D while busy"), ("d2h_engine_gbps", "GB/s D2H while busy"),
    ("h2d_tlp_efficiency", "H2D payload/link bytes"),
    ("d2h_tlp_efficiency", "D2H payload/link bytes"),
    ("util_dma_h2d", "DMA H2D utilization"), ("util_dma_d2h", "DMA D2H utilization"),
    ("util_compute0", "compute0 utilization"), ("util_compute1", "compute1 utilization"),
    ("util_compute2", "compute2 utilization"), ("util_compute3", "compute3 utilization"),
    ("tlb_hit_rate", "TLB hit rate"), ("link_stall_share", "link stall share"),
)
SHARES = {"h2d_link_share", "d2h_link_share", "h2d_tlp_efficiency", "d2h_tlp_efficiency",
          "tlb_hit_rate", "link_stall_share"}


def _err(msg: str) -> CounterError:
    return CounterError(msg)


def link_of(fn: Function) -> LinkInfo:
    return LinkInfo(fn.gen, fn.width, fn.mps, float(fn.clock_hz), fn.sq_entries, fn.time_scale)


def _catalogue(fn: Function, events: list[str] | None) -> Catalogue:
    cat = default_catalogue(fn)
    if events:
        cat = fn.catalogue.select(events)
    return cat


def _open_all(fns: list[Function], backend: str, events: list[str] | None) -> list[Backend]:
    out: list[Backend] = []
    try:
        for fn in fns:
            out.append(open_backend(backend, fn, _catalogue(fn, events)))
    except BaseException:
        for b in out:
            b.close()
        raise
    return out


def _read_valid(b: Backend) -> Snapshot:
    s = b.read()
    if not s.valid:
        raise _err(f"{b.fn.pci}: {b.name} read {s.state} (function in D3hot or reset; "
                   "use --backend sysfs, or keep it awake: power/control=on)")
    return s


def _fmt_metric(key: str, v: float) -> str:
    if v != v:  # NaN
        return "-"
    return f"{v * 100:.1f}%" if key in SHARES or key.startswith("util_") else f"{v:.3f}"


def stat_report(fn: Function, cat: Catalogue, before: Snapshot, after: Snapshot,
                dt_s: float) -> dict[str, Any]:
    d = deltas(cat.names, before.values, after.values)
    m = derive(d, dt_s, link_of(fn), level=d)
    return {"function": fn.pci, "label": fn.label, "pmu": fn.pmu_name,
            "counters": {c.name: {"value": int(d[c.name]), "unit": c.unit, "scope": c.scope}
                         for c in cat},
            "derived": {k: (None if v != v else float(v)) for k, v in m.items()}}


def cmd_stat(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        from tacc.cli import UsageError

        raise UsageError("stat: no command (tacc stat [options] -- CMD ...)")
    events = args.events.split(",") if args.events else None
    fns = select_functions(args.device)
    bes = _open_all(fns, args.backend, events)
    try:
        t0 = time.monotonic()
        before = [_read_valid(b) for b in bes]
        rc = subprocess.call(cmd)
        after = [_read_valid(b) for b in bes]
        dt = time.monotonic() - t0
    finally:
        for b in bes:
            b.close()
    reports = [stat_report(b.fn, b.catalogue, x, y, dt) for b, x, y in zip(bes, before, after,
                                                                           strict=True)]
    if args.json:
        json.dump({"command": cmd, "backend": args.backend, "elapsed_s": dt, "status": rc,
                   "functions": reports}, sys.stdout, indent=1)
        print()
        return rc
    out = sys.stderr if args.stderr else sys.stdout
    print(f"\n Performance counter stats for '{' '.join(cmd)}' (tacc {args.backend}):", file=out)
    for r in reports:
        print(f"\n {r['function']} ({r['label']}, {r['pmu']})", file=out)
        for name, c in r["counters"].items():
            if c["value"] or args.all or events:
                print(f" {c['value']:>20,} {c['unit']:<8} {name}", file=out)
        for key, label in SUMMARY_METRICS:
            v = r["derived"].get(key)
            if v is not None and (v or args.all):
                print(f" {_fmt_metric(key, v):>20} {'':<8} {label}", file=out)
    print(f"\n {dt:>20.6f} seconds time elapsed\n", file=out)
    return rc


# ---------------------------------------------------------------------- top ----
def _bar(frac: float, width: int = 20) -> str:
    if frac != frac:
        return " " * width
    n = int(round(max(0.0, min(1.0, frac)) * width))
    return "█" * n + "·" * (width - n)


def top_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    t = Table(title="tacc top: hardware counters per function", expand=False)
    for col in ("function", "state", "H2D GB/s vs max", "D2H GB/s vs max", "engines busy",
                "TLB hit", "queue hwm"):
        t.add_column(col)
    for r in rows:
        m = r["m"]
        engines = "\n".join(f"{e:<9}{_bar(m.get('util_' + e, float('nan')), 12)} "
                            f"{_fmt_metric('util_', m.get('util_' + e, float('nan'))):>6}"
                            for e in ("dma_h2d", "dma_d2h", "compute0", "compute1", "compute2",
                                      "compute3"))
        links = []
        for dirn in ("h2d", "d2h"):
            g, share = m.get(f"{dirn}_gbps", float("nan")), m.get(f"{dirn}_link_share",
                                                                     float("nan"))
            links.append(f"{_bar(share)} {g:6.2f} / {r['max'][dirn]:.2f}\n"
                         f"{_fmt_metric('h2d_link_share', share):>8} of link max")
        hwm = " ".join(str(int(r["level"].get(f"queue{q}_depth_hwm", 0))) for q in range(4))
        t.add_row(f"{r['fn'].pci}\n{r['fn'].label}", r["state"], links[0], links[1], engines,
                  _fmt_metric("tlb_hit_rate", m.get("tlb_hit_rate", float("nan"))), hwm)
    return t


def top_json(rows: list[dict[str, Any]], t: float, interval: float) -> dict[str, Any]:
    """One refresh of ``tacc top --json`` (docs/cli.md): the figures the table shows."""
    def num(v: float) -> float | None:
        return None if v != v else float(v)

    return {"time": t, "interval_s": interval, "functions": [
        {"function": r["fn"].pci, "label": r["fn"].label, "state": r["state"],
         "max_gbps": r["max"], "queue_depth_hwm": [int(r["level"].get(f"queue{q}_depth_hwm", 0))
                                                   for q in range(4)],
         "derived": {k: num(v) for k, v in r["m"].items()}} for r in rows]}


def cmd_top(args: argparse.Namespace) -> int:
    fns = select_functions(args.device)
    bes = _open_all(fns, args.backend, None)
    live: Any = None
    if not args.json:
        from rich.console import Console
        from rich.live import Live

        live = Live(console=Console(), auto_refresh=False, transient=False)
        live.start()
    prev = [b.read() for b in bes]
    n = 0
    try:
        while args.iterations is None or n < args.iterations:
            time.sleep(args.interval)
            rows = []
            for i, b in enumerate(bes):
                cur = b.read()
                state = b.fn.runtime_status if cur.valid else cur.state
                m: dict[str, float] = {}
                level: dict[str, int] = {}
                if cur.valid and prev[i].valid:
                    names = b.catalogue.names
                    d = deltas(names, prev[i].values, cur.values)
                    level = {k: int(v) for k, v in d.items() if k.endswith("_depth_hwm")}
                    m = {k: float(v) for k, v in derive(
                        d, (cur.t_ns - prev[i].t_ns) / 1e9, link_of(b.fn), level).items()}
                link = link_of(b.fn)
                rows.append({"fn": b.fn, "state": state, "m": m, "level": level,
                             "max": {x: link.max_bw(x) / 1e9 for x in ("h2d", "d2h")}})
                prev[i] = cur
            if live is None:
                print(json.dumps(top_json(rows, time.time(), args.interval)), flush=True)
            else:
                live.update(top_table(rows), refresh=True)
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
        for b in bes:
            b.close()
    return 0


# ----------------------------------------------------------------- counters ----
def list_json(fns: list[Function]) -> list[dict[str, Any]]:
    """``tacc counters list --json`` (docs/cli.md): each function's catalogue."""
    return [{"function": fn.pci, "label": fn.label, "pmu": fn.pmu_name,
             "catalogue_version": fn.catalogue.version,
             "counters": [{"name": c.name, "slot": c.slot, "unit": c.unit, "scope": c.scope,
                           "description": c.description} for c in fn.catalogue]}
            for fn in fns]


def cmd_list(args: argparse.Namespace) -> int:
    doc = list_json(select_functions(args.device))
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    for f in doc:
        print(f"{f['function']} ({f['label']}) pmu {f['pmu']}, catalogue version "
              f"{f['catalogue_version']}")
        for c in f["counters"]:
            print(f"  {c['name']:<22} slot {c['slot']:<3} {c['unit']:<8} {c['scope']:<9} "
                  f"{c['description']}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from tacc.capture import CaptureWriter
    from tacc.cli import UsageError
    from tacc.counters.sampler import MAX_RATE_HZ, Sampler, capture_meta

    low = 0.25 if args.backend == "device" else 0.0  # the device's period: u32 ns
    if not low < args.rate <= MAX_RATE_HZ or args.duration <= 0:
        raise UsageError(f"counters sample: --rate {args.rate:g}, --duration {args.duration:g}: "
                         f"the rate must be in ({low:g}, {MAX_RATE_HZ:g}] Hz, the duration "
                         "above 0 s")
    fns = select_functions(args.device)
    meta = capture_meta(fns, args.rate, args.backend)
    with Sampler(fns, args.rate, args.backend, spin_us=args.spin_us) as s, CaptureWriter(
            args.output, meta, streams=("counters", "clock_sync", "drops")) as w:
        st = s.run(duration_s=args.duration, writer=w)
        w.close(extra={"counters_sampler": st.as_dict()})
    if args.json:
        print(json.dumps({"output": str(args.output), "backend": args.backend,
                          "functions": [f.pci for f in fns], **st.as_dict()}, indent=1))
        return 0
    print(f"{st.samples} samples of {len(fns)} function{'s' if len(fns) != 1 else ''} at "
          f"{st.rate_hz:.0f} Hz over {st.wall_s:.3f} s ({st.missed} ticks missed, "
          f"{st.unavailable} unavailable) -> {args.output}")
    return 0


def _user_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """CounterError, PermissionError -> tacc.cli.CommandError: one line on stderr, exit
    status 1."""

    def run(args: argparse.Namespace) -> int:
        from tacc.cli import CommandError

        try:
            return func(args)
        except (CounterError, PermissionError) as exc:
            raise CommandError(str(exc)) from exc

    return run


def add_parser(sub: Any) -> None:
    from tacc.cli import options

    backends = ("sysfs", "mmap", "perf")
    p = sub.add_parser(
        "stat", help="device counters over a command, perf-stat style",
        description="Count the device counters over a command (or an interval), as perf "
                    "stat does: each function's counters before and after.",
        epilog="examples:\n  tacc stat -- tacc run mlp\n"
               "  tacc stat -e jobs_completed,h2d_bytes -- ./a.out\n"
               "  tacc stat --json -d 0000:01:00.0 -- sleep 1",
        parents=[options.device(), options.backend(backends, "sysfs"),
                 options.json_flag("print the counters as JSON")])
    p.add_argument("-e", "--events", help="comma-separated counter names (default all readable)")
    p.add_argument("-a", "--all", action="store_true", help="show zero counters too")
    p.add_argument("--stderr", action="store_true", help="report on stderr (like perf stat)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS]")
    p.set_defaults(func=_user_errors(cmd_stat))

    p = sub.add_parser(
        "top", help="live hardware view per function (PF and VFs)",
        description="A live view per function (PF and VFs): jobs, bytes, busy shares, "
                    "refreshed every interval.",
        epilog="examples:\n  tacc top\n  tacc top -i 0.5 -n 10\n  tacc top --json -n 1",
        parents=[options.device(), options.backend(backends, "sysfs"),
                 options.json_flag("one JSON object per refresh, a line each (JSON Lines) "
                                   "instead of the live table")])
    p.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("-n", "--iterations", type=int, help="stop after N refreshes")
    p.set_defaults(func=_user_errors(cmd_top))

    p = sub.add_parser(
        "counters", help="counter catalogue and sampling into a capture",
        description="The driver's counter catalogue, and sampling it into a capture.",
        epilog="examples:\n  tacc counters list\n  tacc counters sample -o /tmp/c -r 1000")
    csub = p.add_subparsers(dest="counters_cmd", metavar="ACTION", required=True)
    q = csub.add_parser(
        "list", help="the driver's counter catalogue",
        description="The counters each function has: name, slot, unit, scope, description.",
        epilog="examples:\n  tacc counters list\n  tacc counters list -d VF1\n"
               "  tacc counters list --json",
        parents=[options.device(), options.json_flag()])
    q.set_defaults(func=_user_errors(cmd_list))
    q = csub.add_parser(
        "sample", help="sample at a fixed rate into a capture directory",
        description="Sample the counters at a fixed rate into a capture directory (its "
                    "counters stream).",
        epilog="examples:\n  tacc counters sample -o /tmp/c -r 1000 -t 2\n"
               "  tacc counters sample -o /tmp/c -b device -r 5000 --json",
        parents=[options.device(), options.output("capture directory to write",
                                                  required=True, metavar="DIR"),
                 options.backend((*backends, "device"), "mmap",
                                 "how the counters are read (device: the device samples "
                                 "into the driver's sample ring)"),
                 options.json_flag("print the sampler's figures as JSON")])
    q.add_argument("-r", "--rate", type=float, default=1000.0,
                   help="Hz, up to 10000 (device: the sampling period is 1/rate, >= 100 us)")
    q.add_argument("-t", "--duration", type=float, default=1.0, help="seconds")
    q.add_argument("--spin-us", type=float, default=0.0,
                   help="spin instead of sleeping for deadlines closer than this")
    q.set_defaults(func=_user_errors(cmd_sample))
