"""A taccd capture's counters stream from the device's sample ring (issue 18 item 5,
``counters_source: device``; the default stays taccd's reads, see session.Options):
the device samples every 1/counters_hz of device time and taccd only drains the ring, so
a stalled taccd loop loses no sample (sampled by taccd's loop, every grid slot the loop
missed was a counted ``counters`` drop); a ring another consumer holds falls back to
taccd's own reads, with a warning.  taccd runs --no-bpf here: no program compile."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tacc.capture import open_capture
from tacc.capture.schema import DropSource
from tacc.daemon import protocol
from tacc.runtime import uapi

HZ = 20.0
STALL_S = 1.0  # taccd SIGSTOPped: 20 grid slots at 20 Hz


@pytest.fixture(scope="module")
def taccd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One taccd for the file (each capture is its own; a start is seconds of imports)."""
    from tacc.testing.taccd import start_taccd

    root = tmp_path_factory.mktemp("taccd")
    sock = root / "taccd.sock"
    p = start_taccd(sock, root, "--no-bpf", "--no-always-on", "--no-cdi")
    try:
        yield p, sock
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.terminate()
            p.wait(30)


def _req(sock: Path, **obj: Any) -> dict[str, Any]:
    r = protocol.request(obj, str(sock), timeout=120.0)
    assert r.get("ok"), r
    return r


def _jobs(node: Path, n: int, tag_base: int) -> None:
    fd = uapi.open_node(str(node))
    try:
        uapi.submit_nops(fd, n, ncmds=1, tag_base=tag_base)
    finally:
        os.close(fd)


def _pf_counters(path: Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    cap = open_capture(path)
    assert cap.complete, cap.problems
    c = cap.read("counters")
    return c[c["fid"] == 0], cap.read("drops"), cap.meta


def test_device_sampled_counters_survive_a_stalled_loop(taccd: tuple[Any, Path],
                                                       tmp_path: Path, pf_accel: Path) -> None:
    p, sock = taccd
    out = tmp_path / "c1"
    _req(sock, cmd="start", output=str(out),
         options={"counters_hz": HZ, "api": False, "counters_source": "device"})
    _jobs(pf_accel, 50, 0x3C3C0000)
    os.kill(p.pid, signal.SIGSTOP)  # the loop stalls for 20 grid slots
    try:
        time.sleep(STALL_S)
    finally:  # the daemon serves the file's other tests
        os.kill(p.pid, signal.SIGCONT)
    _jobs(pf_accel, 50, 0x3C3D0000)
    time.sleep(0.3)
    s = _req(sock, cmd="stop")["summary"]
    assert not [w for w in s["warnings"] if "counters" in w], s["warnings"]
    pf, drops, meta = _pf_counters(out)
    lost = int(drops["count"][drops["source"] == int(DropSource.COUNTERS)].sum())
    assert lost == 0, drops
    # every sample there, numbered without a gap; the device's own timestamps, one
    # period apart (the first and the last sample are taccd's reads at start and stop)
    assert np.array_equal(pf["seq"], np.arange(1, len(pf) + 1)), pf["seq"]
    assert len(pf) >= STALL_S * HZ + 2
    dev = pf[1:-1]
    hz = float(meta["devices"][0]["clock_hz"])
    gaps = np.diff(dev["devclk"].astype(np.int64)) / hz
    assert np.allclose(gaps, 1.0 / HZ, rtol=0.05), gaps
    assert int(pf["jobs_completed"][-1]) - int(pf["jobs_completed"][0]) >= 100


def test_counters_fall_back_to_taccd_reads_when_the_ring_is_taken(
        taccd: tuple[Any, Path], tmp_path: Path, pf_accel: Path) -> None:
    from tacc.counters import DeviceBackend, functions

    _, sock = taccd
    fn = functions()[0]
    with DeviceBackend(fn, period_ns=10_000_000, entries=64):  # another consumer
        out = tmp_path / "c2"
        _req(sock, cmd="start", output=str(out),
             options={"counters_hz": HZ, "api": False, "counters_source": "device"})
        _jobs(pf_accel, 20, 0x3C3E0000)
        time.sleep(0.5)
        s = _req(sock, cmd="stop")["summary"]
    assert any("counters sampled by taccd" in w and "another consumer" in w
               for w in s["warnings"]), s["warnings"]
    pf, _, _ = _pf_counters(out)
    assert len(pf) >= 5
    assert int(pf["jobs_completed"][-1]) - int(pf["jobs_completed"][0]) >= 20


def test_bad_counters_source_is_refused(taccd: tuple[Any, Path], tmp_path: Path) -> None:
    _, sock = taccd
    r = protocol.request({"cmd": "start", "output": str(tmp_path / "c3"),
                          "options": {"counters_source": "cpu"}}, str(sock), timeout=60.0)
    assert not r.get("ok") and "counters_source 'cpu'" in r.get("error", ""), r
    assert not (tmp_path / "c3").exists()
