"""accel-bpftrace: snoop, latency, top, dma, record, list (bcc on the tacc tracepoints).

Every failure is one line on stderr and a non-zero exit: 2 for a bad option, 1 for an
environment problem (not root, module not loaded, headers or bcc missing, no device).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from tacc.bpftrace.errors import ToolError

PROG = "accel-bpftrace"
POLL_S = 0.05


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ToolError(f"{message} (see '{PROG} --help')", status=2)


def _positive(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{v}' is not a number") from None
    if f <= 0:
        raise argparse.ArgumentTypeError(f"'{v}' must be > 0")
    return f


def _pid(v: str) -> int:
    if not v.isdigit() or int(v) <= 0:
        raise argparse.ArgumentTypeError(f"'{v}' is not a process id")
    return int(v)


def build_parser() -> OneLineParser:
    common = OneLineParser(add_help=False)
    common.add_argument("-p", "--pid", type=_pid, default=0, help="only this process")
    common.add_argument("-c", "--comm", default="", help="only processes with this name")
    common.add_argument("-d", "--device", default=None,
                        help="only this function (PCI address of the PF or a VF)")
    common.add_argument("--duration", type=_positive, default=None,
                        help="stop after this many seconds")
    common.add_argument("--json", action="store_true", help="JSON output")
    common.add_argument("--ebpf", action="store_true",
                        help="print the BPF program this command would load, and exit "
                             "(nothing is compiled or attached; as bcc's tools)")
    def ex(*lines: str) -> str:
        return "examples:\n" + "\n".join(f"  {PROG} {ln}" for ln in lines)

    p = OneLineParser(prog=PROG, description="Live tracing of the tacc driver (bcc).",
                      epilog=ex("snoop", "latency --duration 5", "snoop --ebpf"))
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=OneLineParser)
    sub.add_parser("snoop", parents=[common], help="one line per submission and completion",
                   description="One line per job submission and completion: process, "
                               "function, queue, tag, bytes, latency.",
                   epilog=ex("snoop", "snoop -p 1234", "snoop --json --duration 10"))
    sub.add_parser("latency", parents=[common],
                   help="log2 histograms of submit->complete, queue wait, device time",
                   description="log2 histograms of submit to completion, queue wait and "
                               "device time, per queue.",
                   epilog=ex("latency --duration 5", "latency -c python3"))
    t = sub.add_parser("top", parents=[common], help="per-process jobs/s, bytes/s, busy share",
                       description="Per-process jobs/s, bytes/s and busy share, refreshed "
                                   "every interval.", epilog=ex("top -i 2"))
    t.add_argument("-i", "--interval", type=_positive, default=1.0,
                   help="seconds between refreshes")
    d = sub.add_parser("dma", parents=[common], help="IOMMU map/unmap sizes, rates, time",
                       description="IOMMU map/unmap sizes, rates and time of the driver.",
                       epilog=ex("dma --duration 5", "dma -i 1"))
    d.add_argument("-i", "--interval", type=_positive, default=None,
                   help="seconds between reports (default: at the end)")
    r = sub.add_parser("record", parents=[common], help="every tacc event into a capture",
                       description="Every tacc event into a capture directory (what taccd "
                                   "records, without taccd).",
                       epilog=ex("record -o /tmp/cap --duration 10"))
    r.add_argument("-o", "--output", required=True, help="capture directory to create")
    r.add_argument("--no-device-trace", action="store_true",
                   help="do not consume the device trace ring")
    r.add_argument("--trace-entries", type=int, default=0, metavar="N",
                   help="device trace ring records per function, a power of two "
                        "64..32768 (default: the driver's, 4096)")
    sub.add_parser("list", parents=[common], help="the tacc tracepoints and their fields",
                   description="The tacc tracepoints and their fields.", epilog=ex("list"))
    from .conventions import finish

    return finish(p, PROG)  # type: ignore[return-value]


class _Stop:
    def __init__(self) -> None:
        self.stop = False
        signal.signal(signal.SIGINT, self._set)
        signal.signal(signal.SIGTERM, self._set)

    def _set(self, *_a: object) -> None:
        self.stop = True


def _loop(duration: float | None, step: Any, interval: float = POLL_S) -> float:
    """Run ``step()`` every ``interval`` until the duration or a signal; returns elapsed."""
    stop = _Stop()
    t0 = time.monotonic()
    while not stop.stop:
        now = time.monotonic()
        if duration is not None and now - t0 >= duration:
            break
        left = interval if duration is None else min(interval, max(duration - (now - t0), 0))
        time.sleep(left)
        step()
    return time.monotonic() - t0


def _filters(args: argparse.Namespace) -> Any:
    from tacc.bpftrace.preflight import resolve_device
    from tacc.bpftrace.program import Filters

    fn = resolve_device(args.device)
    return Filters(pid=args.pid, comm=args.comm, dev=fn.devid if fn else None), fn


def _program(root: Path, host: bool = False, rb_pages: int = 1024) -> Any:
    from tacc.bpftrace.program import Program

    try:
        return Program(root, rb_pages=rb_pages, host=host)
    except (FileNotFoundError, ValueError) as exc:  # no tracepoint / tracepoint ABI mismatch
        raise ToolError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - bcc raises Exception on compile/load errors
        raise ToolError(f"BPF program failed to load: {str(exc).splitlines()[0]}") from None


def _attach(prog: Any, mode: str) -> None:
    from tacc.bpftrace.program import AttachError

    try:
        prog.attach(mode)
    except AttachError as exc:
        raise ToolError(str(exc)) from None


def _ready(what: str) -> None:
    """One line on stderr once the probes are attached (scripts and tests wait for it)."""
    print(f"{PROG}: {what}... Ctrl-C to end", file=sys.stderr, flush=True)


def _lost_line(prog: Any, as_json: bool, out: Any = None) -> None:
    st = prog.stats()
    if as_json:
        print(json.dumps({"event": "summary", "events": st.emitted, "lost": st.dropped,
                          "missed": st.missed}), flush=True)
    else:
        missed = f" ({st.missed} probe runs skipped by the kernel)" if st.missed else ""
        print(f"{PROG}: {st.emitted} events, {st.dropped} lost{missed}", file=sys.stderr)
    for w in prog.warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)


# ------------------------------------------------------------- subcommands ---
def cmd_list(args: argparse.Namespace, root: Path) -> int:
    from tacc.bpftrace.tpformat import list_system

    fmts = list_system(root, "tacc")
    if args.json:
        print(json.dumps([{"tracepoint": f"tacc:{f.name}", "id": f.id,
                           "fields": [{"name": x.name, "type": x.ctype, "offset": x.offset,
                                       "size": x.size} for x in f.fields if not x.common]}
                          for f in fmts], indent=1))
        return 0
    for f in fmts:
        print(f"tacc:{f.name}")
        for x in f.fields:
            if not x.common:
                arr = f"[{x.array}]" if x.array else ""
                print(f"    {x.ctype} {x.name}{arr};")
    return 0


def cmd_snoop(args: argparse.Namespace, root: Path) -> int:
    from tacc.bpftrace.output import SNOOP_HEADER, snoop_line, snoop_rows

    flt, _fn = _filters(args)
    prog = _program(root)
    prog.configure(flt)
    _attach(prog, "snoop")
    t0 = time.monotonic_ns()
    _ready("tracing tacc submissions")
    if not args.json:
        print(SNOOP_HEADER, flush=True)

    def step() -> None:
        rows = snoop_rows(prog.drain(), t0)
        if rows:
            txt = "\n".join(json.dumps(r) if args.json else snoop_line(r) for r in rows)
            print(txt, flush=True)

    try:
        _loop(args.duration, step)
        step()
    finally:
        prog.detach()
    _lost_line(prog, args.json)
    return 0


def cmd_latency(args: argparse.Namespace, root: Path) -> int:
    from tacc.bpftrace.output import latency_report

    flt, _fn = _filters(args)
    prog = _program(root)
    prog.configure(flt)
    _attach(prog, "latency")
    _ready("tracing tacc job latency")
    try:
        _loop(args.duration, lambda: None, 0.2)
    finally:
        prog.detach()
    print("\n".join(latency_report(prog.latency(), args.json)))
    return 0


def _clock_hz(fn: Any) -> float:
    from tacc.devices import discover

    fns = [fn] if fn else discover()
    for f in fns:
        try:
            return float(f.info.get("clock_hz", 1e9))
        except ValueError:
            pass
    return 1e9


def cmd_top(args: argparse.Namespace, root: Path) -> int:
    from tacc.bpftrace.output import top_lines, top_rows

    flt, fn = _filters(args)
    hz = _clock_hz(fn)
    prog = _program(root)
    prog.configure(flt)
    _attach(prog, "top")
    _ready("tracing tacc jobs per process")
    state: dict[str, Any] = {"prev": {}, "t": time.monotonic()}
    tty = sys.stdout.isatty() and not args.json

    def step() -> None:
        now = time.monotonic()
        cur = prog.top()
        rows = top_rows(cur, state["prev"], max(now - state["t"], 1e-9), hz)
        state["prev"], state["t"] = cur, now
        if args.json:
            print(json.dumps({"time": time.time(), "processes": rows}), flush=True)
        else:
            if tty:
                print("\033[H\033[J", end="")
            print("\n".join(top_lines(rows)) + "\n", flush=True)

    try:
        _loop(args.duration, step, args.interval)
    finally:
        prog.detach()
    return 0


def cmd_dma(args: argparse.Namespace, root: Path) -> int:
    from tacc.bpftrace.output import dma_lines

    flt, _fn = _filters(args)
    prog = _program(root)
    prog.configure(flt)
    _attach(prog, "dma")
    _ready("tracing tacc DMA mappings")
    t0 = time.monotonic()

    def report() -> None:
        per, hist = prog.dma()
        dt = max(time.monotonic() - t0, 1e-9)
        if args.json:
            print(json.dumps({"processes": per, "size_hist": [
                {"pid": p, "dir": "unmap" if d else "map", "slots": s}
                for (p, d), s in sorted(hist.items())]}), flush=True)
        else:
            print("\n".join(dma_lines(per, hist, dt)) + "\n", flush=True)

    try:
        _loop(args.duration, report if args.interval else (lambda: None),
              args.interval or 0.2)
    finally:
        prog.detach()
    if not args.interval:
        report()
    for w in prog.warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    return 0


def _record_options(args: argparse.Namespace) -> Any:
    """record's capture options; a bad value (--trace-entries 100) is a usage error."""
    from tacc.daemon.options import Options

    try:
        return Options(host_events=False, device_trace=not args.no_device_trace, api=False,
                       counters_hz=10.0, pids=[args.pid] if args.pid else [],
                       comm=args.comm, device=args.device, trace_entries=args.trace_entries)
    except ValueError as exc:
        raise ToolError(str(exc), status=2) from None


def cmd_record(args: argparse.Namespace, root: Path) -> int:
    from tacc.capture.errors import CaptureError
    from tacc.daemon.session import CaptureSession
    from tacc.devices import discover

    opts = _record_options(args)
    flt, fn = _filters(args)
    fns = [fn] if fn else discover()
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ToolError(f"{out}: exists and is not an empty directory")
    prog = _program(root, rb_pages=RB_PAGES["record"])
    prog.configure(flt)
    try:
        sess = CaptureSession(out, fns, opts, program=prog, tool=PROG)
    except (CaptureError, OSError) as exc:
        raise ToolError(f"cannot create capture: {exc}") from None
    try:
        _attach(prog, "record")
        _ready(f"recording to {out}")
        _loop(args.duration, sess.tick)
    finally:
        prog.detach()
        summary = sess.close()
    for w in sess.warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    _lost_line(prog, args.json)
    if args.json:
        print(json.dumps({"event": "record", **summary}))
    return 0


RB_PAGES = {"record": 4096}  # the ring buffer each command's program is built with
COMMANDS = {"snoop": cmd_snoop, "latency": cmd_latency, "top": cmd_top, "dma": cmd_dma,
            "record": cmd_record, "list": cmd_list}


def run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from tacc.bpftrace import preflight

    if not args.cmd:
        raise ToolError(f"a command is required: {', '.join(COMMANDS)}", status=2)
    if args.device:
        from tacc.devices import parse_pci
        from tacc.errors import DeviceError

        try:
            parse_pci(args.device)
        except DeviceError as exc:
            raise ToolError(str(exc), status=2) from None
    if args.cmd == "record":  # before the host's checks: a bad option is a usage error
        _record_options(args)
    if args.ebpf:  # the source is built from the loaded driver's tracepoint formats
        from tacc.bpftrace import bpfsrc

        root = preflight.all_checks(bcc=False)
        src, _ = bpfsrc.build_source(root, rb_pages=RB_PAGES.get(args.cmd, 1024), host=False)
        sys.stdout.write(src if src.endswith("\n") else src + "\n")
        return 0
    root = preflight.all_checks(bcc=args.cmd != "list")
    return COMMANDS[args.cmd](args, root)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except ToolError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
