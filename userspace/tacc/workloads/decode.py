"""``decode``: greedy decoding of a GPT-2-architecture model (:mod:`tacc.models.gpt2`) on
the device, and its twins (docs/workloads.md "decode").

Prefill ``prompt`` tokens for ``batch`` sequences, then generate ``tokens`` tokens each
(the first from the prefill's logits, the rest one decode step each), the weights and the
KV cache resident in device memory, every step a replay of a command list captured once
(``with stream.capture()``, one submit a step, the position in the parameter block).
Each step uploads the new token ids, positions and mask, downloads the logits; the host
takes the argmax.  Reported: time to first token (prefill, from the prompt's upload to
the first tokens on the host), time per output token (mean decode step), tokens/s
(generated tokens / the whole run), checked against ``onnx.reference.ReferenceEvaluator``
on the same weights: the same tokens, logits within ``LOGIT_BOUND`` (fp32) or
``BF16_LOGIT_BOUND`` of the float32 reference (bf16 weights).

Twins (the bad variant first):

| twin | bad | good |
|---|---|---|
| ``decode_launch`` | a submit per op, a host sync per layer | graph replay per step |
| ``decode_weights`` | every weight re-uploaded before each step | weights resident |
| ``decode_kv`` | the KV cache downloaded after and uploaded before each step | resident |
| ``decode_batch`` | the sequences one after another at batch 1 | batched |
| ``decode_precision`` | fp32 weights | bf16 weights |
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tacc
from tacc.models import gpt2
from tacc.runtime import Context, HostBuffer, Stream

from .common import Result, Span
from .decode_engine import Engine

LOGIT_BOUND = 2e-3  # |device - reference| of a logit, fp32 weights (tiny: logits' std 1.75)
BF16_LOGIT_BOUND = 0.15  # bf16 weights against the fp32 reference (tests/host/test_models_gpt2)


@dataclass
class Run:
    tokens: np.ndarray  # [B, N]
    logits: list[np.ndarray]  # per generated token: [B, V] (the logits that chose it)
    ttft_ns: int = 0
    step_ns: list[int] = field(default_factory=list)
    load_ns: int = 0
    capture_ns: int = 0
    jobs: int = 0


@functools.lru_cache(maxsize=8)
def _reference(name: str, batch: int, plen: int, n_new: int, seed: int
               ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    cfg = gpt2.get_config(name)
    toks, logits = gpt2.reference_decode(cfg, _weights(name), gpt2.prompt(cfg, batch, plen,
                                                                          seed), n_new)
    return toks, tuple(logits)


@functools.lru_cache(maxsize=2)
def _weights(name: str) -> dict[str, np.ndarray]:
    return gpt2.weights(gpt2.get_config(name))


class Decoder:
    """Prefill and decode-step engines of one (config, dtype, batch, prompt length),
    sharing the weights and the KV cache on the device."""

    def __init__(self, ctx: Context, cfg: gpt2.Config, dtype: str, batch: int, plen: int
                 ) -> None:
        self.ctx, self.cfg, self.batch, self.plen = ctx, cfg, batch, plen
        w = _weights(cfg.name)
        self.shared: dict[str, Any] = {}
        # the weights stay numpy arrays beside the graphs (no copy into the protobuf)
        ext: dict[str, np.ndarray] = {}
        self.pre = Engine(ctx, gpt2.build(cfg, w, dtype, batch, plen, ext), self.shared, ext)
        ext = {}
        self.step = Engine(ctx, gpt2.build(cfg, w, dtype, batch, 1, ext), self.shared, ext)
        self.graph: Any = None
        self.prefill_graph: Any = None
        self.kv_host: dict[str, HostBuffer] = {}

    def load(self, s: Stream) -> int:
        t0 = time.monotonic_ns()
        with tacc.range("load weights"):
            self.pre.upload_weights(s)  # the step engine shares these buffers
            self.step.upload_consts(s)  # and has constants of its own
            s.synchronize()
        return time.monotonic_ns() - t0

    def capture(self, s: Stream) -> int:
        """The prefill and the decode step captured as command lists (launched once per
        prompt / once per step)."""
        t0 = time.monotonic_ns()
        with tacc.range("capture prefill"), s.capture() as gp:
            self.pre.run(s, 0)
        with tacc.range("capture decode step"), s.capture() as g:
            pos = g.param("pos", high=self.cfg.max_len - 1)
            self.step.run(s, pos)
        self.prefill_graph, self.graph = gp, g
        return time.monotonic_ns() - t0

    def warm(self, s: Stream, ids: np.ndarray) -> int:
        """The prefill's first command (the token embedding's GATHER), untimed: the
        runtime's first-use costs (~70 ms of guest time under TCG) then fall outside the
        measured section, one job (no launch-bound run of its own)."""
        t0 = time.monotonic_ns()
        with tacc.range("warm-up"):
            self.pre.feed(gpt2.step_feeds(self.cfg, ids, 0))
            for name, hb in self.pre.host_in.items():
                s.copy_h2d(self.pre.buf[name], hb)
            self.pre.steps[0].emit(s, 0)
            s.synchronize()
        return time.monotonic_ns() - t0

    def kv_out(self, s: Stream) -> None:
        """The whole KV cache to the host (and back with :meth:`kv_in`)."""
        for name, d in self.step.kv.items():
            hb = self.kv_host.get(name)
            if hb is None:
                hb = self.kv_host[name] = self.ctx.host_buffer(d.shape, d.dtype)
            s.copy_d2h(hb, d)
        s.synchronize()

    def kv_in(self, s: Stream) -> None:
        for name, d in self.step.kv.items():
            s.copy_h2d(d, self.kv_host[name])

    def generate(self, s: Stream, ids: np.ndarray, n_new: int, mode: str = "graph",
                 reupload: bool = False, kv_roundtrip: bool = False) -> Run:
        """Greedy decode of ``ids`` ``[B, P]``: ``n_new`` tokens per sequence."""
        cfg = self.cfg
        run = Run(np.zeros((self.batch, n_new), np.int64), [])
        t0 = time.monotonic_ns()
        with tacc.range("prefill"):
            self.pre.feed(gpt2.step_feeds(cfg, ids, 0))
            if mode == "graph":
                self.prefill_graph.launch()
            else:
                self.pre.run(s, 0, sync_layers=mode == "launch")
            s.synchronize()
            last = self.pre.host_out["logits"].array[:, -1, :].copy()
        run.logits.append(last)
        run.tokens[:, 0] = np.argmax(last, axis=-1)
        run.ttft_ns = time.monotonic_ns() - t0
        if kv_roundtrip:
            self.kv_out(s)
        past = ids.shape[1]
        for j in range(1, n_new):
            ts = time.monotonic_ns()
            with tacc.range(f"decode step {j}"):
                if reupload:
                    self.step.upload_weights(s, pinned=True)
                if kv_roundtrip:
                    self.kv_in(s)
                self.step.feed(gpt2.step_feeds(cfg, run.tokens[:, j - 1:j], past))
                if mode == "graph":
                    self.graph.launch({"pos": past})
                else:
                    self.step.run(s, past, sync_layers=mode == "launch")
                s.synchronize()
                if kv_roundtrip:
                    self.kv_out(s)
                last = self.step.host_out["logits"].array[:, -1, :].copy()
            run.logits.append(last)
            run.tokens[:, j] = np.argmax(last, axis=-1)
            run.step_ns.append(time.monotonic_ns() - ts)
            past += 1
        return run

    def free(self) -> None:
        for hb in self.kv_host.values():
            hb.free()
        self.step.free()
        self.pre.free()


def decode(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True, *,
           config: str = "tiny", batch: int = 4, prompt: int = 8, tokens: int = 8,
           dtype: str = "fp32", mode: str = "graph", reupload: bool = False,
           kv_roundtrip: bool = False, serial: bool = False, name: str = "decode",
           prompt_seed: int = 7) -> Result:
    """One decode run (``bad`` is ignored: the twins below choose the variant)."""
    cfg = gpt2.get_config(config)
    n_new = tokens * scale
    if prompt + n_new > cfg.max_len:
        raise ValueError(f"{prompt} + {n_new} tokens exceed the KV cache "
                         f"({cfg.max_len}) of config {config}")
    if mode not in ("graph", "eager", "launch"):
        raise ValueError(f"mode {mode!r}: graph, eager or launch")
    ids = gpt2.prompt(cfg, batch, prompt, prompt_seed)
    s = ctx.stream()
    groups = [(ids[i:i + 1], 1) for i in range(batch)] if serial else [(ids, batch)]
    dec = Decoder(ctx, cfg, dtype, groups[0][1], prompt)
    runs: list[Run] = []
    try:
        load_ns = dec.load(s)
        # before the measured section: the lists' capture, or (op by op) one prefill, so
        # that both pay their first-use costs (lazy imports, the first command of each
        # kind: ~70 ms of guest time under TCG) outside it
        cap_ns = dec.capture(s) if mode == "graph" else dec.warm(s, groups[0][0])
        span = Span(ctx, [s])
        j0 = s.jobs_submitted
        for g_ids, _ in groups:
            runs.append(dec.generate(s, g_ids, n_new, mode, reupload, kv_roundtrip))
        jobs = s.jobs_submitted - j0
        span.stop()
    finally:
        dec.free()
    toks = np.concatenate([r.tokens for r in runs], axis=0)
    logits = [np.concatenate([r.logits[j] for r in runs], axis=0) for j in range(n_new)]
    err, ok = 0.0, False
    if check:
        ref_t, ref_l = _reference(config, batch, prompt, n_new, prompt_seed)
        if not np.array_equal(toks, ref_t):
            bad_at = np.argwhere(toks != ref_t)[0]
            raise AssertionError(f"decode: token of sequence {bad_at[0]} step {bad_at[1]} is "
                                 f"{toks[tuple(bad_at)]}, the reference's "
                                 f"{ref_t[tuple(bad_at)]}")
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(logits, ref_l, strict=True))
        bound = BF16_LOGIT_BOUND if dtype == "bf16" else LOGIT_BOUND
        if not err <= bound:
            raise AssertionError(f"decode: logits differ from the reference by {err:.3g} "
                                 f"(bound {bound})")
        ok = True
    steps = [ns for r in runs for ns in r.step_ns]
    wall = span.wall_ns
    gen = batch * n_new
    return Result(
        workload=name, variant="", device=ctx.device.pci, device_ns=span.device_ns,
        wall_ns=wall, jobs=jobs, api_calls=jobs, checked=ok, max_abs_err=err,
        params={"config": config, "batch": batch, "prompt": prompt, "tokens": n_new,
                "dtype": dtype, "mode": mode, "reupload": reupload,
                "kv_roundtrip": kv_roundtrip, "serial": serial},
        extra={"ttft_ms": runs[0].ttft_ns / 1e6,
               "tpot_ms": float(np.mean(steps)) / 1e6 if steps else 0.0,
               "tokens_per_s": gen / (wall / 1e9) if wall else 0.0,
               "load_ms": load_ns / 1e6, "capture_ms": cap_ns / 1e6,
               "tokens": toks.tolist()})


def _twin(name: str, bad_kw: dict[str, Any], good_kw: dict[str, Any]) -> Any:
    def fn(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True,
           **kw: Any) -> Result:
        r = decode(ctx, scale=scale, check=check, name=name,
                   **{**(bad_kw if bad else good_kw), **kw})
        r.variant = "bad" if bad else "good"
        return r

    fn.__name__ = name
    fn.__doc__ = f"decode twin: bad {bad_kw}, good {good_kw}"
    return fn


def decode_main(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True,
                **kw: Any) -> Result:
    r = decode(ctx, scale=scale, check=check, **kw)
    r.variant = "good"
    return r


decode_launch = _twin("decode_launch", {"mode": "launch"}, {"mode": "graph"})
decode_weights = _twin("decode_weights", {"reupload": True}, {})
decode_kv = _twin("decode_kv", {"kv_roundtrip": True}, {})
decode_batch = _twin("decode_batch", {"serial": True}, {})
decode_precision = _twin("decode_precision", {"dtype": "fp32"}, {"dtype": "bf16"})
