"""GuestQMP takes turns on the one-opener virtio-serial port (EBUSY) instead of failing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from tacc import guest_qmp


def _busy_then(real_fd: int, busy: int):
    calls = {"n": 0}

    def fake_open(path: object, flags: int, *a: object) -> int:
        calls["n"] += 1
        if calls["n"] <= busy:
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_fd

    return fake_open, calls


def test_open_waits_while_port_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    os.close(w)
    fake, calls = _busy_then(r, busy=3)
    monkeypatch.setattr(guest_qmp.os, "open", fake)
    assert guest_qmp.GuestQMP._open(Path("/dev/vportXpY"), timeout=5.0) == r
    assert calls["n"] == 4
    os.close(r)


def test_open_gives_up_after_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = _busy_then(-1, busy=10**9)
    monkeypatch.setattr(guest_qmp.os, "open", fake)
    with pytest.raises(OSError) as ei:
        guest_qmp.GuestQMP._open(Path("/dev/vportXpY"), timeout=0.2)
    assert ei.value.errno == errno.EBUSY
    assert calls["n"] >= 2


def test_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def enoent(path: object, flags: int, *a: object) -> int:
        raise FileNotFoundError(errno.ENOENT, "no port")

    monkeypatch.setattr(guest_qmp.os, "open", enoent)
    with pytest.raises(FileNotFoundError):
        guest_qmp.GuestQMP._open(Path("/nope"), timeout=5.0)
