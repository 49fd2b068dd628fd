"""Minimal QEMU qtest + QMP client (no guest kernel), for device-level tests.

Starts ``qemu-system-x86_64 -accel qtest`` with a qtest UNIX socket (we listen,
QEMU connects) and a QMP socket, and offers the qtest line protocol: port and
memory accesses, ``clock_step``.  Under ``-accel qtest`` the virtual clock only
moves on ``clock_step``, so device timing is exact and repeatable.

Also: PCI config access through q35's ECAM (we program PCIEXBAR ourselves: no
firmware runs under qtest) and a small BAR allocator.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
QEMU = ROOT / "build" / "qemu" / "qemu-system-x86_64"

ECAM_BASE = 0xB000_0000  # q35 PCIEXBAR, 256 MiB (buses 0..255)
Q35_PCIEXBAR = 0x60


class QTestError(RuntimeError):
    pass


class QMP:
    """QMP over QEMU's monitor socket, through qemu.qmp (QEMU's own Python QMP library):
    its synchronous QEMUMonitorProtocol; a command's error is a QTestError."""

    def __init__(self, path: str, timeout: float = 10.0):
        from qemu.qmp import ConnectError
        from qemu.qmp.legacy import QEMUMonitorProtocol

        deadline = time.monotonic() + timeout
        while True:  # QEMU creates the socket when it starts: wait for it
            self.mon = QEMUMonitorProtocol(path)
            try:
                self.mon.connect()  # the greeting and qmp_capabilities
                break
            except (ConnectError, OSError):
                self.mon.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.mon.settimeout(timeout)

    def cmd(self, name: str, **args):
        from qemu.qmp import ExecuteError

        try:
            return self.mon.cmd(name, **args)
        except ExecuteError as e:
            raise QTestError(f"{name}: {e}") from None

    def close(self):
        try:
            self.mon.close()
        except Exception:  # noqa: BLE001 (QEMU gone after quit: nothing to close)
            pass


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies.  QEMU does not exit
    when its qtest socket closes, so a killed test would leave it running."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class QTest:
    """A QEMU under the qtest accelerator."""

    def __init__(self, args: list[str], qemu: Path | str = QEMU, memory: str = "512M",
                 log: str | None = None):
        self.dir = tempfile.mkdtemp(prefix="tacc-qtest-")
        self.settle: Callable[[], None] | None = None
        qsock = os.path.join(self.dir, "qtest.sock")
        msock = os.path.join(self.dir, "qmp.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(qsock)
        srv.listen(1)
        srv.settimeout(30)
        argv = [str(qemu), "-machine", "q35", "-accel", "qtest", "-qtest", f"unix:{qsock}",
                "-qmp", f"unix:{msock},server=on,wait=off", "-display", "none",
                "-nodefaults", "-m", memory, "-L", "/usr/share/seabios",
                "-L", "/usr/share/qemu", *args]
        self.log_path = log or os.path.join(self.dir, "qemu.log")
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        try:
            self.sock, _ = srv.accept()
        except TimeoutError as e:
            self.proc.kill()
            raise QTestError(f"QEMU did not connect: {self.log()}") from e
        finally:
            srv.close()
        self.rf = self.sock.makefile("rb")
        self.reply_timeout: float | None = None  # seconds per reply (None: wait)
        self._defer = 0
        self._deferred: list[str] = []
        self._clock = 0
        self.qmp = QMP(msock)

    # ------------------------------------------------------------ protocol --
    def died(self) -> str:
        """How QEMU ended ("" while it runs), e.g. "QEMU died with SIGFPE"."""
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        if rc < 0:
            return f"QEMU died with {signal.Signals(-rc).name}"
        return f"QEMU exited with status {rc}"

    def cmd(self, line: str) -> str:
        if self._deferred:  # pending writes go first, in the same round trip
            lines, self._deferred = [*self._deferred, line], []
            return self.batch(lines)[-1]
        return self.batch([line])[0]

    def _write(self, line: str):
        if self._defer:
            self._deferred.append(line)
        else:
            self.cmd(line)

    def flush(self):
        """Send the queued writes now."""
        if self._deferred:
            lines, self._deferred = self._deferred, []
            self.batch(lines)

    @contextlib.contextmanager
    def deferred(self):
        """Queue writes (and send them with the next read, or at the end):
        one round trip instead of one per write.  Errors surface late."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
            if not self._defer:
                self.flush()

    def batch(self, lines: list[str]) -> list[str]:
        """Send several commands in one write (one round trip), return their
        replies in order."""
        self.sock.settimeout(self.reply_timeout)
        self.sock.sendall("".join(f"{line}\n" for line in lines).encode())
        return [self._reply(line) for line in lines]

    def _reply(self, line: str) -> str:
        while True:
            try:
                rsp = self.rf.readline()
            except TimeoutError as e:
                raise QTestError(f"no qtest reply within {self.reply_timeout} s to {line!r}") from e
            if not rsp:
                raise QTestError(f"qtest socket closed after {line!r}: {self.died()}: {self.log()}")
            rsp = rsp.decode().strip()
            if rsp.startswith("IRQ"):
                continue
            if rsp.startswith("OK"):
                return rsp[2:].strip()
            raise QTestError(f"{line!r} -> {rsp}")

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self):
        try:
            self.qmp.cmd("quit")
        except Exception:
            pass
        self.qmp.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self._logf.close()

    # ---------------------------------------------------------------- I/O --
    def outl(self, port: int, v: int):
        self._write(f"outl {port:#x} {v:#x}")

    def inl(self, port: int) -> int:
        return int(self.cmd(f"inl {port:#x}"), 0)

    def readl(self, a: int) -> int:
        return int(self.cmd(f"readl {a:#x}"), 0)

    def readq(self, a: int) -> int:
        return int(self.cmd(f"readq {a:#x}"), 0)

    def readw(self, a: int) -> int:
        return int(self.cmd(f"readw {a:#x}"), 0)

    def readb(self, a: int) -> int:
        return int(self.cmd(f"readb {a:#x}"), 0)

    def writel(self, a: int, v: int):
        self._write(f"writel {a:#x} {v & 0xFFFFFFFF:#x}")

    def writeq(self, a: int, v: int):
        self._write(f"writeq {a:#x} {v & 0xFFFFFFFFFFFFFFFF:#x}")

    def writew(self, a: int, v: int):
        self._write(f"writew {a:#x} {v & 0xFFFF:#x}")

    def writeb(self, a: int, v: int):
        self._write(f"writeb {a:#x} {v & 0xFF:#x}")

    def memwrite(self, a: int, data: bytes):
        if data:
            self._write(f"b64write {a:#x} {len(data):#x} {base64.b64encode(data).decode()}")

    def memread(self, a: int, n: int) -> bytes:
        if n == 0:
            return b""
        return base64.b64decode(self.cmd(f"b64read {a:#x} {n:#x}"))

    def memset(self, a: int, n: int, v: int = 0):
        self._write(f"memset {a:#x} {n:#x} {v:#x}")

    def clock_step(self, ns: int | None = None, settle: bool = True) -> int:
        """Advance the virtual clock by ns (or to the next timer); returns it.
        Then, unless settle is False, self.settle() (if set) lets the
        completions the device deferred to host work happen (the virtual
        clock does not move meanwhile)."""
        if ns == 0:
            return self._clock
        self._clock = int(self.cmd("clock_step" if ns is None else f"clock_step {ns}"))
        if settle and self.settle:
            self.settle()
        return self._clock

    def clock(self) -> int:
        """The virtual clock (it only moves with clock_step under qtest)."""
        return self._clock

    # --------------------------------------------------------- PCI (ECAM) --
    def ecam_enable(self):
        """Map q35's ECAM (MMCONFIG) window: PCIEXBAR of the MCH at 00:00.0."""
        self.outl(0xCF8, 0x8000_0000 | (Q35_PCIEXBAR + 4))
        self.outl(0xCFC, 0)
        self.outl(0xCF8, 0x8000_0000 | Q35_PCIEXBAR)
        self.outl(0xCFC, ECAM_BASE | 1)  # enable, 256 buses

    @staticmethod
    def ecam(bus: int, devfn: int, off: int) -> int:
        return ECAM_BASE | bus << 20 | devfn << 12 | off

    def cfg_read(self, bus, devfn, off, size=4) -> int:
        a = self.ecam(bus, devfn, off)
        return {1: self.readb, 2: self.readw, 4: self.readl}[size](a)

    def cfg_write(self, bus, devfn, off, v, size=4):
        a = self.ecam(bus, devfn, off)
        {1: self.writeb, 2: self.writew, 4: self.writel}[size](a, v)

    def find_devices(self, vendor: int, device: int | None = None, bus: int = 0):
        out = []
        for devfn in range(256):
            vd = self.cfg_read(bus, devfn, 0)
            if vd & 0xFFFF == vendor and (device is None or vd >> 16 == device):
                out.append(devfn)
        return out

    def find_cap(self, bus, devfn, cap_id) -> int:
        p = self.cfg_read(bus, devfn, 0x34, 1)
        while p:
            if self.cfg_read(bus, devfn, p, 1) == cap_id:
                return p
            p = self.cfg_read(bus, devfn, p + 1, 1)
        return 0

    def find_ext_cap(self, bus, devfn, cap_id) -> int:
        p = 0x100
        while p:
            h = self.cfg_read(bus, devfn, p)
            if h & 0xFFFF == cap_id:
                return p
            p = h >> 20
        return 0

    def bar_size(self, bus, devfn, bar_off) -> tuple[int, bool]:
        """Size a memory BAR at config offset bar_off; returns (size, is64)."""
        lo = self.cfg_read(bus, devfn, bar_off)
        is64 = (lo & 0x6) == 0x4
        self.cfg_write(bus, devfn, bar_off, 0xFFFFFFFF)
        m = self.cfg_read(bus, devfn, bar_off) & ~0xF
        self.cfg_write(bus, devfn, bar_off, lo)
        if is64:
            hi = self.cfg_read(bus, devfn, bar_off + 4)
            self.cfg_write(bus, devfn, bar_off + 4, 0xFFFFFFFF)
            mh = self.cfg_read(bus, devfn, bar_off + 4)
            self.cfg_write(bus, devfn, bar_off + 4, hi)
            m |= mh << 32
            return ((~m) & 0xFFFFFFFFFFFFFFFF) + 1, True
        return ((~m) & 0xFFFFFFFF) + 1, False

    def set_bar(self, bus, devfn, bar_off, addr, is64):
        self.cfg_write(bus, devfn, bar_off, addr & 0xFFFFFFFF)
        if is64:
            self.cfg_write(bus, devfn, bar_off + 4, addr >> 32)
