"""One bad workload per inefficiency, each with a good twin doing the same work.

Each function runs one variant on an open context and returns a :class:`Result` with
the device time of the measured section.  docs/workloads.md lists the expected findings
of ``tacc analyze`` for each bad twin (good twins: none).
"""

from __future__ import annotations

import time

import numpy as np

from tacc import plans
from tacc.runtime import Context

from .common import Result, Span, aligned_empty, check_close, jobs_of


def _result(name: str, bad: bool, ctx: Context, span: Span, **kw: object) -> Result:
    return Result(workload=name, variant="bad" if bad else "good", device=ctx.device.pci,
                  device_ns=span.device_ns, wall_ns=span.wall_ns, **kw)  # type: ignore[arg-type]


def tiny_transfers(ctx: Context, bad: bool, scale: int = 1, check: bool = True) -> Result:
    """Upload 2 MiB x scale as 4 KiB copies (bad) or 1 MiB copies (good)."""
    plan = plans.tiny_transfers(bad, scale)
    total, chunk = plan.params["total"], plan.params["chunk"]
    src = ctx.host_buffer(total, np.uint8)
    src.array[:] = np.arange(total, dtype=np.uint64).astype(np.uint8)
    dst = ctx.device_buffer(total, np.uint8)
    s = ctx.stream()
    span = Span(ctx, [s])
    j0 = jobs_of([s])
    for st in plan.steps:
        s.copy_h2d(dst, src, st.nbytes, dst_offset=st.offset, src_offset=st.offset)
    jobs = jobs_of([s]) - j0
    span.stop()
    ok = False
    if check:
        back = ctx.to_numpy(dst)
        assert np.array_equal(back, src.array), "tiny_transfers: device copy differs"
        ok = True
    return _result("tiny_transfers", bad, ctx, span, jobs=jobs, api_calls=total // chunk,
                   bytes_h2d=total, checked=ok, params={"total": total, "chunk": chunk})


def unaligned_userptr(ctx: Context, bad: bool, scale: int = 1, check: bool = True) -> Result:
    """Register user arrays as userptr: misaligned slices (bad) or page-aligned (good);
    upload 4 MiB and download 1 MiB, 4 x scale times."""
    plan = plans.unaligned_userptr(bad, scale)
    n_up, n_down, mis = plan.params["n_up"], plan.params["n_down"], plan.params["misalign"]
    x = aligned_empty(n_up, np.float32, misalign=mis)
    y = aligned_empty(n_down, np.float32, misalign=mis)
    x[:] = np.arange(n_up, dtype=np.float32)
    ux, uy = ctx.wrap(x), ctx.wrap(y)
    d = ctx.device_buffer(n_up)
    s_up, s_down = ctx.stream(), ctx.stream()
    span = Span(ctx, [s_up, s_down])
    iters = plan.iters
    for _ in range(iters):
        s_up.copy_h2d(d, ux)
        s_down.wait_event(s_up.record())
        s_down.copy_d2h(uy, d, n_down * 4)
        s_up.wait_event(s_down.record())
    span.stop()
    ok = False
    if check:
        assert np.array_equal(y, x[:n_down]), "unaligned_userptr: data differs"
        ok = True
    r = _result("unaligned_userptr", bad, ctx, span, jobs=4 * iters, api_calls=6 * iters,
                bytes_h2d=iters * n_up * 4, bytes_d2h=iters * n_down * 4, checked=ok,
                params={"misalign": mis, "iters": iters},
                extra={"userptr_offsets": [ux.offset, uy.offset]})
    ux.free()
    uy.free()
    return r


def map_churn(ctx: Context, bad: bool, scale: int = 1, check: bool = True) -> Result:
    """Per call: register (pin + map + bind) a 256 KiB array, copy, wait, unregister (bad);
    or register it once (good). 64 x scale calls (the iommu_churn rule needs >= 50 maps)."""
    plan = plans.map_churn(bad, scale)
    n = plan.params["n"]  # float32: 256 KiB
    x = aligned_empty(n, np.float32)
    x[:] = 1.5
    d = ctx.device_buffer(n)
    s = ctx.stream()
    iters = plan.iters
    keep = None if bad else ctx.wrap(x)
    span = Span(ctx, [s])
    for i in range(iters):
        x[0] = i
        u = ctx.wrap(x) if bad else keep
        assert u is not None
        s.copy_h2d(d, u)
        s.synchronize()
        if bad:
            u.free()
    span.stop()
    ok = False
    if check:
        got = ctx.to_numpy(d)
        assert got[0] == iters - 1 and np.all(got[1:] == 1.5), "map_churn: data differs"
        ok = True
    if keep is not None:
        keep.free()
    return _result("map_churn", bad, ctx, span, jobs=iters, bytes_h2d=iters * n * 4,
                   api_calls=iters * (4 if bad else 2), checked=ok,
                   params={"iters": iters, "bytes": n * 4})


def serialized_copies(ctx: Context, bad: bool, scale: int = 1, check: bool = True,
                      rows: int = 2048, k: int = 512, n_out: int = 128) -> Result:
    """Batches X_i (rows x k) -> Y_i = X_i @ W: upload, GEMM, download.
    bad: one stream, every step waits for the previous; good: copies on their own
    streams, double-buffered inputs and outputs, so upload i+1 and download i-1 overlap
    GEMM i."""
    iters = plans.serialized_copies(bad, scale, rows, k, n_out).iters
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((k, n_out)) / np.sqrt(k)).astype(np.float32)
    xs = [ctx.host_buffer((rows, k)) for _ in range(2)]
    ys = [ctx.host_buffer((rows, n_out)) for _ in range(2)]
    for i, xb in enumerate(xs):
        xb.array[...] = rng.standard_normal((rows, k), dtype=np.float32) + i
    dw = ctx.to_device(w)
    dx = [ctx.device_buffer((rows, k)) for _ in range(2)]
    dy = [ctx.device_buffer((rows, n_out)) for _ in range(2)]
    results: list[np.ndarray] = []
    if bad:
        s = ctx.stream()
        streams = [s]
        span = Span(ctx, streams)
        for i in range(iters):
            b = i % 2
            s.copy_h2d(dx[b], xs[b])
            s.gemm(dx[b], dw, dy[b])
            s.copy_d2h(ys[b], dy[b])
            s.synchronize()  # the host waits for each batch before the next
            if check and i >= iters - 2:
                results.append(ys[b].array.copy())
    else:
        up, comp, down = ctx.stream(), ctx.stream(), ctx.stream()
        streams = [up, comp, down]
        span = Span(ctx, streams)
        freed_x = [None, None]  # event: compute finished reading dx[b]
        freed_y = [None, None]  # event: download finished reading dy[b]
        for i in range(iters):
            b = i % 2
            if freed_x[b] is not None:
                up.wait_event(freed_x[b])
            up.copy_h2d(dx[b], xs[b])
            comp.wait_event(up.record())
            if freed_y[b] is not None:
                comp.wait_event(freed_y[b])
            comp.gemm(dx[b], dw, dy[b])
            freed_x[b] = comp.record()
            down.wait_event(freed_x[b])
            down.copy_d2h(ys[b], dy[b])
            freed_y[b] = down.record()
        down.synchronize()
        if check:
            results = [ys[(iters - 2) % 2].array.copy(), ys[(iters - 1) % 2].array.copy()]
    jobs = jobs_of(streams)
    span.stop()
    err, ok = 0.0, False
    if check:
        for j, got in enumerate(results):
            b = (iters - 2 + j) % 2
            want = xs[b].array.astype(np.float64) @ w
            err = max(err, check_close(got, want, rtol=1e-4, atol=1e-3))
        ok = True
    return _result("serialized_copies", bad, ctx, span, jobs=jobs, api_calls=3 * iters,
                   bytes_h2d=iters * rows * k * 4, bytes_d2h=iters * rows * n_out * 4,
                   checked=ok, max_abs_err=err,
                   params={"iters": iters, "rows": rows, "k": k, "n": n_out})


def tlb_thrash(ctx: Context, bad: bool, scale: int = 1, check: bool = True,
               m: int = 512) -> Result:
    """GEMMs on m x m operands mapped with 4 KiB device pages (bad) or 2 MiB pages (good)."""
    plan = plans.tlb_thrash(bad, scale, m)
    page = plan.params["page_size"]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, m), dtype=np.float32)
    b = rng.standard_normal((m, m), dtype=np.float32) / m
    s = ctx.stream()
    da = ctx.device_buffer((m, m), page_size=page)
    db = ctx.device_buffer((m, m), page_size=page)
    dc = ctx.device_buffer((m, m), page_size=page)
    s.copy_h2d(da, a)
    s.copy_h2d(db, b)
    s.synchronize()
    iters = plan.iters
    span = Span(ctx, [s])
    for _ in range(iters):
        s.gemm(da, db, dc)
    span.stop()
    err, ok = 0.0, False
    if check:
        err = check_close(ctx.to_numpy(dc), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        ok = True
    return _result("tlb_thrash", bad, ctx, span, jobs=iters, api_calls=iters, checked=ok,
                   max_abs_err=err,
                   params={"m": m, "iters": iters, "page_size": page},
                   extra={"page_sizes": [da.page_size, db.page_size, dc.page_size]})


def link_saturation(ctx: Context, bad: bool, scale: int = 1, check: bool = True,
                    extra: list[Context] | None = None) -> Result:
    """Four queues (on this function and any ``extra`` VF contexts) each run 12 x scale
    steps of ``y = 2 x`` on an 8 MiB input.  bad: every step re-uploads the (unchanged)
    input, so the queues together keep the H2D link saturated; good: the input is uploaded
    once per queue and stays resident."""
    ctxs = [ctx, *(extra or [])]
    plan = plans.link_saturation(bad, scale)
    nq, n, iters = plan.params["queues"], plan.params["n"], plan.iters  # n float32: 8 MiB
    lanes = []
    for q in range(nq):
        c = ctxs[q % len(ctxs)]
        h = c.host_buffer(n)
        h.array[:] = q + 1
        lanes.append((c, c.stream(), h, c.device_buffer(n), c.device_buffer(n)))
    spans = {id(c): Span(c, [ln[1] for ln in lanes if ln[0] is c]) for c in ctxs}
    t0 = time.monotonic_ns()
    for i in range(iters):
        for _c, s, h, dx, dy in lanes:
            if bad or i == 0:
                s.copy_h2d(dx, h)
            s.scale(dx, 2.0, dy)
    for sp in spans.values():
        sp.stop()
    wall = time.monotonic_ns() - t0
    ok = False
    if check:
        for q, (c, _s, _h, _dx, dy) in enumerate(lanes):
            got = c.to_numpy(dy)
            assert np.all(got == 2.0 * (q + 1)), "link_saturation: data differs"
        ok = True
    uploads = iters * nq if bad else nq
    dev_ns = max(sp.device_ns for sp in spans.values())
    return Result(workload="link_saturation", variant="bad" if bad else "good",
                  device=",".join(c.device.pci for c in ctxs), device_ns=dev_ns, wall_ns=wall,
                  jobs=uploads + iters * nq, api_calls=uploads + iters * nq,
                  bytes_h2d=uploads * n * 4, checked=ok,
                  params={"queues": nq, "iters": iters, "bytes": n * 4,
                          "functions": [c.device.pci for c in ctxs]})


def host_bound(ctx: Context, bad: bool, scale: int = 1, check: bool = True) -> Result:
    """Per batch the host prepares an input (numpy work), uploads it and runs a GEMM.
    bad: prepare, submit, wait, in turn (the device idles while the host works);
    good: prepare batch i+1 while the device runs batch i (double buffering)."""
    plan = plans.host_bound(bad, scale)
    m, k, n_out, iters = plan.params["m"], plan.params["k"], plan.params["n"], plan.iters
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((k, n_out)) / np.sqrt(k)).astype(np.float32)
    dw = ctx.to_device(w)
    hx = [ctx.host_buffer((m, k)) for _ in range(2)]
    dx = [ctx.device_buffer((m, k)) for _ in range(2)]
    dy = ctx.device_buffer((m, n_out))
    s = ctx.stream()

    def prepare(i: int, out: np.ndarray) -> None:
        # stands for decoding/normalising an input: a few passes over 1 MiB
        v = np.sin(np.arange(m * k, dtype=np.float32).reshape(m, k) * (0.001 * (i + 1)))
        for _ in range(3):
            v = (v - v.mean(axis=1, keepdims=True)) / (v.std(axis=1, keepdims=True) + 1e-3)
        out[...] = v

    span = Span(ctx, [s])
    done = [None, None]
    if bad:
        for i in range(iters):
            prepare(i, hx[i % 2].array)
            s.copy_h2d(dx[i % 2], hx[i % 2])
            s.gemm(dx[i % 2], dw, dy)
            s.synchronize()
    else:
        prepare(0, hx[0].array)
        for i in range(iters):
            b = i % 2
            s.copy_h2d(dx[b], hx[b])
            done[b] = s.record()
            s.gemm(dx[b], dw, dy)
            if i + 1 < iters:
                nb = (i + 1) % 2
                if done[nb] is not None:
                    done[nb].synchronize()  # its previous upload has finished
                prepare(i + 1, hx[nb].array)
    span.stop()
    err, ok = 0.0, False
    if check:
        err = check_close(ctx.to_numpy(dy), hx[(iters - 1) % 2].array.astype(np.float64) @ w,
                          rtol=1e-4, atol=1e-3)
        ok = True
    return _result("host_bound", bad, ctx, span, jobs=2 * iters, api_calls=3 * iters,
                   bytes_h2d=iters * m * k * 4, checked=ok, max_abs_err=err,
                   params={"iters": iters, "m": m, "k": k})


def noisy_neighbour(ctx: Context, bad: bool, scale: int = 1, check: bool = True,
                    extra: list[Context] | None = None) -> Result:
    """A victim on this function uploads 8 MiB and waits, 40 x scale times.  bad: a
    neighbour (the first ``extra`` context, ideally another VF; else a second context on
    this function) has 32 x scale 8 MiB uploads queued on four queues, sharing the DMA
    engine and the link; good: the neighbour is quiet.  The result is the victim's device
    time, measured from after the neighbour's work was queued (so the host's time to
    queue it is not counted against the victim)."""
    own = not extra
    nb = extra[0] if extra else Context(ctx.device)
    plan = plans.noisy_neighbour(bad, scale)
    n, iters = plan.params["n"], plan.iters  # n float32: 8 MiB
    h = ctx.host_buffer(n)
    h.array[:] = 3.0
    d = ctx.device_buffer(n)
    s = ctx.stream()
    lanes = []
    if bad:
        for _ in range(plan.params["neighbour_queues"]):
            hb = nb.host_buffer(n)
            hb.array[:] = 1.0
            lanes.append((nb.stream(), hb, nb.device_buffer(n)))
    # 32 x scale uploads, queued before the victim starts: with the device's time-scale
    # at 4x (an upload ~1.15 ms, the host queues one in ~0.25 ms) most of them are still
    # queued, so roughly the first 20-28 of the victim's 40 uploads share the engine and
    # the rest run alone, over a 2x range of host speed
    nb_rounds = plan.params["neighbour_rounds"]
    if bad:  # queued at once: runs on the device while the victim loops
        for _ in range(nb_rounds):
            for ns, hb, db in lanes:
                ns.copy_h2d(db, hb)
    span = Span(ctx, [s])
    for _ in range(iters):
        s.copy_h2d(d, h)
        s.synchronize()
    span.stop()
    for ns, _hb, _db in lanes:
        ns.synchronize()
    ok = False
    if check:
        assert np.all(ctx.to_numpy(d) == 3.0), "noisy_neighbour: data differs"
        ok = True
    r = _result("noisy_neighbour", bad, ctx, span, jobs=iters, api_calls=2 * iters,
                bytes_h2d=iters * n * 4, checked=ok,
                params={"iters": iters, "bytes": n * 4, "neighbour": nb.device.pci,
                        "neighbour_bytes": len(lanes) * nb_rounds * n * 4})
    if own:
        nb.close()
    return r
