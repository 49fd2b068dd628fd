"""QMP from inside the test VM.

scripts/run-vm proxies a virtio-serial port named ``org.tacc.qmp`` to a QMP
monitor of the VM's QEMU, so in-guest tests can inject device faults
(``qom-set``) and read the device model's ground truth (``qom-get``).
The session is shared by everyone who opens the port, so this client
re-negotiates tolerantly and matches replies by id, skipping events.
It is not qemu.qmp (which the host-side tacc.testing.qtest uses): the port is a
character device (qemu.qmp speaks over sockets and asyncio), one opener at a time,
and under -icount its wait must spin rather than sleep (see _messages).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PORT_NAME = "org.tacc.qmp"
PF_QOM = "/machine/peripheral/tacc0"  # the PF's QOM path (scripts/run-vm: id=tacc0)


class QMPError(Exception):
    """A QMP command returned an error (class and description)."""


def find_port() -> Path:
    for d in Path("/sys/class/virtio-ports").glob("vport*"):
        if (d / "name").read_text().strip() == PORT_NAME:
            return Path("/dev") / d.name
    raise FileNotFoundError(f"no virtio-serial port named {PORT_NAME} (not in the test VM?)")


class GuestQMP:
    def __init__(self, path: Path | None = None, timeout: float = 30.0) -> None:
        self.fd = self._open(path or find_port(), timeout)
        self.timeout = timeout
        self._buf = ""
        self._ids = itertools.count(int(time.monotonic_ns() % 1_000_000) * 1000)
        self._dec = json.JSONDecoder()
        try:
            self.execute("qmp_capabilities")
        except QMPError:
            pass  # already negotiated by an earlier user of the shared session
        except BaseException:
            # a virtio-serial port has one opener at a time: a leaked fd (the negotiation
            # timed out under load, e.g. taccd's 2 s icount query) made every later open
            # fail with EBUSY for the rest of the boot
            os.close(self.fd)
            raise

    @staticmethod
    def _open(path: Path, timeout: float) -> int:
        """Open the port, waiting while another user holds it: a virtio-serial port has
        one opener at a time, and taccd's icount query or another test may hold it for a
        moment (EBUSY) -- take turns rather than fail."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return os.open(path, os.O_RDWR | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> GuestQMP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _messages(self, deadline: float):
        while True:
            self._buf = self._buf.lstrip()
            if self._buf:
                try:
                    obj, end = self._dec.raw_decode(self._buf)
                    self._buf = self._buf[end:]
                    yield obj
                    continue
                except json.JSONDecodeError:
                    pass
            if time.monotonic() >= deadline:
                raise TimeoutError("QMP: no reply")
            # Poll, never idle: under -icount (sleep=off) an idle guest's clock jumps
            # to its next timer, so a blocking wait for the host's reply let the guest
            # clock run through the whole timeout in well under a second of host time
            # whenever run-vm's proxy was slow to answer on a loaded host ("QMP: no
            # reply" in strict-b, session 9).  Spinning, guest time moves with the
            # instructions run, i.e. with the host CPU the guest actually gets.
            r, _, _ = select.select([self.fd], [], [], 0)
            if not r:
                os.sched_yield()
            else:
                try:
                    chunk = os.read(self.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    os.sched_yield()  # host side not connected yet (as above: no idle)
                self._buf += chunk.decode()

    def execute(self, cmd: str, **args: Any) -> Any:
        rid = f"g{next(self._ids)}"
        msg = {"execute": cmd, "id": rid}
        if args:
            msg["arguments"] = args
        data = json.dumps(msg).encode() + b"\r\n"
        while data:
            try:
                data = data[os.write(self.fd, data):]
            except BlockingIOError:
                select.select([], [self.fd], [], 1.0)
        for obj in self._messages(time.monotonic() + self.timeout):
            if obj.get("id") != rid:
                continue  # greeting, events, replies to others
            if "error" in obj:
                raise QMPError(f"{obj['error'].get('class')}: {obj['error'].get('desc')}")
            return obj.get("return")
        raise AssertionError("unreachable")

    def qom_get(self, path: str, prop: str) -> Any:
        return self.execute("qom-get", path=path, property=prop)

    def qom_set(self, path: str, prop: str, value: Any) -> None:
        self.execute("qom-set", path=path, property=prop, value=value)


@contextmanager
def device_time_scale(scale: int) -> Iterator[None]:
    """Every modelled duration of the device x ``scale``/1000 (QOM ``time-scale``,
    docs/hardware.md section 1) inside the block, 1x after it."""
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "time-scale", scale)
    try:
        yield
    finally:
        with GuestQMP() as q:
            q.qom_set(PF_QOM, "time-scale", 1000)
