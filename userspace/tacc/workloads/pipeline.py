"""Pipeline-parallel inference of an MLP over TCP, across two nodes.

    pipeline:      Y = relu(X @ W1 + b1) @ W2 + b2                 (cut after layer 1)
    pipeline_cut:  Y = relu(relu(X @ W1 + b1) @ W2 + b2) @ W3 + b3  (W1 wide, W2 narrow)

Stage 0 (node 0) runs the layers before the cut on its device and sends their output
(the activations) to stage 1 (node 1), which runs the rest on its device and sends Y
back; node 0 checks Y against numpy.  Both nodes draw the same weights from one seed.

``pipeline`` twins (the ``pipeline_bubble`` rule):

* **bad** twin: synchronous, one batch in flight: node 0 sends a batch and waits for its
  answer before it starts the next, node 1 waits for the next batch after answering, so
  each device idles while the other node (and the network) works: pipeline bubbles.
* **good** twin: each batch split into ``micro`` micro-batches, kept in flight (up to
  ``window``): a sender and a receiver thread per node carry the messages while the
  compute thread keeps its device busy with the next micro-batch.

``pipeline_cut`` twins (the ``network_bound`` rule), micro-batches overlapped in both:

* **bad** twin: the model cut after its wide layer (4096 activations per row): 16x the
  bytes of the good twin on the link, which then paces both devices.
* **good** twin: cut after the narrow layer (node 0 runs two layers, node 1 one).

Every message is one header (``HEADER``: kind, index, the runtime tag, origin node,
shape) and its float32 payload.  Node 0 takes one tag per (micro-)batch and runs that
batch's device work under it (``apitrace.adopt_tag``); the tag rides in the header, and
node 1 runs its receive, device work and answer under the same tag: one correlation id
across both nodes' captures.  Sends and receives are API records (``net_send`` /
``net_recv``, bytes = payload, args = peer and index), so the timeline draws them and the
rules see how long a thread waited for its peer.
"""

from __future__ import annotations

import os
import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from tacc.runtime import Context, TaccError, apitrace

from .common import Result, Span, check_close, jobs_of

PORT = 7401
MAGIC = b"TPIP"
VERSION = 1
# magic, version, kind, index, tag, origin node, payload bytes, rows, cols
HEADER = struct.Struct("<4sHHIQIIII")
ACT, RES, END = 1, 2, 3
N_SEND, N_RECV = apitrace.NAME_ID["net_send"], apitrace.NAME_ID["net_recv"]


class PipelineError(TaccError):
    """A peer that does not answer, or a message that is not ours (one line)."""


@dataclass
class Message:
    kind: int
    index: int
    tag: int
    origin: int
    payload: np.ndarray


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise PipelineError(f"the peer stage sent nothing for {sock.gettimeout():.0f} s "
                                f"({got} of {n} bytes)") from None
        if k == 0:
            raise PipelineError(f"peer closed the connection ({got} of {n} bytes)")
        got += k
    return bytes(buf)


class Channel:
    """One TCP connection to the peer stage; every send and receive is an API record."""

    def __init__(self, sock: socket.socket, node: int, peer: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.node = node
        self.peer = peer
        self.sent = 0
        self.received = 0

    def send(self, kind: int, index: int, tag: int, payload: np.ndarray | None = None) -> None:
        data = b"" if payload is None else np.ascontiguousarray(payload, np.float32).tobytes()
        rows, cols = (0, 0) if payload is None else payload.shape
        t0 = apitrace.begin()
        self.sock.sendall(HEADER.pack(MAGIC, VERSION, kind, index, tag, self.node, len(data),
                                      rows, cols) + data)
        self.sent += len(data)
        if t0:
            apitrace.end(t0, N_SEND, tag, len(data), args=f"to {self.peer} #{index}")

    def recv(self) -> Message:
        t0 = apitrace.begin()
        if t0:
            apitrace.flush()  # the calls before a blocking receive, visible during it
        hdr = _recv_exact(self.sock, HEADER.size)
        magic, ver, kind, index, tag, origin, nbytes, rows, cols = HEADER.unpack(hdr)
        if magic != MAGIC or ver != VERSION or nbytes != rows * cols * 4:
            raise PipelineError(f"not a pipeline message from {self.peer} "
                                f"(magic {magic!r}, version {ver}, {nbytes} bytes)")
        arr = np.frombuffer(_recv_exact(self.sock, nbytes), np.float32).reshape(rows, cols) \
            if nbytes else np.zeros((0, 0), np.float32)
        self.received += nbytes
        if t0:
            apitrace.end(t0, N_RECV, tag, nbytes, args=f"from {self.peer} #{index}")
        return Message(kind, index, tag, origin, arr)

    def close(self) -> None:
        self.sock.close()


def node_index() -> int:
    n = os.environ.get("TACC_NODE", "0")
    return int(n) if n.isdigit() else 0


def node_addr(i: int) -> str:
    """Node i's address on the cluster network (scripts/run-vm NODES=N)."""
    return f"169.254.0.{i + 1}"


def connect(addr: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            s.settimeout(timeout)  # a peer silent this long is an error, not a hang
            return s
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise PipelineError(f"stage 1 at {addr}:{port} did not answer within "
                                    f"{timeout:.0f} s: {exc}") from None
            time.sleep(0.1)


def accept(addr: str, port: int, timeout: float) -> socket.socket:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(1)
        ls.settimeout(timeout)
        try:
            conn, _ = ls.accept()
        except TimeoutError:
            raise PipelineError(f"stage 0 did not connect to {addr}:{port} within "
                                f"{timeout:.0f} s") from None
        conn.settimeout(timeout)
        return conn


@dataclass
class Layer:
    w: np.ndarray
    b: np.ndarray
    relu: bool


@dataclass
class Weights:
    layers: list[Layer]
    inputs: list[np.ndarray]

    def reference(self, x: np.ndarray, layers: list[Layer] | None = None) -> np.ndarray:
        """numpy (float64) through ``layers`` (default: all of them)."""
        y = x.astype(np.float64)
        for ly in self.layers if layers is None else layers:
            y = y @ ly.w + ly.b
            if ly.relu:
                y = np.maximum(y, 0)
        return y


def weights(nb: int, batch: int, dims: list[int]) -> Weights:
    """Layers ``dims[i] -> dims[i+1]``, relu after every one but the last."""
    rng = np.random.default_rng(17)
    layers = []
    for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(b)).astype(np.float32)
        layers.append(Layer(w, bias, i < len(dims) - 2))
    inputs = [rng.standard_normal((batch, dims[0])).astype(np.float32) for _ in range(nb)]
    return Weights(layers, inputs)


class _Stage:
    """One stage's device state: its layers, each a GEMM (bias by a D2D-preloaded C,
    beta = 1) and optionally relu, over ``rows``-row (micro-)batches, on one stream."""

    def __init__(self, ctx: Context, layers: list[Layer], rows: int) -> None:
        self.ctx = ctx
        self.s = ctx.stream()
        self.layers = layers
        self.dw = [ctx.to_device(ly.w) for ly in layers]
        self.db = [ctx.to_device(np.broadcast_to(ly.b, (rows, ly.w.shape[1])).copy())
                   for ly in layers]
        self.hx = ctx.host_buffer((rows, layers[0].w.shape[0]))
        self.hy = ctx.host_buffer((rows, layers[-1].w.shape[1]))
        self.dx = ctx.device_buffer((rows, layers[0].w.shape[0]))
        self.dy = [ctx.device_buffer((rows, ly.w.shape[1])) for ly in layers]

    def run(self, x: np.ndarray) -> np.ndarray:
        s = self.s
        self.hx.array[...] = x
        s.copy_h2d(self.dx, self.hx)
        src = self.dx
        for ly, dw, db, dy in zip(self.layers, self.dw, self.db, self.dy, strict=True):
            s.copy_d2d(dy, db)
            s.gemm(src, dw, dy, beta=1.0)
            if ly.relu:
                s.relu(dy, dy)
            src = dy
        s.copy_d2h(self.hy, src)
        s.synchronize()
        return self.hy.array.copy()


def _split(x: np.ndarray, micro: int) -> list[np.ndarray]:
    return list(np.split(x, micro)) if micro > 1 else [x]


def pipeline(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True,
             role: int | None = None, peer: str | None = None, port: int = PORT,
             batches: int | None = None, batch: int = 128, d_in: int = 256,
             d_hidden: int = 256, d_out: int = 256, micro: int = 4, window: int = 4,
             timeout: float | None = None) -> Result:
    """Run this node's stage: ``role`` 0 (default: ``TACC_NODE``) connects to stage 1 at
    ``peer`` (default node 1's address), role 1 listens on its own address (``peer``: the
    address to listen on).  The bad twin sends whole batches synchronously; the good one
    ``micro`` micro-batches per batch, ``window`` in flight."""
    return run_stage(ctx, "pipeline", "bad" if bad else "good", [d_in, d_hidden, d_out], 1,
                     1 if bad else micro, window, batches or 4 * scale, batch, check, role,
                     peer, port, timeout)


def pipeline_cut(ctx: Context, bad: bool = False, scale: int = 1, check: bool = True,
                 role: int | None = None, peer: str | None = None, port: int = PORT,
                 batches: int | None = None, batch: int = 128, d_in: int = 256,
                 d_wide: int = 4096, d_narrow: int = 256, d_out: int = 256, micro: int = 4,
                 window: int = 4, timeout: float | None = None) -> Result:
    """The network-bound twins: a three-layer MLP ``d_in -> d_wide -> d_narrow -> d_out``
    over two nodes, micro-batches overlapped in both.  The bad twin cuts the model after
    the wide layer (node 0 sends ``d_wide`` activations per row: 16x the bytes), the good
    one after the narrow layer (node 0 runs two layers, node 1 one): the same work and
    the same answer, a sixteenth of the bytes on the link."""
    return run_stage(ctx, "pipeline_cut", "bad" if bad else "good",
                     [d_in, d_wide, d_narrow, d_out], 1 if bad else 2, micro, window,
                     batches or 4 * scale, batch, check, role, peer, port, timeout)


def run_stage(ctx: Context, workload: str, variant: str, dims: list[int], cut: int, m: int,
              window: int, nb: int, batch: int, check: bool, role: int | None,
              peer: str | None, port: int, timeout: float | None) -> Result:
    """This node's stage of the model of layers ``dims``: node 0 runs the layers before
    ``cut``, node 1 the rest; ``m`` micro-batches per batch (1: synchronous, one batch
    in flight), ``window`` in flight."""
    if timeout is None:  # how long a stage waits for its peer (TACC_PIPELINE_TIMEOUT)
        timeout = float(os.environ.get("TACC_PIPELINE_TIMEOUT", "") or 120.0)
    role = node_index() if role is None else role
    peer = peer or os.environ.get("TACC_PIPELINE_PEER") or None  # stage 1's address
    if role not in (0, 1):
        raise PipelineError(f"{workload}: node {role} has no stage "
                            "(two stages: nodes 0 and 1)")
    if batch % m:
        raise PipelineError(f"{workload}: batch {batch} does not split into {m} "
                            "micro-batches")
    wt = weights(nb, batch, dims)
    rows = batch // m
    mine = wt.layers[:cut] if role == 0 else wt.layers[cut:]
    stage = _Stage(ctx, mine, rows)
    addr = peer or node_addr(1)
    if role == 0:
        ch = Channel(connect(addr, port, timeout), 0, addr)
    else:
        ch = Channel(accept(addr, port, timeout), 1, "stage 0")
    span = Span(ctx, [stage.s])
    sync = m == 1
    try:
        if role == 0:
            outs, err = (_stage0_bad if sync else _stage0_good)(stage, ch, wt, m, window)
        else:
            outs, err = (_stage1_bad if sync else _stage1_good)(stage, ch, wt, check)
    finally:
        ch.close()
    jobs = jobs_of([stage.s])
    span.stop()
    ok = False
    if check and role == 0:
        for i in range(nb):
            y = np.concatenate(outs[i * m:(i + 1) * m])
            err = max(err, check_close(y, wt.reference(wt.inputs[i]), rtol=1e-4, atol=1e-4))
        ok = True
    elif check:
        ok = True  # every received activation checked (_check_stage1)
    d_x, d_y = mine[0].w.shape[0], mine[-1].w.shape[1]
    return Result(workload=workload, variant=variant, device=ctx.device.pci,
                  device_ns=span.device_ns, wall_ns=span.wall_ns, jobs=jobs,
                  api_calls=jobs, bytes_h2d=nb * batch * d_x * 4,
                  bytes_d2h=nb * batch * d_y * 4, checked=ok, max_abs_err=err,
                  params={"batches": nb, "batch": batch, "micro": m, "window": window,
                          "dims": dims, "cut": cut},
                  extra={"role": role, "peer": addr, "bytes_sent": ch.sent,
                         "bytes_received": ch.received, "messages": nb * m})


def _stage0_bad(stage: _Stage, ch: Channel, wt: Weights, m: int, window: int
                ) -> tuple[list[np.ndarray], float]:
    outs = []
    for i, x in enumerate(wt.inputs):
        with apitrace.adopt_tag(0) as tag:
            h = stage.run(x)
            ch.send(ACT, i, tag, h)
            r = ch.recv()  # the thread that feeds the device waits for its peer
        if r.kind != RES or r.index != i or r.tag != tag:
            raise PipelineError(f"pipeline: answer {r.index} (tag {r.tag:#x}) to batch {i}")
        outs.append(r.payload.copy())
    ch.send(END, len(wt.inputs), 0)
    return outs, 0.0


def _stage1_bad(stage: _Stage, ch: Channel, wt: Weights, check: bool
                ) -> tuple[list[np.ndarray], float]:
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    while True:
        msg = ch.recv()
        if msg.kind == END:
            return [], _check_stage1(stage, seen, wt)
        with apitrace.adopt_tag(msg.tag):
            y = stage.run(msg.payload)
            ch.send(RES, msg.index, msg.tag, y)
        if check:
            seen.append((msg.payload, y))


def _check_stage1(stage: _Stage, seen: list[tuple[np.ndarray, np.ndarray]], wt: Weights
                  ) -> float:
    """Stage 1's answers against numpy, after the pipeline: numpy's float64 GEMMs of a
    wide layer take seconds under TCG, which inside the loop would be the pipeline's
    bottleneck instead of the device or the network the twins are about."""
    return max((check_close(y, wt.reference(h, stage.layers), rtol=1e-4, atol=1e-4)
                for h, y in seen), default=0.0)


class _Pump:
    """A thread per direction: the compute thread never blocks on the network."""

    def __init__(self, ch: Channel) -> None:
        self.ch = ch
        self.outq: queue.Queue[tuple[int, int, int, np.ndarray | None] | None] = queue.Queue()
        self.inq: queue.Queue[Message | BaseException] = queue.Queue()
        self.tx = threading.Thread(target=self._send, name="pipeline-tx", daemon=True)
        self.rx = threading.Thread(target=self._recv, name="pipeline-rx", daemon=True)
        self.tx.start()
        self.rx.start()
        self.error: BaseException | None = None

    def _send(self) -> None:
        try:
            while (item := self.outq.get()) is not None:
                self.ch.send(*item)
        except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
            self.error = exc

    def _recv(self) -> None:
        try:
            while True:
                msg = self.ch.recv()
                self.inq.put(msg)
                if msg.kind == END:
                    return
        except BaseException as exc:  # noqa: BLE001
            self.inq.put(exc)

    def get(self) -> Message:
        item = self.inq.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def finish(self) -> None:
        self.outq.put(None)
        self.tx.join(60)
        if self.error is not None:
            raise self.error


def _stage0_good(stage: _Stage, ch: Channel, wt: Weights, m: int, window: int
                 ) -> tuple[list[np.ndarray], float]:
    pump = _Pump(ch)
    total = len(wt.inputs) * m
    outs: list[np.ndarray] = [np.empty(0)] * total
    tags: list[int] = [0] * total
    in_flight = 0
    done = 0

    def collect() -> None:
        nonlocal in_flight, done
        r = pump.get()
        if r.kind != RES or not 0 <= r.index < total or r.tag != tags[r.index]:
            raise PipelineError(f"pipeline: unexpected answer {r.index} (tag {r.tag:#x})")
        outs[r.index] = r.payload.copy()
        in_flight -= 1
        done += 1

    j = 0
    for x in wt.inputs:
        for part in _split(x, m):
            while in_flight >= window:
                collect()
            with apitrace.adopt_tag(0) as tag:
                tags[j] = tag
                pump.outq.put((ACT, j, tag, stage.run(part)))
            in_flight += 1
            j += 1
    while done < total:
        collect()
    pump.outq.put((END, total, 0, None))
    pump.finish()
    return outs, 0.0


def _stage1_good(stage: _Stage, ch: Channel, wt: Weights, check: bool
                 ) -> tuple[list[np.ndarray], float]:
    pump = _Pump(ch)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    while True:
        msg = pump.get()
        if msg.kind == END:
            break
        with apitrace.adopt_tag(msg.tag):
            y = stage.run(msg.payload)
        pump.outq.put((RES, msg.index, msg.tag, y))
        if check:
            seen.append((msg.payload, y))
    pump.finish()
    return [], _check_stage1(stage, seen, wt)
