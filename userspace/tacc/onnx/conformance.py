"""The ONNX backend node tests (shipped in the ``onnx`` wheel) through tacc.

Each test case is a one-node model (or its function expansion, ``*_expanded``) with
inputs and expected outputs.  A case runs through :class:`~tacc.onnx.InferenceSession`
on the device (no host fallback): **pass** when every output matches within the tolerance
of its dtype, **partial** when the outputs the device computes match but the case also
asks for ones it does not (LayerNormalization's Mean and InvStdDev other than float32
with stash_type 1: the device's NORM statistics are float32),
**fail** when an output differs (or the device failed), **skip** when the device has no
command for one of its nodes as given (the reason names it).  Each output is also
compared with ``onnx.reference.ReferenceEvaluator`` where that runs the case.

    python -m tacc.onnx.conformance [--sim] [--ops Softmax,Gemm] [--json out.json]

Tolerances (``|out - expected| <= atol + rtol * |expected|``), by output dtype:

| dtype | rtol | atol | why |
|---|---|---|---|
| float32 | 1e-3 | 1e-6 | the backend tests' rtol; fp32 arithmetic in a different order |
| bfloat16 | 2^-7 | 1e-6 | two bf16 ulps (8-bit significand), one from each side's rounding |
| integers, bool | 0 | 0 | exact |
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..runtime import Context, TaccError
from ..runtime import kernels as K
from .lower import DEVICE_OPS
from .session import InferenceSession, UnsupportedNodeError

TOL = {"float32": (1e-3, 1e-6), "bfloat16": (2.0 ** -7, 1e-6)}
# the case modules of the supported ops (Constant has its own; the layout ops too)
CASE_OPS = tuple(op for op in DEVICE_OPS)


@dataclass
class CaseResult:
    name: str
    op: str
    status: str          # pass, partial (some outputs compared: reason), fail, skip
    reason: str = ""
    max_err: float = 0.0      # max |out - expected| / (atol + rtol |expected|), <= 1 passes
    ref_err: float | None = None  # the same against ReferenceEvaluator
    seconds: float = 0.0


def load_cases(ops: tuple[str, ...] | list[str] = CASE_OPS) -> list[tuple[str, Any]]:
    """(op, TestCase) of the node tests of ``ops``, only their modules imported."""
    import onnx.backend.test.case.node as N

    out: list[tuple[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ops:
            mod = f"onnx.backend.test.case.node.{op.lower()}"
            if mod in sys.modules:
                raise RuntimeError(f"{mod} already imported: load_cases once per process")
            start = len(N._NodeTestCases)
            N._TargetOpType = op
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError:
                continue
            finally:
                N._TargetOpType = None
            out.extend((op, c) for c in N._NodeTestCases[start:])
    return out


def _arrays(xs: list[Any]) -> list[np.ndarray]:
    return [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)
            for x in xs]


def _err(out: np.ndarray, exp: np.ndarray) -> float:
    """Worst error as a fraction of the dtype's tolerance (<= 1 passes); inf: mismatch."""
    if out.shape != exp.shape:
        return float("inf")
    if exp.dtype.kind in "fc" or exp.dtype == K.BF16:
        rtol, atol = TOL.get(str(exp.dtype), TOL["float32"])
        o, e = out.astype(np.float64), exp.astype(np.float64)
        nan = np.isnan(e)
        if not np.array_equal(nan, np.isnan(o)):
            return float("inf")
        inf = np.isinf(e)
        if not np.array_equal(o[inf], e[inf]):
            return float("inf")
        ok = ~(nan | inf)
        if not ok.any():
            return 0.0
        return float(np.max(np.abs(o[ok] - e[ok]) / (atol + rtol * np.abs(e[ok]))))
    return 0.0 if np.array_equal(out, exp) else float("inf")


def run_case(ctx: Context, op: str, case: Any, reference: bool = True) -> CaseResult:
    r = CaseResult(case.name, op, "skip")
    t0 = time.monotonic()
    model = case.model
    inputs, expected = case.data_sets[0]
    inputs, expected = _arrays(inputs), _arrays(expected)
    init = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    feeds = dict(zip(names, inputs, strict=False))
    outs = [o.name for o in model.graph.output]
    sess = None
    partial = False
    try:
        sess = InferenceSession(model, context=ctx)
        try:
            got = sess.run(outs, feeds)
        except UnsupportedNodeError as e:
            # statistics the device's NORM does not give (another dtype): compare Y
            if "Mean/InvStdDev" not in str(e):
                raise
            outs, expected = outs[:1], expected[:1]
            got = sess.run(outs, feeds)
            r.reason = "Y only (Mean, InvStdDev: not computed by the device)"
            partial = True
    except UnsupportedNodeError as e:
        r.reason = str(e).removeprefix("tacc.onnx: ").split(" (InferenceSession(")[0]
        r.seconds = time.monotonic() - t0
        return r
    except (TaccError, ValueError, TypeError, IndexError) as e:
        r.status, r.reason = "fail", f"{type(e).__name__}: {e}"
        r.seconds = time.monotonic() - t0
        return r
    finally:
        if sess is not None:
            sess.close()
    r.max_err = max((_err(np.asarray(g), e) for g, e in zip(got, expected, strict=True)),
                    default=0.0)
    r.status = ("partial" if partial else "pass") if r.max_err <= 1.0 else "fail"
    if r.status == "fail":
        r.reason = f"outputs differ: {r.max_err:.3g} x the tolerance"
    if reference:
        try:
            from onnx.reference import ReferenceEvaluator

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = ReferenceEvaluator(model).run(outs, feeds)
            r.ref_err = max((_err(np.asarray(g), np.asarray(e))
                             for g, e in zip(got, ref, strict=True)), default=0.0)
        except Exception:  # the reference cannot run every case (dtypes, custom domains)
            r.ref_err = None
    r.seconds = time.monotonic() - t0
    return r


def run(ctx: Context, cases: list[tuple[str, Any]], reference: bool = True
        ) -> list[CaseResult]:
    return [run_case(ctx, op, c, reference) for op, c in cases]


def summary(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    per: dict[str, dict[str, int]] = defaultdict(
        lambda: {"pass": 0, "partial": 0, "fail": 0, "skip": 0})
    for r in results:
        per[r.op][r.status] += 1
    return dict(sorted(per.items()))


def table(results: list[CaseResult]) -> str:
    cols = ("pass", "partial", "fail", "skip")
    rows = [f"{'op':<20}" + "".join(f" {k:>7}" for k in cols)]
    tot = dict.fromkeys(cols, 0)
    for op, c in summary(results).items():
        rows.append(f"{op:<20}" + "".join(f" {c[k]:>7}" for k in cols))
        for k in tot:
            tot[k] += c[k]
    rows.append(f"{'total':<20}" + "".join(f" {tot[k]:>7}" for k in cols))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tacc.onnx.conformance",
                                 description="ONNX backend node tests through tacc")
    ap.add_argument("--sim", action="store_true", help="the runtime's simulator backend")
    ap.add_argument("--device", help="PCI address or accel node (default: the first PF)")
    ap.add_argument("--ops", help="comma-separated op types (default: every supported op)")
    ap.add_argument("--json", help="write every case's result here")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    a = ap.parse_args(argv)
    ops = a.ops.split(",") if a.ops else list(CASE_OPS)
    bad = [o for o in ops if o not in DEVICE_OPS]
    if bad:
        print(f"conformance: not a supported op: {', '.join(bad)}", file=sys.stderr)
        return 2
    try:
        ctx = Context(a.device, sim=a.sim or None)
    except TaccError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 1
    with ctx:
        results = run(ctx, load_cases(ops))
    if a.verbose:
        for r in results:
            print(f"{r.status:<4} {r.name} {r.reason}")
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary(results), "cases": [asdict(r) for r in results]},
                      f, indent=1)
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
