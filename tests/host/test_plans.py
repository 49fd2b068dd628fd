"""Each twin workload is defined once, in tacc.plans: what the real twin
(tacc.workloads.twins, on the runtime's simulator backend) submits in its measured
section is its plan's steps, command for command (operation, bytes, GEMM shape, and
which commands share a queue)."""

from __future__ import annotations

from typing import Any

import pytest
from tacc import plans
from tacc.runtime import Context
from tacc.runtime import uapi as U
from tacc.runtime.sim import SimBackend
from tacc.workloads import twins

OPS = {U.OP_COPY_H2D: "copy_h2d", U.OP_COPY_D2H: "copy_d2h", U.OP_GEMM: "gemm",
       U.OP_ELTWISE: "scale"}


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """(op, nbytes, m, n, k, queue) of every command submitted while a Span runs."""
    got: list[tuple[Any, ...]] = []
    live = [0]
    span_cls = twins.Span

    class Recording(span_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            live[0] += 1

        def stop(self) -> int:
            live[0] -= 1
            return super().stop()

    submit, exe = SimBackend.submit, SimBackend._exec
    queue = [0]

    def rec_submit(self: SimBackend, q: int, *a: Any, **kw: Any) -> int:
        queue[0] = q
        return submit(self, q, *a, **kw)

    def rec_exec(self: SimBackend, c: Any) -> int:
        if live[0] and c.opcode in OPS:
            op = OPS[c.opcode]
            if op == "gemm":
                got.append((op, 0, c.m, c.n, c.k, queue[0]))
            else:
                got.append((op, c.size * (4 if op == "scale" else 1), 0, 0, 0, queue[0]))
        return exe(self, c)

    monkeypatch.setattr(twins, "Span", Recording)
    monkeypatch.setattr(SimBackend, "submit", rec_submit)
    monkeypatch.setattr(SimBackend, "_exec", rec_exec)
    return got


def _same_queues(a: list[int], b: list[int]) -> bool:
    """The two labellings partition the commands alike."""
    return len(set(zip(a, b, strict=True))) == len(set(a)) == len(set(b))


@pytest.mark.parametrize("name", sorted(plans.PLANS))
@pytest.mark.parametrize("bad", [True, False])
def test_twin_submits_its_plan(monkeypatch: pytest.MonkeyPatch, name: str, bad: bool) -> None:
    got = _record(monkeypatch)
    ctx = Context(sim=True)
    try:
        getattr(twins, name)(ctx, bad, 1, check=False)
    finally:
        ctx.close()
    plan = plans.PLANS[name](bad, 1)
    want = [(s.op, s.nbytes, s.m, s.n, s.k) for s in plan.steps]
    assert [g[:5] for g in got] == want
    assert _same_queues([g[5] for g in got], [s.stream for s in plan.steps])


def test_plan_shapes() -> None:
    """The figures the documentation gives (docs/workloads.md)."""
    assert plans.tiny_transfers(True).count("copy_h2d") == 512
    assert plans.tiny_transfers(False).count("copy_h2d") == 2
    up = plans.unaligned_userptr(True, 2)
    assert up.iters == 8 and up.params["misalign"] == 64
    assert sum(s.nbytes for s in up.steps if s.op == "copy_h2d") == 8 * 4 * 2**20
    ls = plans.link_saturation(False, 1)
    assert ls.count("copy_h2d") == 4 and ls.count("scale") == 48
    assert plans.link_saturation(True, 1).count("copy_h2d") == 48
