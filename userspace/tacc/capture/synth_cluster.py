"""Synthetic captures of the two-node pipeline (tacc.workloads.pipeline) for host tests.

One event model in host time (QEMU's host clock), written as two captures, each on its
own CLOCK_MONOTONIC (``node k mono = host - host_offset_k``, the way the clock_sync
pairs' hostclk column relates them): stage 0 on node 0, stage 1 on node 1, the messages
(API ``net_send``/``net_recv``, host net tx/rx packets) and the taccd clock exchanges
(``net_clock``) with random one-way delays.  The truth (offset node1 - node0) is
``host_offset_0 - host_offset_1``.

    python -m tacc.capture.synth_cluster OUT --variant bad|good
"""

from __future__ import annotations

import argparse
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tacc import model

from .schema import NET_CLOCK_DTYPE, HostKind, Opcode
from .synth import Sim

PID = 5100
COMPUTE_TID, TX_TID, RX_TID = 5100, 5101, 5102
HOST0 = 1_700_000_000_000_000_000
BOOT_GAP = 7_345_678_901  # node 1 booted this long after node 0 (its monotonic is behind)
# each stage's work per batch: one fp32 GEMM (rows, n, k), about 2 ms on the model's device;
# a micro-batch is rows / micro rows of it
STAGE_GEMM = (2048, 2048, 1808)


@dataclass
class Net:
    latency_ns: int = 150_000  # one way, per message
    bytes_per_ns: float = 0.1  # 100 MB/s
    mtu: int = 1448


@dataclass
class Model:
    """Both nodes' events in host time, then written to their captures."""

    sims: list[Sim]
    host_offsets: list[int]

    def mono(self, k: int, h: Any) -> Any:
        return np.asarray(h, np.int64) - np.int64(self.host_offsets[k] - HOST0)

    def compute(self, k: int, tid: int, h: int, dur: int, tag: int, name: str = "gemm",
                opcode: int = int(Opcode.GEMM), nbytes: int = 0) -> int:
        """One job (a GEMM) on node k from host time h; returns when its API call saw it
        done."""
        sim = self.sims[k]
        t0 = int(self.mono(k, h))
        r = sim.submit(fid=0, queue=0, pid=PID, tid=tid, api_t0=np.array([t0]), name=name,
                       opcode=opcode, nbytes=nbytes, dur=np.array([dur]),
                       tag=np.array([tag], np.uint64))
        done = sim.synchronize(PID, tid, int(r["api_end"][0]), int(r["end"][0]))
        return h + (done - t0)

    def message(self, a: int, b: int, tag: int, nbytes: int, h_send: int, tx_tid: int,
                h_recv_start: int, rx_tid: int, net: Net) -> tuple[int, int]:
        """A message a -> b sent at host time h_send; the receiver waits from
        h_recv_start.  Returns (send done, receive done) in host time."""
        wire = int(nbytes / net.bytes_per_ns)
        send_end = h_send + 20_000 + wire // 2
        arrive = h_send + 10_000 + net.latency_ns + wire
        recv_end = max(arrive, h_recv_start) + 30_000
        sa, sb = self.sims[a], self.sims[b]
        sa.add_api(PID, tx_tid, "net_send", self.mono(a, h_send), self.mono(a, send_end),
                   tag=tag, nbytes=nbytes, args=f"to node{b}")
        sb.add_api(PID, rx_tid, "net_recv", self.mono(b, h_recv_start), self.mono(b, recv_end),
                   tag=tag, nbytes=nbytes, args=f"from node{a}")
        npk = max(1, -(-nbytes // net.mtu))
        tx = h_send + 10_000 + np.linspace(0, wire, npk).astype(np.int64)
        rx = tx + net.latency_ns
        sa.add_host(HostKind.NET_TX, self.mono(a, tx), pid=PID, tid=tx_tid, size=net.mtu,
                    comm=b"tacc")
        sb.add_host(HostKind.NET_RX, self.mono(b, rx), size=net.mtu)
        return send_end, recv_end

    def exchanges(self, a: int, b: int, h_lo: int, h_hi: int, rng: np.random.Generator,
                  period: int = 250_000_000) -> None:
        """taccd on node a asks node b every ``period``: random one-way delays."""
        h1 = np.arange(h_lo, h_hi, period, dtype=np.int64)
        d_out = rng.integers(40_000, 400_000, len(h1))
        d_back = rng.integers(40_000, 400_000, len(h1))
        turn = rng.integers(5_000, 30_000, len(h1))
        rec = np.zeros(len(h1), NET_CLOCK_DTYPE)
        rec["t1"] = self.mono(a, h1)
        rec["t2"] = self.mono(b, h1 + d_out)
        rec["t3"] = self.mono(b, h1 + d_out + turn)
        rec["t4"] = self.mono(a, h1 + d_out + turn + d_back)
        rec["seq"] = np.arange(1, len(h1) + 1)
        rec["peer_ip"] = struct.unpack("!I", bytes([169, 254, 0, b + 1]))[0]
        rec["peer_node"] = self.sims[b].node.encode()
        self.sims[a].net_clock.append(rec)


def pipeline(variant: str, seed: int = 0, batches: int = 4, micro: int = 4,
             stage_gemm: tuple[int, int, int] = STAGE_GEMM, nbytes: int = 131072,
             net: Net | None = None, host_clock: tuple[bool, bool] = (True, True),
             exchanges: bool = True, names: tuple[str, str] = ("node0", "node1"),
             boot_gap: int = BOOT_GAP, setup_ns: int = 0) -> Model:
    """``stage_gemm``: each stage's GEMM per batch (rows, n, k), timed by tacc.model.
    ``boot_gap``: node 1 booted this long after node 0 (negative: before).
    ``setup_ns``: node 0 uploads its weights (one device job, no tag) this long before the
    pipeline's first message, e.g. while its peer is still starting (the real cluster
    boot: node 1's taccd compiling its BPF program)."""
    net = net or Net()
    rng = np.random.default_rng(seed)
    offs = [HOST0, HOST0 + boot_gap]
    sims = [Sim(seed=seed + k, node=names[k], nvfs=0, host_offset=offs[k],
                host_clock=host_clock[k], device_events=False) for k in range(2)]
    md = Model(sims, offs)
    h0 = max(boot_gap, 0) + 50_000_000  # host time - HOST0 once both nodes are up
    h = h0
    rows, n, k = stage_gemm
    if setup_ns:
        w = 4 * k * n
        md.compute(0, COMPUTE_TID, h0 - setup_ns, model.copy_ns("h2d", w), 0, "copy_h2d",
                   int(Opcode.COPY_H2D), w)
    batch_ns = model.gemm_ns(rows, n, k)
    if variant == "bad":
        h1_free = h  # node 1 is waiting from here
        for i in range(batches):
            tag = (PID << 32) | (i + 1)
            h = md.compute(0, COMPUTE_TID, h, batch_ns, tag)
            s_end, r_end = md.message(0, 1, tag, nbytes, h, COMPUTE_TID, h1_free, COMPUTE_TID,
                                      net)
            h1 = md.compute(1, COMPUTE_TID, r_end + 20_000, batch_ns, tag)
            s1_end, r0_end = md.message(1, 0, tag, nbytes, h1, COMPUTE_TID, s_end,
                                        COMPUTE_TID, net)
            h1_free = s1_end
            h = r0_end + 20_000
        h_end = h
    else:
        total = batches * micro
        part = nbytes // micro
        c0 = c1 = model.gemm_ns(rows // micro, n, k)
        arrive1: list[int] = []
        rx1_free = tx0_free = h
        for j in range(total):
            tag = (PID << 32) | (j + 1)
            h = md.compute(0, COMPUTE_TID, h, c0, tag)
            send_at = max(h, tx0_free)
            s_end, r_end = md.message(0, 1, tag, part, send_at, TX_TID, rx1_free, RX_TID, net)
            tx0_free, rx1_free = s_end, r_end
            arrive1.append(r_end)
            h += 20_000
        h1 = arrive1[0]
        tx1_free = rx0_free = h1
        for j in range(total):
            tag = (PID << 32) | (j + 1)
            h1 = md.compute(1, COMPUTE_TID, max(h1, arrive1[j]) + 10_000, c1, tag)
            send_at = max(h1, tx1_free)
            s_end, r_end = md.message(1, 0, tag, part, send_at, TX_TID, rx0_free, RX_TID, net)
            tx1_free, rx0_free = s_end, r_end
        h_end = max(h, rx0_free)
    if exchanges:
        md.exchanges(0, 1, h0 - 40_000_000, h_end, rng)
        md.exchanges(1, 0, h0 - 30_000_000, h_end, rng)
    return md


def write(md: Model, out: str | Path) -> list[Path]:
    paths = []
    for k, sim in enumerate(md.sims):
        p = Path(out) / f"node{k}"
        sim.write(p)
        paths.append(p)
    return paths


def truth_offset(md: Model) -> float:
    """node 1 mono - node 0 mono at any instant."""
    return float(md.host_offsets[0] - md.host_offsets[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--variant", choices=("bad", "good"), default="bad")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for p in write(pipeline(a.variant, a.seed), a.out):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
