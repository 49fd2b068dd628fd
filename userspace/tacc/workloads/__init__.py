"""Workloads of the tacc runtime: ``mlp`` and the bad/good twins of each inefficiency.

    from tacc.runtime import Context
    from tacc.workloads import WORKLOADS, run_twins

    with Context() as ctx:
        bad, good = run_twins("tiny_transfers", ctx)
        print(bad.device_ns / good.device_ns)

``tacc run NAME`` runs them from the command line.  docs/workloads.md documents each
one and the findings ``tacc analyze`` must report for its bad twin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tacc.runtime import Context

from .common import Result
from .mlp import mlp
from .pipeline import pipeline, pipeline_cut
from .twins import (
    host_bound,
    link_saturation,
    map_churn,
    noisy_neighbour,
    serialized_copies,
    tiny_transfers,
    tlb_thrash,
    unaligned_userptr,
)


def _lazy(module: str, name: str) -> Callable[..., Result]:
    """``module.name``, imported when first run: the decode workloads build ONNX graphs
    (onnx and ml_dtypes: ~20 s of guest time under TCG), which other workloads never need."""
    def fn(*args: Any, **kw: Any) -> Result:
        import importlib

        return getattr(importlib.import_module(f".{module}", __name__), name)(*args, **kw)

    fn.__name__ = fn.__qualname__ = name
    return fn


storage_load = _lazy("load", "load")
decode_main, decode_launch, decode_weights, decode_kv, decode_batch, decode_precision = (
    _lazy("decode", n) for n in ("decode_main", "decode_launch", "decode_weights", "decode_kv",
                                 "decode_batch", "decode_precision"))


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[..., Result]
    summary: str
    expected: tuple[str, ...]  # analysis rules the bad twin must trigger (good: none)
    twins: bool = True
    multi_device: bool = False
    cluster: bool = False  # runs one stage per node of a cluster (docs/cluster.md)
    options: dict[str, Any] = field(default_factory=dict)
    model: bool = False  # takes the model options (tacc run --config/--batch/...)
    storage: bool = False  # reads from storage (tacc run --storage PATH)


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("mlp", mlp, "MLP block inference, double-buffered inputs, checked vs numpy",
             (), twins=False),
    Workload("tiny_transfers", tiny_transfers, "4 KiB copies vs 1 MiB copies",
             ("small_transfers",)),
    Workload("unaligned_userptr", unaligned_userptr,
             "userptr of misaligned slices vs page-aligned arrays", ("host_memory",)),
    Workload("map_churn", map_churn, "register/unregister user memory on every call",
             ("iommu_churn",)),
    Workload("serialized_copies", serialized_copies,
             "upload, GEMM, download in turn on one stream vs overlapped on three",
             ("serialized_copies",)),
    Workload("tlb_thrash", tlb_thrash, "GEMM operands on 4 KiB device pages vs 2 MiB",
             ("tlb_thrash",)),
    Workload("link_saturation", link_saturation,
             "four queues (and VFs) re-uploading inputs vs inputs kept resident",
             ("link_saturation",), multi_device=True),
    Workload("noisy_neighbour", noisy_neighbour,
             "victim uploads while a neighbour function streams (bad) or is quiet (good); "
             "-d VICTIM -d NEIGHBOUR", ("vf_contention",), multi_device=True),
    Workload("host_bound", host_bound,
             "host preparation serialized with the device vs overlapped", ("idle_gaps",)),
    Workload("decode", decode_main,
             "GPT-2-architecture greedy decode (prefill, then one graph replay a step), "
             "weights and KV cache resident, checked vs onnx ReferenceEvaluator", (),
             twins=False, model=True),
    Workload("decode_launch", decode_launch,
             "decode: a submit per op and a host sync per layer vs graph replay per step",
             ("launch_bound",), model=True),
    Workload("decode_weights", decode_weights,
             "decode: every weight re-uploaded before each step vs resident",
             ("redundant_upload",), model=True),
    Workload("decode_kv", decode_kv,
             "decode: the KV cache to the host and back every step vs resident",
             ("kv_roundtrip",), model=True),
    Workload("decode_batch", decode_batch,
             "decode: the sequences one after another at batch 1 vs batched",
             ("memory_bound",), model=True),
    Workload("decode_precision", decode_precision,
             "decode: fp32 weights vs bf16", ("precision",), model=True),
    Workload("load", storage_load,
             "model weights from storage (NVMe) to the device: each tensor read, copied "
             "and uploaded in turn vs read and upload pipelined (a reader thread, double "
             "buffering)", ("load_serialised",), storage=True),
    Workload("pipeline", pipeline,
             "MLP split over two nodes (TCP): one batch in flight vs micro-batches "
             "overlapped; one stage per node (TACC_NODE)", ("pipeline_bubble",),
             cluster=True),
    Workload("pipeline_cut", pipeline_cut,
             "a 3-layer MLP over two nodes cut after its wide layer (16x the bytes on the "
             "link) vs after its narrow one; one stage per node (TACC_NODE)",
             ("network_bound",), cluster=True),
)}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


def run(name: str, ctx: Context, bad: bool = False, **kw: Any) -> Result:
    w = get(name)
    r = w.fn(ctx, bad, **kw)
    r.expected_findings = list(w.expected) if bad and w.twins else []
    return r


def run_twins(name: str, ctx: Context, **kw: Any) -> tuple[Result, Result]:
    """Runs the bad then the good twin; returns (bad, good)."""
    return run(name, ctx, True, **kw), run(name, ctx, False, **kw)


__all__ = ["WORKLOADS", "Result", "Workload", "get", "run", "run_twins"]
