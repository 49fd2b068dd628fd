"""Batched inference of a small MLP block, double-buffered, checked against numpy.

    Y = relu(X @ W1 + b1) @ W2 + b2

Weights and biases stay on the device.  Inputs are double-buffered: batch i+1 is
uploaded on the copy-in stream while batch i computes, and batch i-1 is downloaded on
the copy-out stream at the same time.  Biases are added by the GEMM itself (C is
preloaded with the broadcast bias by a device-to-device copy, beta = 1).
"""

from __future__ import annotations

import numpy as np

from tacc.runtime import Context, Event

from .common import Result, Span, check_close, jobs_of


def reference(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray
              ) -> np.ndarray:
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
    return h @ w2 + b2


def mlp(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True,
        batch: int = 256, d_in: int = 256, d_hidden: int = 512, d_out: int = 128,
        batches: int | None = None) -> Result:
    """``bad=True`` runs the same work on one stream, waiting for each batch (the
    serialized reference); the default is the double-buffered pipeline."""
    nb = batches or 8 * scale
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(d_hidden)).astype(np.float32)
    w2 = (rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(d_out)).astype(np.float32)
    inputs = [rng.standard_normal((batch, d_in)).astype(np.float32) for _ in range(nb)]

    dw1, dw2 = ctx.to_device(w1), ctx.to_device(w2)
    db1 = ctx.to_device(np.broadcast_to(b1, (batch, d_hidden)).copy())
    db2 = ctx.to_device(np.broadcast_to(b2, (batch, d_out)).copy())
    hx = [ctx.host_buffer((batch, d_in)) for _ in range(2)]
    hy = [ctx.host_buffer((batch, d_out)) for _ in range(2)]
    dx = [ctx.device_buffer((batch, d_in)) for _ in range(2)]
    dh = ctx.device_buffer((batch, d_hidden))
    dy = [ctx.device_buffer((batch, d_out)) for _ in range(2)]
    outputs: list[np.ndarray] = [np.empty(0)] * nb

    if bad:
        s = ctx.stream()
        streams = [s]
        span = Span(ctx, streams)
        for i in range(nb):
            hx[0].array[...] = inputs[i]
            s.copy_h2d(dx[0], hx[0])
            s.copy_d2d(dh, db1)
            s.gemm(dx[0], dw1, dh, beta=1.0)
            s.relu(dh, dh)
            s.copy_d2d(dy[0], db2)
            s.gemm(dh, dw2, dy[0], beta=1.0)
            s.copy_d2h(hy[0], dy[0])
            s.synchronize()
            outputs[i] = hy[0].array.copy()
    else:
        cin, comp, cout = ctx.stream(), ctx.stream(), ctx.stream()
        streams = [cin, comp, cout]
        span = Span(ctx, streams)
        x_free: list[Event | None] = [None, None]  # compute done reading dx[b]
        y_free: list[Event | None] = [None, None]  # download done reading dy[b]
        hx_free: list[Event | None] = [None, None]  # upload done reading hx[b]
        hy_done: list[Event | None] = [None, None]  # download into hy[b] done
        pending: list[int | None] = [None, None]

        def collect(b: int) -> None:
            j = pending[b]
            if j is not None:
                ev = hy_done[b]
                assert ev is not None
                ev.synchronize()
                outputs[j] = hy[b].array.copy()
                pending[b] = None

        for i in range(nb):
            b = i % 2
            if hx_free[b] is not None:
                hx_free[b].synchronize()  # type: ignore[union-attr]
            hx[b].array[...] = inputs[i]  # the host fills the pinned input buffer
            if x_free[b] is not None:
                cin.wait_event(x_free[b])  # type: ignore[arg-type]
            cin.copy_h2d(dx[b], hx[b])
            hx_free[b] = cin.record()
            comp.wait_event(hx_free[b])  # type: ignore[arg-type]
            if y_free[b] is not None:
                comp.wait_event(y_free[b])  # type: ignore[arg-type]
            comp.copy_d2d(dh, db1)
            comp.gemm(dx[b], dw1, dh, beta=1.0)
            comp.relu(dh, dh)
            comp.copy_d2d(dy[b], db2)
            comp.gemm(dh, dw2, dy[b], beta=1.0)
            x_free[b] = comp.record()
            cout.wait_event(x_free[b])  # type: ignore[arg-type]
            collect(b)  # hy[b] from batch i-2 must be read before it is overwritten
            cout.copy_d2h(hy[b], dy[b])
            y_free[b] = hy_done[b] = cout.record()
            pending[b] = i
        for b in (nb % 2, (nb + 1) % 2):
            collect(b)
    jobs = jobs_of(streams)
    span.stop()
    # the device memory back to the context: a buffer lives until freed or its context
    # closes, and a caller running mlp many times on one context (tools/bench/
    # vm_tracing.py, ~100 runs) ran out of device memory at 2.75 MiB per run
    for buf in (dw1, dw2, db1, db2, dh, *hx, *hy, *dx, *dy):
        buf.free()
    err, ok = 0.0, False
    if check:
        for i in range(nb):
            err = max(err, check_close(outputs[i], reference(inputs[i], w1, b1, w2, b2),
                                       rtol=1e-4, atol=1e-4))
        ok = True
    flops = 2 * batch * (d_in * d_hidden + d_hidden * d_out) * nb
    return Result(workload="mlp", variant="serial" if bad else "good", device=ctx.device.pci,
                  device_ns=span.device_ns, wall_ns=span.wall_ns, jobs=jobs,
                  api_calls=jobs, bytes_h2d=nb * batch * d_in * 4,
                  bytes_d2h=nb * batch * d_out * 4, checked=ok, max_abs_err=err,
                  params={"batches": nb, "batch": batch, "d_in": d_in, "d_hidden": d_hidden,
                          "d_out": d_out},
                  extra={"flops": flops})
