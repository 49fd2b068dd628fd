"""ONNX models on tacc: ``InferenceSession(path_or_model).run(output_names, feeds)``.

onnxruntime's interface, so scripts written for it carry over::

    from tacc.onnx import InferenceSession
    sess = InferenceSession("model.onnx")            # the first PF; sim=True: the simulator
    (y,) = sess.run(None, {"x": x})

Supported nodes become device commands (a MatMul followed by the Add of a bias is one GEMM
with bias, Sigmoid(x) * x one SiLU; layout-only nodes are views of the same memory); any
other node raises :class:`UnsupportedNodeError` naming it, or runs on the host with
``fallback="cpu"``.  :class:`IOBinding` keeps inputs and outputs in device memory between
runs.  docs/onnx.md.
"""

from .lower import DEVICE_OPS
from .session import InferenceSession, IOBinding, NodeArg, UnsupportedNodeError

__all__ = ["DEVICE_OPS", "IOBinding", "InferenceSession", "NodeArg", "UnsupportedNodeError"]
