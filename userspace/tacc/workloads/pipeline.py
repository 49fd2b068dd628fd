"""Pipeline-parallel inference of the MLP over TCP, across two nodes (issue 17).

    Y = relu(X @ W1 + b1) @ W2 + b2

Stage 0 (node 0) computes ``H = relu(X @ W1 + b1)`` on its device and sends H to stage 1
(node 1), which computes ``Y = H @ W2 + b2`` on its device and sends Y back; node 0 checks
Y against numpy.  Both nodes draw the same weights from one seed.

* **bad** twin: synchronous, one batch in flight: node 0 sends a batch and waits for its
  answer before it starts the next, node 1 waits for the next batch after answering, so
  each device idles while the other node (and the network) works: pipeline bubbles.
* **good** twin: each batch split into ``micro`` micro-batches, kept in flight (up to
  ``window``): a sender and a receiver thread per node carry the messages while the
  compute thread keeps its device busy with the next micro-batch.

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
from .mlp import reference

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
class Weights:
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    inputs: list[np.ndarray]


def weights(nb: int, batch: int, d_in: int, d_hidden: int, d_out: int) -> Weights:
    rng = np.random.default_rng(17)
    w1 = (rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(d_hidden)).astype(np.float32)
    w2 = (rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(d_out)).astype(np.float32)
    inputs = [rng.standard_normal((batch, d_in)).astype(np.float32) for _ in range(nb)]
    return Weights(w1, b1, w2, b2, inputs)


class _Stage:
    """One stage's device state: a GEMM layer (bias by a D2D-preloaded C, beta = 1) and
    optionally relu, over ``rows``-row (micro-)batches, on one stream."""

    def __init__(self, ctx: Context, w: np.ndarray, b: np.ndarray, rows: int, relu: bool
                 ) -> None:
        self.ctx = ctx
        self.s = ctx.stream()
        self.relu = relu
        d_in, d_out = w.shape
        self.dw = ctx.to_device(w)
        self.db = ctx.to_device(np.broadcast_to(b, (rows, d_out)).copy())
        self.hx = ctx.host_buffer((rows, d_in))
        self.hy = ctx.host_buffer((rows, d_out))
        self.dx = ctx.device_buffer((rows, d_in))
        self.dy = ctx.device_buffer((rows, d_out))

    def run(self, x: np.ndarray) -> np.ndarray:
        s = self.s
        self.hx.array[...] = x
        s.copy_h2d(self.dx, self.hx)
        s.copy_d2d(self.dy, self.db)
        s.gemm(self.dx, self.dw, self.dy, beta=1.0)
        if self.relu:
            s.relu(self.dy, self.dy)
        s.copy_d2h(self.hy, self.dy)
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
    if timeout is None:  # how long a stage waits for its peer (TACC_PIPELINE_TIMEOUT)
        timeout = float(os.environ.get("TACC_PIPELINE_TIMEOUT", "") or 120.0)
    role = node_index() if role is None else role
    peer = peer or os.environ.get("TACC_PIPELINE_PEER") or None  # stage 1's address
    if role not in (0, 1):
        raise PipelineError(f"pipeline: node {role} has no stage (two stages: nodes 0 and 1)")
    nb = batches or 4 * scale
    m = 1 if bad else micro
    if batch % m:
        raise PipelineError(f"pipeline: batch {batch} does not split into {m} micro-batches")
    wt = weights(nb, batch, d_in, d_hidden, d_out)
    rows = batch // m
    if role == 0:
        stage = _Stage(ctx, wt.w1, wt.b1, rows, relu=True)
        addr = peer or node_addr(1)
        ch = Channel(connect(addr, port, timeout), 0, addr)
    else:
        stage = _Stage(ctx, wt.w2, wt.b2, rows, relu=False)
        addr = peer or node_addr(1)
        ch = Channel(accept(addr, port, timeout), 1, "stage 0")
    span = Span(ctx, [stage.s])
    try:
        if role == 0:
            outs, err = (_stage0_bad if bad else _stage0_good)(stage, ch, wt, m, window)
        else:
            outs, err = (_stage1_bad if bad else _stage1_good)(stage, ch, wt, check)
    finally:
        ch.close()
    jobs = jobs_of([stage.s])
    span.stop()
    ok = False
    if check and role == 0:
        for i in range(nb):
            y = np.concatenate(outs[i * m:(i + 1) * m])
            err = max(err, check_close(y, reference(wt.inputs[i], wt.w1, wt.b1, wt.w2, wt.b2),
                                       rtol=1e-4, atol=1e-4))
        ok = True
    elif check:
        ok = True  # every received activation checked in _stage1_*
    return Result(workload="pipeline", variant="bad" if bad else "good", device=ctx.device.pci,
                  device_ns=span.device_ns, wall_ns=span.wall_ns, jobs=jobs,
                  api_calls=jobs, bytes_h2d=nb * batch * (d_in if role == 0 else d_hidden) * 4,
                  bytes_d2h=nb * batch * (d_hidden if role == 0 else d_out) * 4,
                  checked=ok, max_abs_err=err,
                  params={"batches": nb, "batch": batch, "micro": m, "window": window,
                          "d_in": d_in, "d_hidden": d_hidden, "d_out": d_out},
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
    err = 0.0
    while True:
        msg = ch.recv()
        if msg.kind == END:
            return [], err
        with apitrace.adopt_tag(msg.tag):
            y = stage.run(msg.payload)
            ch.send(RES, msg.index, msg.tag, y)
        if check:
            err = max(err, _check_stage1(msg.payload, y, wt))


def _check_stage1(h: np.ndarray, y: np.ndarray, wt: Weights) -> float:
    return check_close(y, h.astype(np.float64) @ wt.w2 + wt.b2, rtol=1e-4, atol=1e-4)


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
    err = 0.0
    while True:
        msg = pump.get()
        if msg.kind == END:
            break
        with apitrace.adopt_tag(msg.tag):
            y = stage.run(msg.payload)
        pump.outq.put((RES, msg.index, msg.tag, y))
        if check:
            err = max(err, _check_stage1(msg.payload, y, wt))
    pump.finish()
    return [], err
