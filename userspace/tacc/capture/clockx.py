"""Network clock exchange between the nodes' taccd (issue 17, docs/cluster.md).

NTP's on-wire protocol reduced to what an alignment needs: the requester sends its
CLOCK_MONOTONIC ``t1``; the peer's taccd answers with ``t1``, its receive time ``t2`` and
its send time ``t3``; the requester notes ``t4`` when the answer arrives.  Then

    offset (peer - requester) = ((t2 - t1) + (t3 - t4)) / 2
    delay                     = (t4 - t1) - (t3 - t2)

and, whatever the two one-way delays are, the true offset lies within offset +- delay / 2
(the request cannot arrive before it was sent, nor the answer): half the round trip is the
stated uncertainty.  Every exchange becomes one ``net_clock`` record of the requester's
capture; the merge (``tacc.timeline.cluster``) takes the exchange with the smallest delay.

The responder is part of taccd's select loop (``taccd --clock-exchange ADDR``), always on,
one datagram per answer, no state; the requester is a capture's (``tacc trace start
--peers ADDR,...``).  Datagrams are fixed-size and checked (magic, size, version); a
malformed one is ignored.  Kept in its own module: taccd's hot paths are elsewhere.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

import numpy as np

from tacc.capture.schema import NET_CLOCK_DTYPE

PORT = 7475
MAGIC = b"TCX1"
# magic, kind (1 request, 2 answer), seq, t1, t2, t3, node id of the sender (24 bytes)
_MSG = struct.Struct("<4sII qqq 24s")
REQUEST, ANSWER = 1, 2
WAIT_S = 0.03  # a request's answer is awaited this long, then counted as lost


def node_id() -> str:
    return os.environ.get("TACC_NODE_ID") or socket.gethostname()


def _now() -> int:
    return time.monotonic_ns()


def parse_peer(text: str) -> tuple[str, int]:
    """``ADDR`` or ``ADDR:PORT`` (IPv4) -> (addr, port); ValueError with one line."""
    host, _, port = text.strip().partition(":")
    try:
        socket.inet_aton(host)
        p = int(port) if port else PORT
    except (OSError, ValueError):
        raise ValueError(f"peer {text!r}: accepted: an IPv4 address, optionally :PORT") \
            from None
    if not 0 < p < 65536:
        raise ValueError(f"peer {text!r}: port {p} out of range")
    return host, p


class Responder:
    """Answers every request at once, with its own receive and send times."""

    def __init__(self, addr: str, port: int = PORT) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, port))
        self.sock.setblocking(False)
        self.node = node_id().encode()[:24]
        self.answered = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self) -> None:
        while True:
            try:
                data, src = self.sock.recvfrom(256)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            t2 = _now()
            if len(data) != _MSG.size:
                continue
            magic, kind, seq, t1, _, _, _ = _MSG.unpack(data)
            if magic != MAGIC or kind != REQUEST:
                continue
            try:
                self.sock.sendto(_MSG.pack(MAGIC, ANSWER, seq, t1, t2, _now(), self.node), src)
            except OSError:
                continue
            self.answered += 1

    def close(self) -> None:
        self.sock.close()


class Requester:
    """A capture's side: one exchange per peer every ``1 / hz`` s (and a burst of
    ``burst`` at the start, so a short capture has its best sample too)."""

    def __init__(self, peers: list[str], hz: float = 4.0, burst: int = 8) -> None:
        self.peers = [parse_peer(p) for p in peers]
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.seq = 0
        self.burst = burst
        self.t_last = 0.0
        self.lost = 0

    def exchange(self, peer: tuple[str, int]) -> np.ndarray:
        """One request and its answer (empty if none within WAIT_S)."""
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        seq = self.seq
        t1 = _now()
        try:
            self.sock.sendto(_MSG.pack(MAGIC, REQUEST, seq, t1, 0, 0, b""), peer)
        except OSError:
            self.lost += 1
            return np.zeros(0, NET_CLOCK_DTYPE)
        deadline = time.monotonic() + WAIT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                self.lost += 1
                return np.zeros(0, NET_CLOCK_DTYPE)
            try:
                data, src = self.sock.recvfrom(256)
            except OSError:
                continue
            t4 = _now()
            if len(data) != _MSG.size or src[0] != peer[0]:
                continue
            magic, kind, rseq, rt1, t2, t3, node = _MSG.unpack(data)
            if magic != MAGIC or kind != ANSWER or rseq != seq or rt1 != t1:
                continue  # a late answer to an earlier request
            rec = np.zeros(1, NET_CLOCK_DTYPE)
            rec[0] = (t1, t2, t3, t4, seq, struct.unpack("!I", socket.inet_aton(peer[0]))[0],
                      node.rstrip(b"\0"))
            return rec

    def poll(self, now: float, final: bool = False) -> np.ndarray:
        """Records of the exchanges due now (all peers), for the ``net_clock`` stream."""
        n = self.burst if self.burst else 1
        if not (self.burst or final or (self.period and now - self.t_last >= self.period)):
            return np.zeros(0, NET_CLOCK_DTYPE)
        self.burst = 0
        self.t_last = now
        out = [self.exchange(p) for _ in range(n) for p in self.peers]
        return np.concatenate(out) if out else np.zeros(0, NET_CLOCK_DTYPE)

    def close(self) -> None:
        self.sock.close()


def offsets(recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offset peer - requester, half round trip) in ns of each exchange."""
    t1, t2, t3, t4 = (recs[k].astype(np.float64) for k in ("t1", "t2", "t3", "t4"))
    return ((t2 - t1) + (t3 - t4)) / 2.0, ((t4 - t1) - (t3 - t2)) / 2.0
