"""``tacc run NAME``: run a workload (and its twin) on a tacc device.

    tacc run --list
    tacc run mlp
    tacc run tiny_transfers --variant both --json
    tacc run link_saturation -d 0000:01:00.1 -d 0000:01:00.2 --variant bad
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from tacc.cli import options

    p = subparsers.add_parser(
        "run", help="run a workload (tacc run NAME)",
        description="Run a tacc workload: mlp, or the bad/good twin of an inefficiency "
                    "(docs/workloads.md).",
        epilog="examples:\n  tacc run --list\n  tacc run tiny_transfers --variant bad --trace\n"
               "  tacc run mlp --sim --json",
        parents=[options.device("PCI address of the function (repeat for multi-device "
                                "workloads: the first is the main one)"),
                 options.json_flag("print results as JSON")])
    p.add_argument("name", nargs="?", help="workload name (see --list)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--variant", choices=("good", "bad", "both"), default=None,
                   help="which twin to run (default: both for twins, good for mlp)")
    p.add_argument("--scale", type=int, default=1, help="multiply the work (default 1)")
    p.add_argument("--no-check", action="store_true", help="skip the numpy comparison")
    p.add_argument("--trace", action="store_true",
                   help="enable API tracing for this run (as TACC_API_TRACE=1)")
    p.add_argument("--sim", action="store_true", help="use the Python simulator, no device")
    m = p.add_argument_group("model workloads (decode*)")
    m.add_argument("--config", choices=("tiny", "gpt2"), default=None,
                   help="model configuration (default tiny)")
    m.add_argument("--batch", type=int, default=None, help="sequences (default 4)")
    m.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 8)")
    m.add_argument("--tokens", type=int, default=None,
                   help="tokens generated per sequence (default 8)")
    m.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                   help="weights of the matmuls (decode; default fp32)")
    m.add_argument("--mode", choices=("graph", "eager", "launch"), default=None,
                   help="decode steps: graph replay (default), op by op, op by op with a "
                        "host sync per layer")
    p.add_argument("--storage", metavar="PATH", default=None,
                   help="load: the block device or file the weights are written to and read "
                        "from (default $TACC_NVME_DEV, else a temporary file); its first "
                        "bytes are overwritten")
    p.set_defaults(func=main)
    return p


def _table(results: list[Any]) -> str:
    rows = [("workload", "variant", "device ms", "wall ms", "jobs", "checked", "max err")]
    for r in results:
        rows.append((r.workload, r.variant, f"{r.device_ns / 1e6:.3f}", f"{r.wall_ns / 1e6:.1f}",
                     str(r.jobs), "yes" if r.checked else "no", f"{r.max_abs_err:.2g}"))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(row)) for row in rows)


def main(args: argparse.Namespace) -> int:
    from tacc.cli import CommandError, UsageError

    if args.trace:
        os.environ["TACC_API_TRACE"] = "1"
        from tacc.runtime import apitrace

        apitrace.set_process_enabled(True)
    from tacc.runtime import Context, TaccError
    from tacc.workloads import WORKLOADS, get, run

    if args.list or not args.name:
        for w in WORKLOADS.values():
            exp = ", ".join(w.expected) or "-"
            print(f"{w.name:18} {w.summary}  [bad twin: {exp}]")
        return 0
    try:
        w = get(args.name)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    if args.scale < 1:
        raise UsageError("--scale must be >= 1")
    variant = args.variant or ("both" if w.twins else "good")
    devs = args.device or [None]
    try:
        ctxs = [Context(d, sim=True if args.sim else None) for d in devs]
    except TaccError as e:
        raise CommandError(str(e)) from None
    results = []
    try:
        kw: dict[str, Any] = {"scale": args.scale, "check": not args.no_check}
        model_kw = {k: getattr(args, k) for k in ("config", "batch", "prompt", "tokens",
                                                  "dtype", "mode")
                    if getattr(args, k) is not None}
        if model_kw and not w.model:
            raise UsageError(f"{w.name}: --{next(iter(model_kw))} is for the model "
                               "workloads (decode*)")
        kw.update(model_kw)
        if args.storage is not None:
            if not w.storage:
                raise UsageError(f"{w.name}: --storage is for the storage workloads (load)")
            kw["storage"] = args.storage
        if w.multi_device and len(ctxs) > 1:
            kw["extra"] = ctxs[1:]
        for bad in ([True, False] if variant == "both" else [variant == "bad"]):
            results.append(run(w.name, ctxs[0], bad, **kw))
    except UsageError:
        raise
    except TaccError as e:
        raise CommandError(f"{w.name}: {e}") from None
    except AssertionError as e:
        raise CommandError(f"{w.name}: result check failed: {e}") from None
    except ValueError as e:  # a parameter out of the workload's range
        raise UsageError(f"{w.name}: {e}") from None
    finally:
        for c in ctxs:
            c.close()
    out: dict[str, Any] = {"workload": w.name, "pid": os.getpid(),
                           "results": [r.to_json() for r in results]}
    if len(results) == 2 and results[1].device_ns:
        out["bad_over_good_device_time"] = results[0].device_ns / results[1].device_ns
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(_table(results))
        for r in results:
            if "tokens_per_s" in r.extra:
                x = r.extra
                print(f"{r.workload} {r.variant}: time to first token {x['ttft_ms']:.2f} ms, "
                      f"time per output token {x['tpot_ms']:.2f} ms, "
                      f"{x['tokens_per_s']:.1f} tokens/s")
        if "bad_over_good_device_time" in out:
            print(f"bad/good device time: {out['bad_over_good_device_time']:.2f}x")
    return 0
