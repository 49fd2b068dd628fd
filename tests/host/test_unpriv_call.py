"""tacc.testing.unpriv.call_as_tacc_user on the host (the drop to tacc-user replaced by a
no-op: the account exists in the test VM only): the result comes back, the child's failure
with its traceback, no file of the caller is open in the child, a hung child is killed."""

from __future__ import annotations

import errno
import os
import time

import pytest
from tacc.testing import unpriv

DROPPED_TO: list[str] = []


def _record_drop(user: str = unpriv.USER) -> None:
    DROPPED_TO.append(user)  # in the child: reported back through its result


@pytest.fixture(autouse=True)
def _no_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpriv, "drop_to_tacc_user", _record_drop)


def _dropped_to() -> list[str]:
    return DROPPED_TO


def test_the_child_drops_to_the_user_asked() -> None:
    """tacc-user by default; tacc-user2 (the second tenant of the per-user limits) asked."""
    assert unpriv.call_as_tacc_user(_dropped_to) == [unpriv.USER]
    assert unpriv.call_as_tacc_user(_dropped_to, user=unpriv.USER2) == [unpriv.USER2]


def _pid_and_sum(a: int, b: int) -> list[int]:
    return [os.getpid(), a + b]


def _fails() -> None:
    raise ValueError("the tenant's refusal")


def _open_fds() -> list[int]:
    return sorted(int(f) for f in os.listdir("/proc/self/fd"))


def _hangs() -> None:
    time.sleep(60)


def test_result_comes_from_a_child() -> None:
    pid, total = unpriv.call_as_tacc_user(_pid_and_sum, 2, 3)
    assert total == 5 and pid != os.getpid()


def test_failure_carries_the_childs_traceback() -> None:
    with pytest.raises(AssertionError,
                       match="(?s)_fails as tacc-user failed.*the tenant's refusal"):
        unpriv.call_as_tacc_user(_fails)


def test_callers_files_are_closed_in_the_child(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with open(tmp_path / "held", "w") as held:
        fds = unpriv.call_as_tacc_user(_open_fds)
        assert held.fileno() not in fds
    # stdio, the result pipe's write end and listdir's own directory
    assert len(fds) == 5 and fds[:3] == [0, 1, 2], fds


def test_hung_child_is_killed() -> None:
    t = time.monotonic()
    with pytest.raises(AssertionError, match="still running after 0.5 s"):
        unpriv.call_as_tacc_user(_hangs, timeout=0.5)
    assert time.monotonic() - t < 10


def test_errno_as_tacc_user_is_the_open_errno(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "f").write_text("")
    assert unpriv.errno_as_tacc_user(tmp_path / "f", os.O_RDONLY) == 0
    assert unpriv.errno_as_tacc_user(tmp_path / "missing") == errno.ENOENT
    assert unpriv.errno_as_tacc_user(tmp_path, os.O_RDWR) == errno.EISDIR
