#!/usr/bin/env python3
"""The decode benchmark's set-up costs and the guest's slowdown, on the clock it runs on.

    prof_decode_build.py micro        # the slowdown probes only (host or guest)
    prof_decode_build.py [old]        # + GPT-2 small's weights and decoder build (guest,
                                      #   as root with a tacc device); old: also one graph
                                      #   built with the weights inline, and its shape
                                      #   inference (the cost the in-memory build avoids)

The probes time CPU time (``time.process_time``: on a loaded host, not the wait for a
core): ``pyloop``, 3 M iterations of pure Python (the kind of code the decode's host side
runs); ``np_matmul``, 20 numpy 512 x 512 fp32 matmuls (SIMD).  Their guest / host ratio
under ``-icount shift=0`` is the time-scale that keeps a real part's host/device balance
(docs/measurements.md, the GPT-2 decode section).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "userspace"))


def pyloop() -> float:
    t, x = time.process_time(), 0
    for i in range(3_000_000):
        x += i * i % 7
    return time.process_time() - t


def np_matmul() -> float:
    import numpy as np

    a = np.ones((512, 512), np.float32)
    t = time.process_time()
    for _ in range(20):
        a @ a
    return time.process_time() - t


def main() -> int:
    print(f"pyloop_s {min(pyloop() for _ in range(3)):.4f} "
          f"np_matmul_s {min(np_matmul() for _ in range(2)):.4f}", flush=True)
    if sys.argv[1:2] == ["micro"]:
        return 0
    import onnx
    from tacc.models import gpt2
    from tacc.runtime import Context
    from tacc.workloads import decode

    cfg = gpt2.get_config("gpt2")
    t = time.monotonic()
    w = decode._weights("gpt2")
    print(f"weights_s {time.monotonic() - t:.3f}", flush=True)
    with Context() as ctx:
        t = time.monotonic()
        d = decode.Decoder(ctx, cfg, "fp32", 8, 8)
        print(f"decoder_s {time.monotonic() - t:.3f}", flush=True)
        d.free()
    if "old" in sys.argv[1:]:
        t = time.monotonic()
        m = gpt2.build(cfg, w, "fp32", 8, 1)
        print(f"inline_build_one_graph_s {time.monotonic() - t:.3f}", flush=True)
        t = time.monotonic()
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
        print(f"inline_infer_one_graph_s {time.monotonic() - t:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
