"""InferenceSession (onnxruntime's interface) and IOBinding over the tacc runtime."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..runtime import Context, DeviceBuffer, TaccError
from ..runtime import apitrace as tr
from ..runtime.graph import Graph
from .lower import FLOATS, INDEX, Step, lower_node

# Node inputs that are shapes or axes: a model input there is specialised to its value.
SHAPE_INPUTS = {"Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Expand": (1,),
                "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,), "Range": (0, 1, 2),
                "Pad": (1, 2, 3), "Split": (1,), "ReduceMean": (1,), "ReduceSum": (1,),
                "ReduceMax": (1,), "ReduceMin": (1,), "TopK": (1,), "Resize": (1, 2, 3)}


class UnsupportedNodeError(TaccError, NotImplementedError):
    """A node the device cannot run (and no ``fallback="cpu"``)."""


@dataclass
class NodeArg:
    """An input or output of the model (onnxruntime's NodeArg)."""

    name: str
    shape: list[int | str | None]
    type: str


@dataclass
class _Val:
    shape: tuple[int, ...]
    dtype: np.dtype
    dev: DeviceBuffer | None = None
    host: np.ndarray | None = None
    const: bool = False
    alias: str = ""          # a view of this value's device memory
    offset: int = 0          # ... from this byte on
    on_device: bool = False  # produced on, or needed by, the device
    own: DeviceBuffer | None = None  # the plan's memory (dev may be a bound buffer instead)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _type_str(elem_type: int) -> str:
    return f"tensor({helper.tensor_dtype_to_string(elem_type).split('.')[-1].lower()})"


class Plan:
    """A model specialised to its input shapes (and shape-input values): the steps, the
    device memory of every value, the constants uploaded once."""

    def __init__(self, sess: InferenceSession, model: onnx.ModelProto,
                 wanted: tuple[str, ...] = ()) -> None:
        self.sess = sess
        self.ctx = sess.ctx
        g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        self.nodes = list(g.node)
        self.inputs = [i.name for i in g.input if i.name not in sess._init_names]
        self.outputs = list(wanted) or [o.name for o in g.output]   # the outputs computed
        self.vals: dict[str, _Val] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            t = vi.type.tensor_type
            if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
                continue
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            if vi.name not in self.vals or -1 not in dims:
                self.vals[vi.name] = _Val(dims, _np_dtype(t.elem_type))
        for init in g.initializer:
            a = numpy_helper.to_array(init)
            self.vals[init.name] = _Val(a.shape, a.dtype, host=a, const=True)
        self._consumers: dict[str, list[onnx.NodeProto]] = {}
        self._producer: dict[str, onnx.NodeProto] = {}
        for n in self.nodes:
            for x in n.input:
                if x:
                    self._consumers.setdefault(x, []).append(n)
            for y in n.output:
                self._producer[y] = n
        self._done: set[int] = set()
        self._step_of: dict[int, Step] = {}
        self.index_norm: dict[str, int] = {}  # fed index inputs: table rows (negatives wrap)
        self.steps: list[Step] = []
        for i, n in enumerate(self.nodes):
            if id(n) in self._done:
                continue
            st = lower_node(self, i)
            if st.run is None:
                self._host_step(st)
            self.steps.append(st)
            for x in st.nodes:
                self._step_of[id(x)] = st
        self._place()

    # ------------------------------------------------ what the lowering asks ---
    def val(self, name: str) -> _Val:
        v = self.vals.get(name)
        if v is None or -1 in v.shape:
            raise _unsupported_shape(name)
        return v

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.val(name).shape)

    def dtype(self, name: str) -> np.dtype:
        return self.val(name).dtype

    def producer(self, name: str) -> onnx.NodeProto | None:
        return self._producer.get(name)

    def consumers(self, name: str) -> list[onnx.NodeProto]:
        return self._consumers.get(name, [])

    def single_use(self, name: str) -> bool:
        return len(self.consumers(name)) == 1 and not self.is_output(name)

    def is_output(self, name: str) -> bool:
        return name in self.outputs

    def is_const(self, name: str) -> bool:
        return self.val(name).const

    def const(self, name: str) -> np.ndarray:
        v = self.val(name)
        assert v.host is not None
        return v.host

    def const_name(self, name: str, arr: np.ndarray) -> str:
        a = np.ascontiguousarray(arr)
        self.vals[name] = _Val(a.shape, a.dtype, host=a, const=True, on_device=True)
        return name

    def const_device(self, arr: np.ndarray) -> DeviceBuffer:
        return self.ctx.to_device(np.ascontiguousarray(arr), self.sess.stream)

    def done(self, node: onnx.NodeProto) -> None:
        self._done.add(id(node))

    def undo(self, node: onnx.NodeProto) -> None:
        """Takes back the step of an earlier node that a later one fuses."""
        st = self._step_of.pop(id(node), None)
        if st is not None and st in self.steps:
            self.steps.remove(st)
            for y in st.outputs:
                if y in self.vals and not self.vals[y].alias:
                    self.vals[y].on_device = False

    def step_of(self, node: onnx.NodeProto) -> Step | None:
        return self._step_of.get(id(node))

    def alias(self, y: str, x: str, shape: tuple[int, ...], offset: int = 0) -> None:
        """``y`` is ``x``'s device memory (from byte ``offset``) seen as ``shape``."""
        vx = self.val(x)
        self.vals[y] = _Val(tuple(shape), vx.dtype, alias=x, on_device=True, offset=offset,
                            const=vx.const and not offset, host=None if vx.host is None
                            or offset else vx.host.reshape(shape))

    def alloc(self, name: str) -> None:
        self.val(name).on_device = True

    def index_input(self, name: str, rows: int) -> None:
        """Gather indices: the device reads int32 in [0, rows); constants and fed inputs
        are converted (negative ones counted from the end, as ONNX says) on the way in."""
        v = self.val(name)
        if v.const and v.host is not None:
            v.host = np.where(v.host < 0, v.host + rows, v.host).astype(np.int32)
        elif name in self.inputs:
            self.index_norm[name] = rows
        v.dtype = np.dtype(np.int32)

    def temp(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> str:
        """A scratch value of the device (a lowering's intermediate)."""
        self.vals[name] = _Val(tuple(shape), np.dtype(dtype), on_device=True)
        return name

    def fold_constant(self, node: onnx.NodeProto) -> None:
        """Evaluates a node of constants (or of static shapes only) on the host, once."""
        from onnx.reference import ReferenceEvaluator

        if node.op_type in ("Shape", "Size"):
            shape = self.shape(node.input[0])
            if node.op_type == "Size":
                a = np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
            else:
                at = {x.name: helper.get_attribute_value(x) for x in node.attribute}
                a = np.array(shape[at.get("start", 0):at.get("end", len(shape))], np.int64)
            self.vals[node.output[0]] = _Val(a.shape, a.dtype, host=a, const=True)
            return
        feeds = {x: self.const(x) for x in node.input if x}
        vi = [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(
            feeds[x].dtype), feeds[x].shape) for x in feeds]
        m = helper.make_model(helper.make_graph([node], "c", vi, [
            helper.make_empty_tensor_value_info(y) for y in node.output if y]),
            opset_imports=[helper.make_opsetid("", self.opset)])
        outs = ReferenceEvaluator(m).run(None, feeds)
        for y, a in zip([y for y in node.output if y], outs, strict=False):
            a = np.asarray(a)
            self.vals[y] = _Val(a.shape, a.dtype, host=a, const=True)

    def dev(self, name: str) -> DeviceBuffer:
        """The device memory of a value (at run time)."""
        v = self.vals[name]
        if v.alias:
            base = self.dev(v.alias)
            return base.view(v.shape, v.dtype, v.offset)  # type: ignore[return-value]
        if v.dev is None:
            raise TaccError(f"tacc.onnx: {name} has no device memory")
        return v.dev

    # --------------------------------------------------------------- places ---
    def _host_step(self, st: Step) -> None:
        if self.sess.fallback != "cpu":
            raise UnsupportedNodeError(
                f"tacc.onnx: node {st.label} is not supported on the device: {st.reason}"
                " (InferenceSession(..., fallback='cpu') runs it on the host)")
        from onnx.reference import ReferenceEvaluator

        node = st.nodes[0]
        vi = [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(
            self.vals[x].dtype), None) for x in node.input if x]
        vo = [helper.make_empty_tensor_value_info(y) for y in node.output if y]
        m = helper.make_model(helper.make_graph([node], "host", vi, vo),
                              opset_imports=[helper.make_opsetid("", self.opset)])
        st.fused = "host"
        st.host_eval = ReferenceEvaluator(m)  # type: ignore[attr-defined]
        for y in node.output:
            if y in self.vals:
                self.vals[y].on_device = False

    def _place(self) -> None:
        """Device memory for every value a device step reads or writes."""
        dev_in: set[str] = set()
        for st in self.steps:
            if st.run is not None:
                for n in st.nodes:
                    dev_in.update(x for x in n.input if x)
        for name, v in self.vals.items():
            if v.alias:
                continue
            if (name in dev_in or v.on_device) and v.const and v.host is not None:
                v.dev = self.const_device(v.host)
            elif v.on_device or name in dev_in:
                if -1 in v.shape:
                    raise _unsupported_shape(name)
                v.dev = self.ctx.device_buffer(v.shape, v.dtype)
            v.own = v.dev

    def free(self) -> None:
        for v in self.vals.values():
            if v.own is not None and not v.alias:
                try:
                    v.own.free()
                except TaccError:
                    pass
            v.dev = v.own = None


def _unsupported_shape(name: str) -> UnsupportedNodeError:
    return UnsupportedNodeError(f"tacc.onnx: the shape of {name!r} is not known from the "
                                "input shapes")


class InferenceSession:
    """Runs an ONNX model on a tacc device, as ``onnxruntime.InferenceSession`` does.

    ``path_or_model``: a file name, bytes, or an ``onnx.ModelProto``.  ``context``: an open
    :class:`~tacc.runtime.Context` (default: one of its own on ``device``, the first PF,
    or the simulator with ``sim=True``).  ``fallback="cpu"`` runs a node the device has
    no command for on the host (numpy, ``onnx.reference``), recorded as API ``host_op``;
    otherwise such a node raises :class:`UnsupportedNodeError` naming it.
    """

    def __init__(self, path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto, *,
                 context: Context | None = None, device: Any = None, sim: bool | None = None,
                 fallback: str | None = None, providers: Any = None, **_: Any) -> None:
        if fallback not in (None, "cpu"):
            raise ValueError(f"fallback={fallback!r}: None or 'cpu'")
        if isinstance(path_or_model, onnx.ModelProto):
            model = path_or_model
        elif isinstance(path_or_model, bytes):
            model = onnx.load_from_string(path_or_model)
        else:
            try:
                model = onnx.load(os.fspath(path_or_model))
            except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
                raise TaccError(f"tacc.onnx: cannot load {path_or_model}: {e}") from None
            except Exception as e:  # protobuf DecodeError: not an ONNX file
                raise TaccError(f"tacc.onnx: {path_or_model} is not an ONNX model "
                                f"({type(e).__name__})") from None
        self.model = model
        self.fallback = fallback
        self._own_ctx = context is None
        self.ctx = context if context is not None else Context(device, sim=sim)
        self.stream = self.ctx.stream()
        self._init_names = {i.name for i in model.graph.initializer}
        self._plans: dict[Any, Plan] = {}
        self._shape_inputs = {n.input[j] for n in model.graph.node
                              for j in SHAPE_INPUTS.get(n.op_type, ())
                              if j < len(n.input) and n.input[j]}

    # ------------------------------------------------------------- metadata ---
    def _args(self, vis: Any) -> list[NodeArg]:
        out = []
        for vi in vis:
            if vi.name in self._init_names:
                continue
            t = vi.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in t.shape.dim]
            out.append(NodeArg(vi.name, shape, _type_str(t.elem_type)))
        return out

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.model.graph.input)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.model.graph.output)

    def get_providers(self) -> list[str]:
        return ["TaccExecutionProvider"] + (["CPUExecutionProvider"] if self.fallback else [])

    # ----------------------------------------------------------------- plan ---
    def plan(self, shapes: dict[str, tuple[tuple[int, ...], np.dtype]],
             values: dict[str, np.ndarray], wanted: tuple[str, ...] = ()) -> Plan:
        """The plan for these input shapes (and values of shape inputs) computing the
        ``wanted`` outputs (default: all); cached."""
        key = (wanted, tuple(sorted((k, tuple(s), str(d)) for k, (s, d) in shapes.items())),
               tuple(sorted((k, v.tobytes()) for k, v in values.items()
                            if k in self._shape_inputs)))
        p = self._plans.get(key)
        if p is not None:
            return p
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        for vi in list(g.input):
            if vi.name in self._shape_inputs and vi.name in values:
                g.initializer.append(numpy_helper.from_array(values[vi.name], vi.name))
            elif vi.name in shapes:
                s, d = shapes[vi.name]
                t = vi.type.tensor_type
                t.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(d))
                del t.shape.dim[:]
                for x in s:
                    t.shape.dim.add().dim_value = int(x)
        try:
            m = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception as e:
            raise TaccError(f"tacc.onnx: shape inference failed: {e}") from None
        self._init_names = {i.name for i in self.model.graph.initializer} | \
            {i.name for i in m.graph.initializer}
        p = Plan(self, m, wanted)
        self._plans[key] = p
        return p

    # ------------------------------------------------------------------ run ---
    def run(self, output_names: list[str] | None, input_feed: dict[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """Runs the model; returns the outputs as numpy arrays (all if ``output_names`` is
        None), as onnxruntime does."""
        b = self.io_binding()
        for k, v in input_feed.items():
            b.bind_cpu_input(k, v)
        names = output_names or [o.name for o in self.model.graph.output]
        for n in names:
            b.bind_output(n)
        self.run_with_iobinding(b)
        return b.copy_outputs_to_cpu()

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: Any = None) -> None:
        """Runs the model on the bound inputs and outputs (returns once it is queued)."""
        self._run(binding, None)

    def capture(self, binding: IOBinding) -> Graph:
        """The model on these bound device buffers as a graph: ``g.launch()`` runs it as
        one submit (inputs updated in place between launches).  Every input must be a
        device buffer and every node a device command."""
        if any(not isinstance(x, DeviceBuffer) for x in binding.inputs.values()):
            raise TaccError("tacc.onnx: a captured model reads device buffers only "
                            "(bind_input)")
        with self.stream.capture() as g:
            self._run(binding, g)
        return g

    def _run(self, binding: IOBinding, graph: Graph | None) -> None:
        s = self.stream
        shapes = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in binding.inputs.items()}
        host_vals = {k: v for k, v in binding.inputs.items() if isinstance(v, np.ndarray)}
        unknown = set(shapes) - {i.name for i in self.model.graph.input}
        if unknown:
            raise ValueError(f"tacc.onnx: unknown input(s) {sorted(unknown)}")
        p = self.plan(shapes, host_vals, tuple(binding.outputs))
        missing = [n for n in p.inputs if n not in binding.inputs and
                   n not in self._shape_inputs]
        if missing:
            raise ValueError(f"tacc.onnx: missing input(s) {missing}")
        for name, out in binding.outputs.items():   # outputs written in place when bound
            v = p.vals.get(name)
            if v is not None and not v.alias and v.own is not None:
                v.dev = out.view(v.shape, v.dtype) if out is not None and \
                    out.nbytes == v.own.nbytes else v.own
        for name in p.inputs:
            v = p.vals[name]
            x = binding.inputs.get(name)
            if x is None or name in self._shape_inputs and v.const:
                continue
            if isinstance(x, DeviceBuffer):
                if x.nbytes != v.nbytes:
                    raise ValueError(f"tacc.onnx: input {name}: {x!r} is not {v.shape} "
                                     f"{v.dtype}")
                v.dev = x.view(v.shape, v.dtype)
                continue
            v.dev = v.own
            arr = np.ascontiguousarray(x, dtype=v.dtype)
            if name in p.index_norm:
                arr = np.where(arr < 0, arr + p.index_norm[name], arr).astype(v.dtype)
            v.host = arr
            if v.dev is not None and arr.size:
                s.copy_h2d(v.dev, arr)
        fresh: set[str] = set(host_vals)
        if graph is not None and any(st.run is None for st in p.steps):
            raise TaccError("tacc.onnx: a model with host nodes cannot be captured: "
                            + ", ".join(st.label for st in p.steps if st.run is None))
        for st in p.steps:
            if st.run is not None:
                st.run(s)
            else:
                self._run_host(p, st, fresh)
        binding._results = {}
        for name in binding.outputs:
            if name not in p.vals:
                raise ValueError(f"tacc.onnx: unknown output {name!r}")
            v = p.vals[name]
            if (v.dev is None and not v.alias) or name in fresh:
                binding._results[name] = np.array(v.host) if v.host is not None else None
                continue
            out = binding.outputs[name]
            src = p.dev(name)
            if out is not None and (src.handle, src.offset) != (out.handle, out.offset):
                s.copy_d2d(out, src.view(out.shape, out.dtype))
            binding._results[name] = out if out is not None else src

    def _run_host(self, p: Plan, st: Step, fresh: set[str]) -> None:
        """A node on the host: its device inputs copied back, its outputs up again."""
        node = st.nodes[0]
        s = self.stream
        feeds = {}
        for x in node.input:
            if not x:
                continue
            v = p.vals[x]
            if v.const or x in fresh:
                feeds[x] = v.host
            else:
                feeds[x] = self.ctx.to_numpy(p.dev(x), s)
        t0 = tr.begin()
        st_ = -1
        try:
            outs = st.host_eval.run(None, feeds)  # type: ignore[attr-defined]
            st_ = 0
        finally:
            if t0:
                tr.end(t0, tr.NAME_ID["host_op"], 0, 0, self.ctx.dev_id, self.ctx.hw_context,
                       st_, f"{node.op_type} {node.name or node.output[0]}")
        for y, a in zip([y for y in node.output if y], outs, strict=False):
            a = np.asarray(a)
            v = p.vals.get(y)
            if v is None:
                p.vals[y] = v = _Val(a.shape, a.dtype)
            v.host = a
            fresh.add(y)
            if v.dev is not None and a.size:
                s.copy_h2d(v.dev, np.ascontiguousarray(a, dtype=v.dtype))

    def close(self) -> None:
        for p in self._plans.values():
            p.free()
        self._plans.clear()
        if self._own_ctx:
            self.ctx.close()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IOBinding:
    """Inputs and outputs bound to device buffers, resident between runs.

    ``bind_input(name, DeviceBuffer)`` reads a device buffer in place;
    ``bind_cpu_input(name, array)`` copies a numpy array up at each run;
    ``bind_output(name, DeviceBuffer)`` writes the output there; ``bind_output(name)``
    leaves it in the session's own device memory (valid until the next run).
    ``get_outputs()`` returns device buffers (numpy arrays for outputs computed on the
    host), ``copy_outputs_to_cpu()`` numpy copies.
    """

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, DeviceBuffer | None] = {}
        self._results: dict[str, Any] = {}

    def bind_input(self, name: str, buf: DeviceBuffer) -> None:
        if not isinstance(buf, DeviceBuffer):
            raise TypeError(f"bind_input {name}: a DeviceBuffer (bind_cpu_input for numpy)")
        self.inputs[name] = buf

    def bind_cpu_input(self, name: str, array: Any) -> None:
        self.inputs[name] = np.asarray(array)

    def bind_output(self, name: str, buf: DeviceBuffer | None = None) -> None:
        if buf is not None and not isinstance(buf, DeviceBuffer):
            raise TypeError(f"bind_output {name}: a DeviceBuffer or None")
        self.outputs[name] = buf

    def clear_binding_inputs(self) -> None:
        self.inputs.clear()

    def clear_binding_outputs(self) -> None:
        self.outputs.clear()

    def synchronize_outputs(self) -> None:
        self.session.stream.synchronize()

    def get_outputs(self) -> list[Any]:
        return [self._results[n] for n in self.outputs]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        s = self.session.stream
        out = []
        for n in self.outputs:
            r = self._results[n]
            if isinstance(r, DeviceBuffer):
                a = np.empty(r.shape, r.dtype)
                if a.size:
                    s.copy_d2h(a, r)
                out.append(a)
            else:
                out.append(r)
        s.synchronize()
        return out


__all__ = ["FLOATS", "INDEX", "IOBinding", "InferenceSession", "NodeArg",
           "UnsupportedNodeError"]
