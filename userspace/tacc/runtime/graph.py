"""Graphs: a stream's commands captured once, launched many times as one job.

    with stream.capture() as g:
        pos = g.param("pos", high=1023)          # a value of the parameter block
        stream.copy_d2d(k_cache, k_new, nbytes=row, dst_offset=pos * row)
        stream.softmax(scores, probs, causal=True, pos_offset=pos)
    for t in range(n):
        g.launch({"pos": t})                     # one submit; the device reads pos

Nothing runs while capturing.  ``launch`` writes the parameter block and submits the whole
list as one job (one submit ioctl, one completion); the device executes the listed
commands in order, each still its own trace record (with the list's id).  A parameter is
an integer; a command field given as ``param * scale + bias`` is computed by the device
from the block when the command runs, so the list is never rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import apitrace as tr
from .errors import TaccError

if TYPE_CHECKING:
    from .stream import Stream

PARAM_SLOTS = 16


@dataclass(frozen=True)
class Param:
    """``block[slot] * scale + bias``: a command field taken from the parameter block.

    ``low``/``high`` bound the value (the launch refuses a parameter outside its range;
    the runtime checks operands against the range at capture)."""

    graph_id: int
    slot: int
    name: str
    lo: int
    hi: int
    scale: int = 1
    bias: int = 0

    def _affine(self, scale: int, bias: int) -> Param:
        return Param(self.graph_id, self.slot, self.name, self.lo, self.hi, scale, bias)

    def __mul__(self, k: int) -> Param:
        if not isinstance(k, int) or k < 0:
            return NotImplemented
        return self._affine(self.scale * k, self.bias * k)

    __rmul__ = __mul__

    def __add__(self, k: int) -> Param:
        if not isinstance(k, int):
            return NotImplemented
        return self._affine(self.scale, self.bias + k)

    __radd__ = __add__

    @property
    def low(self) -> int:
        return self.lo * self.scale + self.bias

    @property
    def high(self) -> int:
        return self.hi * self.scale + self.bias

    def value_in(self, block: np.ndarray) -> int:
        return int(block[self.slot]) * self.scale + self.bias

    def __repr__(self) -> str:
        s = self.name + (f"*{self.scale}" if self.scale != 1 else "")
        return s + (f"+{self.bias}" if self.bias else "")


@dataclass
class Entry:
    """One captured command: an inference :class:`~tacc.runtime.ops.Op`, or the bytes of
    a direct command (copies, GEMM fp32, element-wise) with its Param fields."""

    op: Any = None
    cmd: bytes = b""
    patches: list[tuple[str, Param]] = field(default_factory=list)


_next_graph = [1]


class Graph:
    """A captured command list of one stream (``Stream.capture()``)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.id = _next_graph[0]
        _next_graph[0] += 1
        self.entries: list[Entry] = []
        self.params: dict[str, Param] = {}
        self.block = np.zeros(PARAM_SLOTS, np.int64)
        self.capturing = False
        self.launches = 0
        self.device_list: Any = None  # the encoded list in device memory (driver backend)

    def __repr__(self) -> str:
        return f"<Graph {self.id} {len(self.entries)} cmds on {self.stream!r}>"

    def __len__(self) -> int:
        return len(self.entries)

    def __enter__(self) -> Graph:
        self.stream._capture = self
        self.capturing = True
        self._t0 = tr.begin()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stream._capture = None
        self.capturing = False
        ctx = self.stream.ctx
        st = -1
        try:
            if exc_type is None:
                if not self.entries:
                    raise TaccError(f"{self!r}: nothing was captured")
                if not ctx.backend.sim:
                    from .cmdcodec import upload_graph

                    self.device_list = upload_graph(self)
                st = 0
        finally:
            if self._t0:
                tr.end(self._t0, tr.NAME_ID["graph_capture"], 0, 0, ctx.dev_id,
                       ctx.hw_context, st, f"graph={self.id} cmds={len(self.entries)}")

    def param(self, name: str, *, low: int = 0, high: int = (1 << 31) - 1) -> Param:
        """A named integer of the parameter block, given to each ``launch``."""
        if not self.capturing:
            raise TaccError(f"{self!r}: parameters are declared while capturing")
        if name in self.params:
            return self.params[name]
        if len(self.params) >= PARAM_SLOTS:
            raise TaccError(f"{self!r}: more than {PARAM_SLOTS} parameters")
        if not 0 <= low <= high < 1 << 31:
            raise ValueError(f"param {name}: bad range [{low}, {high}]")
        p = Param(self.id, len(self.params), name, low, high)
        self.params[name] = p
        return p

    def _record(self, items: list[Any], patches: list[tuple[str, Any]]) -> None:
        for pr in (patches or []):
            self._own(pr[1])
        for it in items:
            if isinstance(it, bytes):
                self.entries.append(Entry(cmd=it, patches=list(patches or [])))
            else:
                for v in it.p.values():
                    if isinstance(v, Param):
                        self._own(v)
                self.entries.append(Entry(op=it))

    def _own(self, p: Param) -> None:
        if p.graph_id != self.id:
            raise TaccError(f"{p!r} belongs to another graph")

    def launch(self, params: dict[str, int] | None = None) -> None:
        """Writes ``params`` into the parameter block and submits the list: one job."""
        s = self.stream
        ctx = s.ctx
        t0 = tr.begin()
        tag = tr.next_tag()
        st = -1
        try:
            s._check()
            if self.capturing or s._capture is not None:
                raise TaccError(f"{self!r}: a graph is launched outside a capture")
            given = dict(params or {})
            unknown = set(given) - set(self.params)
            if unknown:
                raise ValueError(f"{self!r}: unknown parameter(s) {sorted(unknown)}")
            for name, p in self.params.items():
                if name in given:
                    v = int(given[name])
                    if not p.lo <= v <= p.hi:
                        raise ValueError(f"{self!r}: {name}={v} outside [{p.lo}, {p.hi}]")
                    self.block[p.slot] = v
            s._submit(1, ops=[Launch(self, self.block.copy(), tag)])
            self.launches += 1
            st = 0
        finally:
            if t0:
                tr.end(t0, tr.NAME_ID["graph_launch"], tag, 0, ctx.dev_id, ctx.hw_context, st,
                       f"graph={self.id} cmds={len(self.entries)} "
                       + " ".join(f"{k}={int(self.block[p.slot])}"
                                  for k, p in self.params.items()))


@dataclass
class Launch:
    """A graph launch as a job's one command (the list, its parameter block, the tag)."""

    graph: Graph
    block: np.ndarray
    tag: int
