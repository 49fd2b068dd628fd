"""``tacc onnx``: run an ONNX model on a tacc function; the ONNX backend node tests."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tacc.cli import CommandError, UsageError, options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("onnx", help="ONNX models: run one, or the ONNX node tests",
                       description="ONNX models on the device (docs/onnx.md): run one, or the "
                                   "ONNX backend node tests of the supported ops.",
                       epilog="examples:\n  tacc onnx run model.onnx -o out.npz\n"
                              "  tacc onnx test --sim --ops MatMul,Relu")
    s = p.add_subparsers(dest="onnx_cmd", metavar="ACTION", required=True)
    r = s.add_parser("run", help="run a model: its outputs' shapes, dtypes, and an .npz",
                     description="Run an ONNX model on the device: its outputs' shapes and "
                                 "dtypes, optionally saved as an .npz.",
                     epilog="examples:\n  tacc onnx run model.onnx\n"
                            "  tacc onnx run model.onnx -i x=x.npy -o out.npz --fallback cpu",
                     parents=[options.json_flag("print the outputs (name, dtype, shape) as a "
                                                "JSON array")])
    r.add_argument("model", type=Path, metavar="MODEL", help="the .onnx model file")
    r.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeat); default: zeros of its shape")
    r.add_argument("-o", "--output", type=Path, help="write the outputs to this .npz")
    r.add_argument("--sim", action="store_true", help="the runtime's simulator backend")
    r.add_argument("--device", help="PCI address or accel node (default: the first PF)")
    r.add_argument("--fallback", choices=("cpu",), help="run unsupported nodes on the host")
    r.set_defaults(func=_run)
    t = s.add_parser("test", help="the ONNX backend node tests of the supported ops",
                     description="The ONNX backend node tests of the supported ops, on the "
                                 "device or the simulator.",
                     epilog="examples:\n  tacc onnx test\n"
                            "  tacc onnx test --sim --json results.json")
    t.add_argument("--sim", action="store_true", help="the runtime's simulator backend")
    t.add_argument("--device", help="PCI address or accel node (default: the first PF)")
    t.add_argument("--ops", help="comma-separated op types (default: every supported op)")
    t.add_argument("--json", metavar="FILE", help="write every case's result here")
    t.add_argument("-v", "--verbose", action="store_true", help="one line per test case")
    t.set_defaults(func=_test)


def _run(a: argparse.Namespace) -> int:
    import numpy as np

    from tacc.onnx import InferenceSession
    from tacc.runtime import TaccError

    try:
        sess = InferenceSession(a.model, device=a.device, sim=a.sim or None,
                                fallback=a.fallback)
        feeds = {}
        for spec in a.input:
            name, _, f = spec.partition("=")
            if not f:
                raise UsageError(f"--input {spec}: NAME=FILE.npy")
            feeds[name] = np.load(f)
        for i in sess.get_inputs():
            if i.name not in feeds:
                if not all(isinstance(d, int) for d in i.shape):
                    raise UsageError(f"input {i.name} has a symbolic shape {i.shape}: "
                                       "give it with --input")
                dt = "int64" if "int" in i.type else "float32"
                feeds[i.name] = np.zeros(i.shape, dt)
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(names, feeds)
        sess.close()
    except UsageError:
        raise
    except TaccError as e:
        raise CommandError(str(e)) from None
    if a.output:
        np.savez(a.output, **dict(zip(names, outs, strict=True)))
    if a.json:
        print(json.dumps([{"name": n, "dtype": str(o.dtype), "shape": list(o.shape)}
                          for n, o in zip(names, outs, strict=True)]))
        return 0
    for n, o in zip(names, outs, strict=True):
        print(f"{n}: {o.dtype} {list(o.shape)}")
    return 0


def _test(a: argparse.Namespace) -> int:
    from tacc.onnx import conformance
    from tacc.runtime import Context, TaccError

    bad = [o for o in (a.ops.split(",") if a.ops else []) if o not in conformance.DEVICE_OPS]
    if bad:
        raise UsageError(f"onnx test: --ops: not a supported op: {', '.join(bad)}")
    try:  # the device first: its failure is one tacc error line
        Context(a.device, sim=a.sim or None).close()
    except TaccError as e:
        raise CommandError(f"onnx test: {e}") from None

    argv = (["--sim"] if a.sim else []) + (["--device", a.device] if a.device else []) + \
        (["--ops", a.ops] if a.ops else []) + (["--json", a.json] if a.json else []) + \
        (["-v"] if a.verbose else [])
    return conformance.main(argv)
