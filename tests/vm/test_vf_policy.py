"""Per-VF policy set by the PF through sysfs (sriov_policy/, docs/sysfs-abi.md), in the
extras boot (VFS=2).

As root: a policy write with VFs enabled is -EBUSY; values beyond the PF's resources
are -EINVAL / -ENOSPC; with VFs disabled the policy is set, VFs are enabled and the
device holds it (the PF's registers, read through resource0).  As tacc-user on the
VF: it sees its policy (queue_mask, devmem_bytes, DEVMEM_SIZE) and cannot exceed it
(a submit on a queue outside its mask is -EINVAL, a BO beyond its window -ENOSPC);
tacc-user cannot write the policy (0644 root).  The device-side enforcement of the
same registers (a VFIO user or nested guest is bound too) is tests/device/
test_vf_policy.py.  The boot's VF state and default policy are restored at the end.
"""

from __future__ import annotations

import errno
import grp
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_driver_basic import (
    BO_NO_BIND,
    DEVICE,
    P_DEVMEM,
    Dev,
    dmesg_problems,
    nop,
    pf_sysfs,
    wait_accel_node,
)
from test_isolation_rings import UserProc

FIELDS = ("devmem_bytes", "queue_mask", "weight")


def pol(name: str) -> Path:
    return pf_sysfs() / "sriov_policy" / name


def write_err(path: Path, value: str) -> int:
    """0 if the write succeeded, else its errno."""
    try:
        path.write_text(value)
    except OSError as e:
        return e.errno or -1
    return 0


def set_numvfs(n: int) -> list[Path]:
    pci = pf_sysfs()
    (pci / "sriov_numvfs").write_text("0")
    if n:
        (pci / "sriov_numvfs").write_text(str(n))
    vfs = sorted(p.resolve() for p in pci.glob("virtfn*"))
    for vf in vfs:  # new nodes: group tacc 0660, as the guest init sets the boot's
        node = wait_accel_node(vf)
        os.chown(node, 0, grp.getgrnam("tacc").gr_gid)
        os.chmod(node, 0o660)
    return vfs


@pytest.fixture(scope="module")
def boot_state() -> Iterator[dict[str, str]]:
    """The boot's VF count and every policy file; both restored afterwards."""
    pci = pf_sysfs()
    if int((pci / "sriov_totalvfs").read_text()) < 2:
        pytest.skip("no SR-IOV")
    if not (pci / "sriov_policy").is_dir():
        pytest.fail("the PF has SR-IOV but no sriov_policy/ (TACC_CAP_VF_POLICY missing?)")
    saved = {p.name: p.read_text().strip() for p in (pci / "sriov_policy").iterdir()}
    before = (pci / "sriov_numvfs").read_text().strip()
    yield saved
    (pci / "sriov_numvfs").write_text("0")
    # lower sizes first so the sum stays within the limit at every step
    for name in sorted(saved, key=lambda n: (not n.endswith("devmem_bytes"), n)):
        if name != "devmem_limit_bytes":
            pol(name).write_text(saved[name])
    if before != "0":
        set_numvfs(int(before))


def device_policy() -> dict[int, list[int]]:
    """The policy as the device holds it: PF registers read live by debugfs vf_policy."""
    txt = (Path("/sys/kernel/debug/accel") / pf_sysfs().name / "vf_policy").read_text()
    return {int(ln.split()[0]): [int(x, 0) for x in ln.split()[1:]]
            for ln in txt.splitlines() if not ln.startswith("#")}


def test_policy_busy_and_bad_values(boot_state):
    set_numvfs(2)
    for f in FIELDS:  # VFs on: every field is -EBUSY, the value stays
        assert write_err(pol(f"vf1_{f}"), boot_state[f"vf1_{f}"]) == errno.EBUSY, f
    assert pol("vf1_weight").read_text().strip() == boot_state["vf1_weight"]
    set_numvfs(0)
    limit = int(pol("devmem_limit_bytes").read_text())
    assert limit == int((pf_sysfs() / "tacc/devmem_bytes").read_text()) // 2
    bad = {
        "vf1_weight": [("0", errno.EINVAL), ("256", errno.EINVAL), ("-1", errno.EINVAL),
                       ("x", errno.EINVAL)],
        "vf1_queue_mask": [("0", errno.EINVAL), ("0x10", errno.EINVAL),
                           ("0x1f", errno.EINVAL)],
        "vf1_devmem_bytes": [("0", errno.EINVAL), (str(3 << 20), errno.EINVAL),
                             (str(limit + (2 << 20)), errno.ENOSPC),
                             (str(1 << 62), errno.ENOSPC)],
    }
    for name, cases in bad.items():
        for value, err in cases:
            assert write_err(pol(name), value) == err, (name, value)
        assert pol(name).read_text().strip() == boot_state[name], name
    # the sum of the windows of all VFs must fit: VF1 alone at the limit is -ENOSPC
    # while the others keep theirs, and fits once they are small
    assert write_err(pol("vf1_devmem_bytes"), str(limit)) == errno.ENOSPC
    for v in (2, 3, 4):
        assert write_err(pol(f"vf{v}_devmem_bytes"), str(2 << 20)) == 0
    assert write_err(pol("vf1_devmem_bytes"), str(limit - (6 << 20))) == 0
    assert write_err(pol("vf2_devmem_bytes"), str(4 << 20)) == errno.ENOSPC


# functions run in tacc-user's process
def u_try_policy(state: dict[str, Any], path: str) -> int:
    return write_err(Path(path), "1")


def u_vf_view(state: dict[str, Any], node: str, pci: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = Path(pci) / "tacc"
    out["queue_mask"] = int((t / "queue_mask").read_text(), 0)
    out["devmem_bytes"] = int((t / "devmem_bytes").read_text())
    with Dev(node) as d:
        out["P_DEVMEM"] = d.param(P_DEVMEM)
        for q in range(4):
            try:
                out[f"q{q}"] = d.run([nop()], queue=q)
            except OSError as e:
                out[f"q{q}"] = ("errno", e.errno)
        # device memory: the whole window is allocatable, one byte past it is not
        try:
            h = d.bo(out["devmem_bytes"] + (2 << 20), type=DEVICE, flags=BO_NO_BIND).handle
            d.gem_close(h)
            out["bo_over"] = 0
        except OSError as e:
            out["bo_over"] = e.errno
    return out


def test_policy_applied_and_enforced(boot_state):
    set_numvfs(0)
    assert write_err(pol("vf1_devmem_bytes"), str(8 << 20)) == 0
    assert write_err(pol("vf1_queue_mask"), "0x5") == 0
    assert write_err(pol("vf1_weight"), "1") == 0
    assert write_err(pol("vf2_weight"), "3") == 0
    vf1, vf2 = set_numvfs(2)
    # the device holds what the PF set (VF_DEVMEM_*, VF_QUEUE_MASK, ARB_WEIGHT)
    dp = device_policy()
    assert dp[1][1:] == [8 << 20, 0x5, 1] and dp[2][2:] == [0xF, 3]
    assert dp[1][0] + dp[1][1] <= dp[2][0] or dp[2][0] + dp[2][1] <= dp[1][0]
    u = UserProc()
    try:
        assert u.call(u_try_policy, str(pol("vf1_weight"))) == errno.EACCES
        view = u.call(u_vf_view, str(wait_accel_node(vf1)), str(vf1))
        assert view["queue_mask"] == 0x5
        assert view["devmem_bytes"] == view["P_DEVMEM"] == 8 << 20
        assert view["q0"] == 0 and view["q2"] == 0
        assert view["q1"] == ("errno", errno.EINVAL)
        assert view["q3"] == ("errno", errno.EINVAL)
        assert view["bo_over"] == errno.ENOSPC
        other = u.call(u_vf_view, str(wait_accel_node(vf2)), str(vf2))
        assert other["queue_mask"] == 0xF and all(other[f"q{q}"] == 0 for q in range(4))
    finally:
        u.close()
    assert dmesg_problems() == []
