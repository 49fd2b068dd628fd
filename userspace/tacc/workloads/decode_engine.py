"""The decode engine: a static-shape ONNX graph of :mod:`tacc.models.gpt2` lowered onto the
device operations of one stream, with every tensor resident in device memory.

    shared = {}                                     # weights and KV cache, by name
    pre = Engine(ctx, prefill_model, shared)        # the prefill graph (S = P)
    eng = Engine(ctx, step_model, shared)           # the decode step (S = 1), same buffers
    pre.upload_weights(stream)                      # once: weights stay resident
    eng.feed(feeds)                                 # host side of the inputs (pinned)
    eng.run(stream, past)                           # one step, submitted op by op
    with stream.capture() as g:                     # or captured once ...
        eng.run(g.param("pos", high=T - 1), inputs=True, outputs=True)
    g.launch({"pos": past})                         # ... and replayed: one submit a step

The lowering is node by node (one device command per node, views for ``Reshape``):
``Gather`` -> GATHER; ``LayerNormalization`` -> LAYERNORM; ``MatMul`` -> GEMM (a batched
GEMM with a shared operand for ``[N,D] x [H,D,dh]``; a 2-D one past the device's GEMM
limits, e.g. the LM head ``[N,D] x [D,V]``, as block GEMMs; a ``Transpose`` of the last two axes
in front of it becomes ``trans_b``; a following bias ``Add`` of a row vector the GEMM's
bias; a following ``Cast`` to float32 the GEMM's output dtype); ``Mul`` by the scalar
scale, ``Add`` of the mask and ``Softmax`` -> ADD (row broadcast) + SOFTMAX with the scale;
``Gelu`` -> GELU; ``Cast`` -> CAST; ``Add`` -> ADD (same shape or row vector);
``ReduceSum`` over the heads -> GEMM of a row of ones (or ADDs past the device's
dimension limit); ``TensorScatter`` -> one D2D copy per (head, sequence) into the cache in
place, at an offset the parameter block's position gives under replay.

``tacc.range`` names every layer (``L<i>``) so the timeline nests each layer's commands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import tacc
from tacc.runtime import Context, DeviceBuffer, HostBuffer, Stream
from tacc.runtime.buffers import HUGE
from tacc.runtime.ops import GEMM_MAX_DIM


def _dtype(elem: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))


class Unsupported(ValueError):
    """A node this engine does not lower (one line naming it)."""


@dataclass
class Step:
    """One lowered node: ``emit(stream, pos)`` submits (or captures) its commands."""

    node: str
    layer: str
    emit: Callable[[Stream, Any], None]


class Engine:
    """Device buffers for every tensor of ``model`` and its node list lowered to ops.

    ``shared``: name -> device buffer of the weights and of the ``past_*`` inputs (each
    reused as its ``present_*`` output: the cache updated in place), filled with what is
    absent: engines of one model given the same dict share weights and cache.
    """

    def __init__(self, ctx: Context, model: onnx.ModelProto,
                 shared: dict[str, DeviceBuffer] | None = None,
                 external: dict[str, np.ndarray] | None = None) -> None:
        self.ctx = ctx
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        external = external if external is not None else {}
        g = model.graph
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        for vi in (*g.input, *g.output, *g.value_info):
            t = vi.type.tensor_type
            self.shapes[vi.name] = tuple(int(d.dim_value) for d in t.shape.dim)
            self.dtypes[vi.name] = _dtype(t.elem_type)
        self.consts: dict[str, np.ndarray] = {}
        for t in g.initializer:  # in-memory external data (gpt2.build's external=)
            if t.data_location == onnx.TensorProto.EXTERNAL:
                if t.name not in external:
                    raise Unsupported(f"initializer {t.name}: external data not given")
                self.consts[t.name] = external[t.name]
            else:
                self.consts[t.name] = numpy_helper.to_array(t)
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.producer = {o: n for n in g.node for o in n.output}
        self.inputs = [i.name for i in g.input]
        self.outputs = [o.name for o in g.output]
        self.buf: dict[str, DeviceBuffer] = {}
        self.weights: dict[str, DeviceBuffer] = {}
        self.host_weights: dict[str, HostBuffer] = {}
        self.host_in: dict[str, HostBuffer] = {}
        self.host_out: dict[str, HostBuffer] = {}
        self.owned: list[Any] = []
        self.shared = shared if shared is not None else {}
        self.const_uploads: list[tuple[DeviceBuffer, np.ndarray]] = []
        self.kv: dict[str, DeviceBuffer] = {}
        self._kv_arena([n for n in self.inputs if n.startswith("past_")])
        for name in self.inputs:
            if name.startswith("past_"):
                b = self._shared(name, self.shapes[name], self.dtypes[name])
                self.kv[name] = b
                self.buf[name] = b
                self.buf["present_" + name[len("past_"):]] = b
        for name, arr in self.consts.items():
            if self._is_weight(name):
                # a weight of 2 MiB or more on 2 MiB device pages, its size rounded up to
                # them: with the driver's default a 7 MiB weight's last 1.x MiB is on
                # 4 KiB pages, and GPT-2 small's decode step spent ~90 % of its GEMM
                # time walking those pages (docs/measurements.md)
                self.weights[name] = self._shared(name, arr.shape, arr.dtype,
                                                  HUGE if arr.nbytes >= HUGE else None)
                self.buf[name] = self.weights[name]
        self.steps: list[Step] = []
        self.skip: set[str] = set()
        for n in g.node:
            if n.name not in self.skip:
                self._lower(n)
        self.logits = self.buf["logits"]

    # ---------------------------------------------------------- buffers ---
    def _dev(self, shape: tuple[int, ...], dtype: Any, page_size: int | None = None
             ) -> DeviceBuffer:
        b = self.ctx.device_buffer(tuple(shape) or (1,), dtype, page_size=page_size)
        self.owned.append(b)
        return b

    def _shared(self, name: str, shape: tuple[int, ...], dtype: Any,
                page_size: int | None = None) -> DeviceBuffer:
        b = self.shared.get(name)
        if b is None or b.shape != tuple(shape) or b.dtype != dtype:
            b = self.shared[name] = self._dev(shape, dtype, page_size)
        return b

    def _kv_arena(self, names: list[str]) -> None:
        """The KV cache of every layer as views of one buffer, on 2 MiB device pages when
        it is 2 MiB or more (GPT-2 small's 24 caches of 384 KiB a sequence each on 4 KiB
        pages missed the TLB on every attention GEMM); the decoder's other engine finds
        them in ``shared``."""
        todo = [n for n in names if (b := self.shared.get(n)) is None
                or b.shape != tuple(self.shapes[n]) or b.dtype != self.dtypes[n]]
        if not todo:
            return
        size = {n: -(-int(np.prod(self.shapes[n], dtype=np.int64))
                     * np.dtype(self.dtypes[n]).itemsize // 4096) * 4096 for n in todo}
        total = sum(size.values())
        arena = self._dev((total,), np.uint8, HUGE if total >= HUGE else None)
        off = 0
        for n in todo:
            self.shared[n] = arena.view(tuple(self.shapes[n]), self.dtypes[n], off)
            off += size[n]

    def _is_weight(self, name: str) -> bool:
        """Initializers the device reads (the rest: shapes, axes, the scale)."""
        return self.consts[name].dtype != np.int64 and self.consts[name].size > 1

    def tensor(self, name: str) -> DeviceBuffer:
        b = self.buf.get(name)
        if b is None:
            if name in self.inputs:  # a per-step input: device buffer + pinned host side
                shape = self._input_shape(name)
                dt = self.dtypes[name]
                if dt == np.int64:  # token and position ids: the device gathers by int32
                    dt = np.dtype(np.int32)
                b = self._dev(shape, dt)
                self.host_in[name] = self.ctx.host_buffer(shape, dt)
                self.owned.append(self.host_in[name])
            else:
                b = self._dev(self.shapes[name], self.dtypes[name])
            self.buf[name] = b
        return b

    def _input_shape(self, name: str) -> tuple[int, ...]:
        """The mask is broadcast by its Add: kept as a row vector when it is one, else
        expanded to the scores' shape on the host (the device adds same-shape operands or
        a row vector)."""
        shape = self.shapes[name]
        if name == "attn_mask" and shape[0] != 1:
            add = next(n for n in self.consumers[name] if n.op_type == "Add")
            return self.shapes[add.output[0]]
        return shape

    # ------------------------------------------------------------ lowering --
    def _only(self, name: str, op: str) -> onnx.NodeProto | None:
        c = self.consumers.get(name, [])
        return c[0] if len(c) == 1 and c[0].op_type == op else None

    def _alias(self, out: str, src: str) -> None:
        s = self.tensor(src)
        self.buf[out] = s.view(self.shapes[out], s.dtype)  # type: ignore[assignment]

    def _step(self, n: onnx.NodeProto, emit: Callable[[Stream, Any], None]) -> None:
        layer = n.name.split(".")[0]
        self.steps.append(Step(n.name, layer, emit))

    def _lower(self, n: onnx.NodeProto) -> None:  # noqa: C901 (one branch per op type)
        op, ins, out = n.op_type, list(n.input), n.output[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if op in ("Reshape", "Identity", "Unsqueeze", "Squeeze"):
            if ins[0] in self.consts and not self._is_weight(ins[0]):
                raise Unsupported(f"{n.name}: {op} of a constant")
            self._alias(out, ins[0])
            return
        if op == "Transpose":
            mm = self._only(out, "MatMul")
            perm = list(attrs["perm"])
            if mm is None or mm.input[1] != out or perm[-2:] != [len(perm) - 1,
                                                                 len(perm) - 2]:
                raise Unsupported(f"{n.name}: Transpose other than a MatMul's trans_b")
            return  # the MatMul reads its input transposed
        if op == "Gather":
            t, i, o = self.tensor(ins[0]), self.tensor(ins[1]), self.tensor(out)
            self._step(n, lambda s, pos: s.gather(t, i, o))
            return
        if op == "LayerNormalization":
            x, g_, b_, o = (self.tensor(ins[0]), self.tensor(ins[1]), self.tensor(ins[2]),
                            self.tensor(out))
            eps = float(attrs.get("epsilon", 1e-5))
            self._step(n, lambda s, pos: s.layer_norm(x, g_, b_, o, eps=eps))
            return
        if op == "MatMul":
            self._matmul(n)
            return
        if op == "Mul":
            scale = self.consts.get(ins[1])
            add = self._only(out, "Add")
            sm = self._only(add.output[0], "Softmax") if add is not None else None
            if scale is None or scale.size != 1 or sm is None:
                raise Unsupported(f"{n.name}: Mul other than the attention scale")
            # softmax(s*x + m) == softmax(s*(x + m)) for a mask of 0 and MASK_NEG: the
            # scale goes to the softmax, the mask is added to the unscaled scores
            x, m = self.tensor(ins[0]), self.tensor(add.input[1])
            mid, o = self.tensor(add.output[0]), self.tensor(sm.output[0])
            sc = float(scale.reshape(-1)[0])
            self.skip.update((add.name, sm.name))
            self._step(n, lambda s, pos: (s.add(x, m, mid), s.softmax(mid, o, scale=sc)))
            return
        if op == "Softmax":
            x, o = self.tensor(ins[0]), self.tensor(out)
            self._step(n, lambda s, pos: s.softmax(x, o))
            return
        if op == "Add":
            a, b, o = self.tensor(ins[0]), self.tensor(ins[1]), self.tensor(out)
            self._step(n, lambda s, pos: s.add(a, b, o))
            return
        if op == "Gelu":
            x, o = self.tensor(ins[0]), self.tensor(out)
            self._step(n, lambda s, pos: s.gelu(x, o))
            return
        if op == "Cast":
            x, o = self.tensor(ins[0]), self.tensor(out)
            self._step(n, lambda s, pos: s.cast(x, o))
            return
        if op == "ReduceSum":
            self._reduce_heads(n)
            return
        if op == "TensorScatter":
            self._scatter(n)
            return
        raise Unsupported(f"{n.name}: {op} is not supported by the decode engine")

    def _matmul(self, n: onnx.NodeProto) -> None:
        a_name, b_name, out = n.input[0], n.input[1], n.output[0]
        trans_b = False
        prod = self.producer.get(b_name)
        if prod is not None and prod.op_type == "Transpose":
            trans_b, b_name = True, prod.input[0]
        a, b = self.tensor(a_name), self.tensor(b_name)
        bias = None
        cast = self._only(out, "Cast")
        if cast is not None and self.dtypes[cast.output[0]] == np.float32:
            self.skip.add(cast.name)  # the GEMM writes float32
            out = cast.output[0]
        add = self._only(out, "Add")
        if add is not None and add.input[0] == out and add.input[1] in self.weights:
            bv = self.weights[add.input[1]]
            if bv.size == self.shapes[out][-1]:
                bias = bv
                self.skip.add(add.name)
                out = add.output[0]
        c = self.tensor(out)
        if len(a.shape) == len(b.shape) == len(c.shape) == 2:
            # one matrix: block GEMMs past the device's limits (the LM head, B x D x V)
            self._step(n, lambda s, pos: s.gemm_blocks(a, b, c, trans_b=trans_b, bias=bias))
            return
        self._step(n, lambda s, pos: s.gemm(a, b, c, trans_b=trans_b, bias=bias))

    def _reduce_heads(self, n: onnx.NodeProto) -> None:
        axes = self.consts[n.input[1]].reshape(-1).tolist()
        x, o = self.tensor(n.input[0]), self.tensor(n.output[0])
        if axes != [0]:
            raise Unsupported(f"{n.name}: ReduceSum over axes {axes} (only the heads, 0)")
        h, cols = x.shape[0], o.size
        if cols <= GEMM_MAX_DIM:  # one GEMM: ones[1, H] @ x[H, N*D]
            ones = self._shared("ones.heads", (1, h), np.float32)
            self.const_uploads.append((ones, np.ones((1, h), np.float32)))
            xv, ov = x.view((h, cols)), o.view((1, cols))
            self._step(n, lambda s, pos: s.gemm(ones, xv, ov))
            return
        parts = [x.view((cols,), offset=i * cols * x.dtype.itemsize) for i in range(h)]

        def emit(s: Stream, pos: Any) -> None:
            s.add(parts[0], parts[1], o)
            for p in parts[2:]:
                s.add(o, p, o)

        self._step(n, emit)

    def _scatter(self, n: onnx.NodeProto) -> None:
        cache, upd = self.tensor(n.input[0]), self.tensor(n.input[1])
        if self.buf[n.output[0]] is not cache:
            raise Unsupported(f"{n.name}: TensorScatter not in place")
        h, b, t, dh = cache.shape
        s_len = upd.shape[2]
        isz = cache.dtype.itemsize
        row, block = dh * isz, s_len * dh * isz

        def emit(s: Stream, pos: Any) -> None:
            for i in range(h * b):  # one copy per (head, sequence): the cache in place
                s.copy_d2d(cache, upd, block, dst_offset=pos * row + i * t * row,
                           src_offset=i * block)

        self._step(n, emit)

    # ------------------------------------------------------------ running --
    def upload_weights(self, s: Stream, pinned: bool = False) -> None:
        """Every weight to the device (from pinned host copies when ``pinned``: the
        same host bytes each time, as a re-uploading program does)."""
        for name, d in self.weights.items():
            if pinned:
                hb = self.host_weights.get(name)
                if hb is None:
                    hb = self.host_weights[name] = self.ctx.host_buffer(d.shape, d.dtype)
                    hb.array[...] = self.consts[name]
                    self.owned.append(hb)
                s.copy_h2d(d, hb)
            else:
                s.copy_h2d(d, np.ascontiguousarray(self.consts[name]))
        self.upload_consts(s)

    def upload_consts(self, s: Stream) -> None:
        """The constants this engine made (the heads' ones vector), which another engine
        sharing the weights may not have made: a prefill wider than a GEMM dimension sums
        its heads with adds, and its decode step with the ones GEMM."""
        for d, arr in self.const_uploads:
            s.copy_h2d(d, arr)

    def feed(self, feeds: dict[str, np.ndarray]) -> None:
        """The per-step inputs into their pinned host buffers (the mask broadcast to its
        device shape when it is not a row vector)."""
        for name, hb in self.host_in.items():
            hb.array[...] = np.broadcast_to(feeds[name], hb.shape)

    def run(self, s: Stream, pos: Any, inputs: bool = True, outputs: bool = True,
            sync_layers: bool = False) -> None:
        """One step: inputs up, every node, logits down (``pos``: an int or a graph
        Param).  ``sync_layers``: wait for the device after each layer (launch-bound)."""
        if inputs:
            for name, hb in self.host_in.items():
                s.copy_h2d(self.buf[name], hb)
        layer, rng = "", None
        for st in self.steps:
            if st.layer != layer:
                if rng is not None:
                    rng.__exit__(None, None, None)
                    if sync_layers:
                        s.synchronize()
                layer, rng = st.layer, tacc.range(st.layer)
                rng.__enter__()
            st.emit(s, pos)
        if rng is not None:
            rng.__exit__(None, None, None)
        if outputs:
            if "logits" not in self.host_out:
                self.host_out["logits"] = self.ctx.host_buffer(self.logits.shape,
                                                               self.logits.dtype)
                self.owned.append(self.host_out["logits"])
            s.copy_d2h(self.host_out["logits"], self.logits)

    def free(self) -> None:
        """Frees what this engine allocated (shared buffers it made included)."""
        for b in self.owned:
            if not b.freed:
                b.free()
        self.owned.clear()
