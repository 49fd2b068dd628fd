"""taccd: always-on low-cost collection plus on-demand captures (docs/taccd.md).

One thread, one select loop: the control socket, the netlink event socket, the pyudev
kernel monitor and a 50 ms tick that drains the capture's collectors in bulk.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import stat
import struct
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tacc.capture.schema import DropSource
from tacc.devices import TaccFunction, discover, find
from tacc.errors import DeviceError, TaccError

from . import protocol
from .alwayson import AlwaysOn
from .session import CaptureSession, Options

log = logging.getLogger("taccd")
TICK_S = 0.05
MIN_GAP_S = 0.01  # after a tick that overran its period


class DaemonError(TaccError):
    pass


CAP_SYS_ADMIN, CAP_PERFMON = 21, 38
SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the client (the pid cannot be reused under us)


def peer_cred(conn: socket.socket) -> tuple[int, int, int | None] | None:
    """(pid, uid, pidfd or None) of a UNIX socket's client (SO_PEERCRED, SO_PEERPIDFD),
    None if unknown.  The caller closes the pidfd."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", raw)
    try:
        pidfd: int | None = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:  # a kernel before 6.5
        pidfd = None
    return pid, uid, pidfd


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)


def _same_userns(pid: int) -> bool:
    """Capabilities count only in taccd's user namespace: a container's root holds every
    capability in its own."""
    try:
        return os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino
    except OSError:
        return False


def may_perfmon(pid: int, uid: int) -> bool:
    """Root, or a process of taccd's user namespace holding CAP_PERFMON or CAP_SYS_ADMIN
    in its effective set (the driver's rule for trace rings and PF-wide telemetry,
    docs/uapi.md "Threat model")."""
    if uid == 0:
        return True
    try:
        eff = int(_status(pid).get("CapEff", "").split()[0], 16)
    except (ValueError, IndexError):
        return False
    return bool(eff & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN)) and _same_userns(pid)


@dataclass(frozen=True)
class Peer:
    """A client as taccd judges its requests (docs/taccd.md "Who may ask what")."""

    pid: int
    uid: int
    gids: frozenset[int]
    perfmon: bool

    @classmethod
    def of(cls, cred: tuple[int, ...]) -> Peer:
        """From (pid, uid[, pidfd]): the groups and capabilities read from /proc/<pid>,
        trusted only if the pidfd still names a live process afterwards (else: nothing
        beyond the uid)."""
        pid, uid = cred[0], cred[1]
        pidfd = cred[2] if len(cred) > 2 else None
        st = _status(pid)
        gids = {int(g) for g in st.get("Groups", "").split()}
        try:
            gids.add(int(st.get("Gid", "").split()[1]))  # effective
        except (ValueError, IndexError):
            pass
        perfmon = may_perfmon(pid, uid)
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except OSError:  # gone: the pid may name another process now
                gids, perfmon = set(), uid == 0
        return cls(pid, uid, frozenset(gids), perfmon)

    def may_open(self, node: str | None) -> bool:
        """Whether the client may open the accel node read-write (its mode bits, as
        open() checks them; ACLs are not read)."""
        if self.uid == 0:
            return True
        if not node:
            return False
        try:
            st = os.stat(node)
        except OSError:
            return False
        if st.st_uid == self.uid:
            need = stat.S_IRUSR | stat.S_IWUSR
        elif st.st_gid in self.gids:
            need = stat.S_IRGRP | stat.S_IWGRP
        else:
            need = stat.S_IROTH | stat.S_IWOTH
        return st.st_mode & need == need


ROOT = Peer(0, 0, frozenset(), True)  # in-process requests


class Daemon:
    def __init__(self, sock_path: str, capture_root: Path, always_on: bool = True,
                 interval: float = 1.0, max_bytes: int = 1 << 30, bpf: bool = True,
                 sysroot: str = "/", clock_exchange: str = "",
                 cdi_spec: str | None = None) -> None:
        self.sock_path = sock_path
        self.cdi_spec = cdi_spec  # CDI spec kept up to date with the functions (None: no)
        self.capture_root = capture_root
        self.max_bytes = max_bytes
        self.sysroot = sysroot
        self.functions: list[TaccFunction] = discover(sysroot)
        self.update_cdi()
        self.always_on = AlwaysOn(interval) if always_on else None
        self.bpf_enabled = bpf
        self.program: Any | None = None
        self.program_error = ""
        self.session: CaptureSession | None = None
        self.session_uid = 0  # the client that started it (stop, status)
        self.deadline: float | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=1000)
        self.warnings: deque[str] = deque(maxlen=100)
        self.sel = selectors.DefaultSelector()
        self.stop_requested = False
        self.started = time.time()
        self.captures_done = 0
        self.next_tick = 0.0
        self._listen()
        self.netlink = self._netlink()
        self.monitor = self._udev()
        self.clock_responder = self._clock_exchange(clock_exchange)

    # ------------------------------------------------------------ sources ---
    def _listen(self) -> None:
        p = Path(self.sock_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(p))
                probe.close()
                raise DaemonError(f"another taccd is listening on {p}")
            except (ConnectionRefusedError, FileNotFoundError):
                p.unlink(missing_ok=True)
            finally:
                probe.close()
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(str(p))
        os.chmod(p, 0o660)
        self.lsock.listen(8)
        self.lsock.setblocking(False)
        self.sel.register(self.lsock, selectors.EVENT_READ, self._accept)

    def _netlink(self) -> Any | None:
        try:
            from .netlink import NetlinkEvents

            nl = NetlinkEvents()
        except Exception as exc:  # noqa: BLE001 - family absent without the module
            self.warnings.append(f"netlink device events unavailable: {exc}")
            return None
        self.sel.register(nl.fileno(), selectors.EVENT_READ, self._on_netlink)
        return nl

    def _udev(self) -> Any | None:
        try:
            import pyudev

            mon = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            mon.filter_by("pci")
            mon.filter_by("accel")
            mon.start()
        except Exception as exc:  # noqa: BLE001
            self.warnings.append(f"device hotplug not followed: {exc}")
            return None
        self.sel.register(mon.fileno(), selectors.EVENT_READ, self._on_udev)
        return mon

    def _clock_exchange(self, addr: str) -> Any | None:
        """``--clock-exchange ADDR[:PORT]``: answer peers' clock requests (docs/cluster.md)."""
        if not addr:
            return None
        from tacc.capture.clockx import Responder, parse_peer

        host, port = parse_peer(addr)
        try:
            r = Responder(host, port)
        except OSError as exc:
            raise DaemonError(f"clock exchange on {host}:{port}: {exc.strerror}") from None
        self.sel.register(r.fileno(), selectors.EVENT_READ, r.on_readable)
        return r

    # ----------------------------------------------------------- handlers ---
    def _accept(self) -> None:
        try:
            conn, _ = self.lsock.accept()
        except BlockingIOError:
            return
        conn.settimeout(5.0)
        try:
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < protocol.MAX_LINE:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            cred = peer_cred(conn)
            try:
                reply = self.handle(protocol.decode(buf), cred)
            except (protocol.ProtocolError, DaemonError) as exc:
                reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - a bad request must not end taccd
                log.exception("request failed")
                first = (str(exc).splitlines() or [""])[0]
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {first}"}
            finally:
                if cred is not None and cred[2] is not None:
                    os.close(cred[2])
            conn.sendall(protocol.encode(reply))
        except OSError:
            pass
        finally:
            conn.close()

    def _on_netlink(self) -> None:
        assert self.netlink is not None
        lost = self.netlink.errors
        for ev in self.netlink.read():
            self.events.append(ev)
            if self.session is not None:
                pci = ev.get("device")
                if pci and pci not in self.session.fid_of_pci and not self.session.opts.device:
                    # a function probed after taccd's last look (its uevent not read yet)
                    self.devices_changed("add", str(pci))
                self.session.device_event(ev)
        if self.session is not None and self.netlink.errors > lost:
            # ENOBUFS: the socket overflowed; at least one event per overflow was lost
            self.session.drop(DropSource.DEVICE_EVENTS, self.netlink.errors - lost)

    def _on_udev(self) -> None:
        assert self.monitor is not None
        while True:
            dev = self.monitor.poll(timeout=0)
            if dev is None:
                break
            self.devices_changed(dev.action or "", dev.sys_name)

    def update_cdi(self) -> None:
        """Rewrite the CDI specs (docs/containers.md) if the functions changed them."""
        if self.cdi_spec is None:
            return
        from tacc import cdi

        try:
            cdi.generate(self.cdi_spec, self.sysroot)
        except (OSError, cdi.CdiError) as exc:
            self.warnings.append(f"CDI spec {self.cdi_spec} not updated: {exc}")

    def devices_changed(self, action: str, name: str) -> None:
        before = {f.pci for f in self.functions}
        self.functions = discover(self.sysroot)
        self.update_cdi()  # VFs came or went, a driver (tacc.ko, vfio-pci) bound or left
        after = {f.pci for f in self.functions}
        for pci in sorted(after - before):
            log.info("device %s appeared", pci)
            if self.session is not None:
                self.session.add_function(find(self.functions, pci))
        for pci in sorted(before - after):
            log.info("device %s disappeared", pci)
            if self.session is not None:
                self.session.remove_function(pci)
        # a driver bind creates the accel node after the PCI add: reopen what is missing
        if self.session is not None and action in ("add", "bind"):
            for f in self.functions:
                fid = self.session.fid_of_pci.get(f.pci)
                if fid is not None and f.accel and fid not in self.session.rings \
                        and self.session.opts.device_trace:
                    self.session.functions[fid] = f
                    self.session._open_function(fid, f)

    # ------------------------------------------------------------ requests ---
    def handle(self, req: dict[str, Any], peer: tuple[int, ...] | None = None
               ) -> dict[str, Any]:
        """One request; ``peer`` (pid, uid[, pidfd]) of the client (SO_PEERCRED,
        SO_PEERPIDFD), None in-process (root).  What each request kind needs:
        docs/taccd.md "Who may ask what"."""
        who = ROOT if peer is None else Peer.of(peer)
        cmd = req.get("cmd")
        if cmd == "ping":
            return {"ok": True}
        if cmd == "status":
            return {"ok": True, **self.status(who)}
        if cmd == "start":
            opts = req.get("options") or {}
            if opts.get("tlp") and not who.perfmon:
                # the TLP stream shows every function's and context's link traffic
                raise DaemonError("the TLP stream needs CAP_PERFMON (root): it shows every "
                                  "function's and context's link traffic")
            return {"ok": True, **self.start_capture(req.get("output"), opts, who)}
        if cmd == "stop":
            if self.session is not None and not who.perfmon and who.uid != self.session_uid:
                raise DaemonError(f"the running capture is uid {self.session_uid}'s: stopping "
                                  "another user's capture needs CAP_PERFMON")
            return {"ok": True, **self.stop_capture()}
        raise DaemonError(f"unknown command {cmd!r}")

    def _visible(self, who: Peer, pci: str) -> bool:
        """A function's own telemetry (counters, queue statistics): a VF's or virtio-tacc's
        to the users of its node, the PF's (the sum of every tenant) with CAP_PERFMON."""
        if who.perfmon:
            return True
        fn = next((f for f in self.functions if f.pci == pci), None)
        return fn is not None and fn.kind != "pf" and who.may_open(fn.accel)

    def status(self, who: Peer = ROOT) -> dict[str, Any]:
        ao = self.always_on.summary() if self.always_on else None
        if ao is not None:
            ao = {pci: v for pci, v in ao.items() if self._visible(who, pci)}
        mine = self.session is not None and (who.perfmon or who.uid == self.session_uid)
        return {
            "pid": os.getpid(), "uptime_s": time.time() - self.started,
            "mode": "capture" if self.session else ("always-on" if self.always_on else "idle"),
            "devices": [f.pci for f in self.functions],
            "kinds": {f.pci: f.kind for f in self.functions},  # pf, vf, virtio
            "always_on": ao,
            "capture": self.session.status() if mine else None,
            "captures_done": self.captures_done,
            # every tenant's faults and hangs (the kernel's group needs CAP_NET_ADMIN)
            "device_events": list(self.events)[-20:] if who.perfmon else [],
            "warnings": list(self.warnings),
            "bpf": "ready" if self.program is not None else (self.program_error or "not loaded"),
        }

    def capture_refusals(self, who: Peer, opts: Options, fns: list[TaccFunction]) -> list[str]:
        """What of a capture of ``fns`` with ``opts`` the client may not have: each source
        that needs CAP_PERFMON (the driver's rule for trace rings and PF-wide telemetry;
        taccd's own for what it reads of other processes), and each function whose
        telemetry it asks for without access to its node."""
        if who.perfmon:
            return []
        out = []
        if opts.device_trace:
            out.append("device trace rings (every command of every user of a function)")
        if self.bpf_enabled:
            out.append("driver events (BPF: every process's tacc ioctls and jobs)")
        if opts.api:
            out.append("runtime API rings (other processes' API calls)")
        if self.netlink is not None:
            out.append("device events (every tenant's faults and hangs)")
        if opts.counters_hz > 0:
            pfs = [f.pci for f in fns if f.kind == "pf"]
            if pfs:
                out.append(f"the PF's counters ({', '.join(pfs)}: every tenant's work)")
        return out

    def _check_start(self, who: Peer, opts: Options, fns: list[TaccFunction],
                     output: str | None) -> None:
        need = self.capture_refusals(who, opts, fns)
        if need:
            raise DaemonError("this capture needs CAP_PERFMON for: " + "; ".join(need))
        if not who.perfmon:
            for f in fns:
                if opts.counters_hz > 0 and not who.may_open(f.accel):
                    raise DaemonError(f"{f.pci}: its counters are its node's users' "
                                      f"({f.accel or 'no node'}), not uid {who.uid}'s")
        if output is not None and who.uid != 0:
            root = self.capture_root.resolve()
            if not Path(output).resolve().is_relative_to(root):
                raise DaemonError(f"output {output}: taccd writes as root, so a client other "
                                  f"than root gets a directory under {root} only")

    def _get_program(self) -> Any | None:
        if not self.bpf_enabled:
            return None
        if self.program is None and not self.program_error:
            try:
                from tacc.bpftrace import preflight
                from tacc.bpftrace.errors import ToolError
                from tacc.bpftrace.program import Program

                try:
                    root = preflight.all_checks(bcc=True)
                    self.program = Program(root, rb_pages=4096, host=True)
                    if self.program.cache_note:
                        self.warnings.append(self.program.cache_note)
                except ToolError as exc:
                    self.program_error = str(exc)
            except Exception as exc:  # noqa: BLE001 - bcc compile/load errors
                self.program_error = f"BPF program failed: {str(exc).splitlines()[0]}"
            if self.program_error:
                self.warnings.append(f"driver events not captured: {self.program_error}")
        return self.program

    def start_capture(self, output: str | None, options: dict[str, Any],
                      who: Peer = ROOT) -> dict[str, Any]:
        if self.session is not None:
            raise DaemonError(f"a capture is already running ({self.session.path})")
        known = set(Options().__dict__)
        bad = sorted(set(options) - known - {"duration"})
        if bad:
            raise DaemonError(f"unknown capture option(s): {', '.join(bad)}")
        duration = options.pop("duration", None)
        try:
            opts = Options(**{**options, "max_bytes": int(options.get("max_bytes",
                                                                        self.max_bytes))})
        except (TypeError, ValueError) as exc:
            raise DaemonError(str(exc)) from None
        fns = self.functions
        if opts.device:
            try:
                fns = [find(self.functions, opts.device)]
            except DeviceError as exc:
                raise DaemonError(str(exc)) from None
        self._check_start(who, opts, fns, output)
        if output is None:
            output = str(self.capture_root / time.strftime("capture-%Y%m%d-%H%M%S"))
        prog = self._get_program()
        if prog is not None:
            from tacc.bpftrace.program import Filters

            prog.reset()
            dev = fns[0].devid if opts.device and fns else None
            prog.configure(Filters(pid=opts.pids[0] if len(opts.pids) == 1 else 0,
                                   comm=opts.comm, dev=dev))
        try:
            self.session = CaptureSession(output, fns, opts, program=prog, tool="taccd")
        except Exception as exc:  # noqa: BLE001 - CaptureError, OSError
            raise DaemonError(f"cannot start capture: {exc}") from None
        if prog is not None:
            from tacc.bpftrace.program import AttachError

            try:
                prog.attach("record" if opts.ioctl_events else "jobs",
                            host=opts.host_events, autotrace=True)
            except AttachError as exc:
                sess, self.session = self.session, None
                sess.close(complete=False)
                raise DaemonError(str(exc)) from None
            if opts.pids:
                prog.trace_pids(opts.pids)
        self.deadline = time.monotonic() + float(duration) if duration else None
        self.session_uid = who.uid
        log.info("capture started: %s", output)
        return {"path": output, "warnings": self.session.warnings}

    def stop_capture(self) -> dict[str, Any]:
        if self.session is None:
            raise DaemonError("no capture is running")
        if self.program is not None:
            self.program.detach()
        sess, self.session, self.deadline = self.session, None, None
        summary = sess.close(complete=True)
        self.captures_done += 1
        log.info("capture stopped: %s", sess.path)
        return {"summary": summary}

    # ---------------------------------------------------------------- loop ---
    def tick_s(self) -> float:
        """The loop period: 50 ms, shorter when taccd samples a capture's counters faster
        (not when the device samples them)."""
        if self.session is not None and self.session.opts.counters_hz > 0 and \
                self.session.counters:
            return min(TICK_S, 1.0 / self.session.opts.counters_hz)
        return TICK_S

    def loop_once(self) -> None:
        """One pass of the loop: wait for a request, an event or the tick; tick when due.

        Ticks are on a fixed schedule (every ``tick_s()`` from the previous one, not
        after it: a tick that takes 20 ms does not stretch the period to 70 ms, which
        would make the 20 Hz counter samples late); one that ends past the next due time
        leaves at least ``MIN_GAP_S`` before the next."""
        for key, _ in self.sel.select(max(0.0, self.next_tick - time.monotonic())):
            key.data()
        now = time.monotonic()
        if now < self.next_tick:
            return
        self.next_tick = max(self.next_tick + self.tick_s(), now)
        self._tick(now)
        self.next_tick = max(self.next_tick, time.monotonic() + MIN_GAP_S)

    def _tick(self, now: float) -> None:
        if self.session is not None:
            self.session.tick(now)
            if self.deadline is not None and now >= self.deadline:
                self.stop_capture()
        if self.always_on is not None:
            self.always_on.tick(self.functions, now)

    def run(self) -> int:
        def on_signal(*_a: object) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("taccd listening on %s (%d devices)", self.sock_path, len(self.functions))
        while not self.stop_requested:
            self.loop_once()
        if self.session is not None:
            self.stop_capture()
        self.close()
        return 0

    def close(self) -> None:
        self.sel.close()
        self.lsock.close()
        Path(self.sock_path).unlink(missing_ok=True)
        if self.netlink is not None:
            self.netlink.close()
        if self.program is not None:
            self.program.close()
