"""scripts/run-vm's guest QMP proxy is an allow-list: guest root, speaking QMP on the
org.tacc.qmp port, cannot make QEMU create a host file (chardev-add with a file
backend, dump-guest-memory, the same through HMP) nor reach non-tacc devices; what the
VM tests need still works.  A real QEMU (paused, TCG) with the tacc PF behind the
proxy, the test in the guest's place on the port's socket."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tacc.testing.qtest import QEMU

ROOT = Path(__file__).resolve().parents[2]


def _load():
    loader = importlib.machinery.SourceFileLoader("run_vm", str(ROOT / "scripts/run-vm"))
    spec = importlib.util.spec_from_loader("run_vm", loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_vm"] = mod
    loader.exec_module(mod)
    return mod


class Guest:
    """The guest's end of the port: QMP with ids, events and greetings skipped."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(30)
        self.buf = ""
        self.dec = json.JSONDecoder()
        self.n = 0

    def cmd(self, name: str, **args: object) -> dict:
        self.n += 1
        rid = f"g{self.n}"
        msg: dict[str, object] = {"execute": name, "id": rid}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\r\n")
        while True:
            self.buf = self.buf.lstrip()
            try:
                obj, end = self.dec.raw_decode(self.buf)
                self.buf = self.buf[end:]
                if obj.get("id") == rid:
                    return obj
                continue
            except json.JSONDecodeError:
                pass
            data = self.sock.recv(65536)
            assert data, "proxy closed the port"
            self.buf += data.decode()


@pytest.fixture
def guest(tmp_path: Path):
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    run_vm = _load()
    run = tmp_path / "run"
    run.mkdir()
    port_srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    port_srv.bind(str(run / "qmp-guest-port.sock"))
    port_srv.listen(1)
    port_srv.settimeout(30)
    proc = subprocess.Popen(
        [str(QEMU), "-machine", "q35", "-accel", "tcg", "-S", "-display", "none",
         "-nodefaults", "-m", "128M", "-L", "/usr/share/seabios", "-L", "/usr/share/qemu",
         "-qmp", f"unix:{run}/qmp-guest-mon.sock,server=on,wait=off",
         "-device", "tacc,id=tacc0", "-device", "pcie-root-port,id=rp9,chassis=9"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (run / "qmp-guest-mon.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        run_vm.start_guest_qmp_proxy(run, proc)
        conn, _ = port_srv.accept()
        g = Guest(conn)
        g.cmd("qmp_capabilities")  # "already negotiated" is fine too
        yield g, tmp_path
    finally:
        proc.kill()
        proc.wait()
        port_srv.close()


def test_guest_cannot_create_host_files(guest) -> None:
    g, tmp = guest
    evil = [tmp / f"evil{i}" for i in range(4)]
    tries = [
        g.cmd("chardev-add", id="c0", backend={"type": "file", "data": {"out": str(evil[0])}}),
        g.cmd("dump-guest-memory", paging=False, protocol=f"file:{evil[1]}"),
        g.cmd("human-monitor-command",
              **{"command-line": f"chardev-add file,id=c1,path={evil[2]}"}),
        g.cmd("human-monitor-command", **{"command-line": f"dump-guest-memory {evil[3]}"}),
        g.cmd("device_add", driver="tacc", id="t9", romfile="/etc/passwd"),
        g.cmd("device_add", driver="virtio-serial-pci", id="vs9"),
        g.cmd("device_del", id="rp9"),
        g.cmd("qom-set", path="/machine/peripheral/rp9", property="x-speed", value="2_5"),
        g.cmd("migrate", uri=f"exec:touch {evil[0]}"),
        g.cmd("quit"),
    ]
    for r in tries:
        assert "error" in r and r["error"]["desc"].startswith("run-vm: "), r
    assert [p for p in evil if p.exists()] == []


def test_what_the_tests_need_still_works(guest) -> None:
    g, _ = guest
    pf = "/machine/peripheral/tacc0"
    assert g.cmd("query-status")["return"]["status"] == "prelaunch"
    assert g.cmd("qom-get", path=pf, property="type")["return"] == "tacc"
    assert g.cmd("qom-get", path=pf, property="x-gt-jobs")["return"] == 0
    assert g.cmd("qom-set", path=pf, property="x-fi-hang-engine", value=-1) == \
        {"return": {}, "id": f"g{g.n}"}
    assert "return" in g.cmd("qom-set", path=pf, property="x-link-gen-now", value=0)
    assert "return" in g.cmd("qom-set", path=pf, property="x-host-slice", value=64 << 10)
    assert g.cmd("qom-get", path=pf, property="x-host-slice")["return"] == 64 << 10
    r = g.cmd("human-monitor-command", **{"command-line": "info jit"})
    assert "return" in r, r
    r = g.cmd("human-monitor-command", **{"command-line": "pcie_aer_inject_error -c tacc0 0x40"})
    assert r.get("return", "").startswith("OK id: tacc0"), r
    # a refused command does not disturb the session
    assert "error" in g.cmd("quit")
    assert g.cmd("qom-get", path=pf, property="type")["return"] == "tacc"
