"""Device events from the driver's generic netlink family "tacc" (group "events")."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

EVENT_NAMES = {1: "mmu_fault", 2: "hang", 3: "reset", 4: "fatal", 5: "pm", 6: "vf_enable",
               7: "vf_disable", 8: "dma_error"}
ATTRS = (
    ("TACC_A_UNSPEC", "none"), ("TACC_A_EVENT", "uint32"), ("TACC_A_DEVICE", "asciiz"),
    ("TACC_A_MINOR", "uint32"), ("TACC_A_CTX", "uint32"), ("TACC_A_PID", "uint32"),
    ("TACC_A_QUEUE", "uint32"), ("TACC_A_ADDR", "uint64"), ("TACC_A_INFO", "uint32"),
    ("TACC_A_TAG", "uint64"), ("TACC_A_SEQNO", "uint64"), ("TACC_A_TIMESTAMP", "uint64"),
    ("TACC_A_PAD", "none"),
)


def decode(msg: Any) -> dict[str, Any]:
    """A pyroute2 message of the tacc family -> a plain dict."""
    out: dict[str, Any] = {"recv_mono_ns": time.monotonic_ns()}
    for name, _ in ATTRS[1:-1]:
        v = msg.get_attr(name)
        if v is not None:
            out[name[len("TACC_A_"):].lower()] = v
    ev = out.get("event")
    if isinstance(ev, int):
        out["name"] = EVENT_NAMES.get(ev, f"event{ev}")
    return out


class NetlinkEvents:
    """A non-blocking listener; ``fileno()`` for select, ``read()`` returns decoded events.

    pyroute2 resolves the family and its multicast group and decodes messages; the
    socket itself is a plain non-blocking netlink socket, so taccd's select loop owns it.
    """

    def __init__(self) -> None:
        from pyroute2.netlink import genlmsg
        from pyroute2.netlink.generic import GenericNetlinkSocket

        class TaccMsg(genlmsg):
            nla_map = ATTRS

        self.msg_class = TaccMsg
        ctl = GenericNetlinkSocket()
        try:
            ctl.bind("tacc", TaccMsg)
            group = int(ctl.mcast_groups["events"])
        finally:
            ctl.close()
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK,
                                  NETLINK_GENERIC)
        self.sock.bind((0, 0))
        self.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        self.errors = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:  # ENOBUFS: the socket overflowed, events lost
                self.errors += 1
                break
            out.extend(parse(data, self.msg_class))
        return out

    def close(self) -> None:
        self.sock.close()


NETLINK_GENERIC = 16
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1


def parse(data: bytes, msg_class: Any) -> list[dict[str, Any]]:
    out = []
    off = 0
    while off + 16 <= len(data):
        length = struct.unpack_from("<I", data, off)[0]
        if length < 16:
            break
        m = msg_class(data[off:off + length])
        try:
            m.decode()
            out.append(decode(m))
        except Exception:  # noqa: BLE001 - a malformed message is skipped
            pass
        off += (length + 3) & ~3
    return out
