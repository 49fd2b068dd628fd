"""The test VM itself: device visible, driver bound, node permissions, IOMMU mode,
tracing filesystems and the tools the other layers need."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ACCEL_MAJOR = 261


def test_device_ids(pf_pci: Path) -> None:
    assert (pf_pci / "vendor").read_text().strip() == "0x7acc"
    assert (pf_pci / "device").read_text().strip() == "0x0001"
    assert (pf_pci / "class").read_text().strip() == "0x120000"
    assert (pf_pci / "driver").resolve().name == "tacc"


def test_accel_node(pf_accel: Path) -> None:
    st = os.stat(pf_accel)
    assert stat.S_ISCHR(st.st_mode)
    assert os.major(st.st_rdev) == ACCEL_MAJOR
    assert stat.S_IMODE(st.st_mode) == 0o660
    import grp
    assert grp.getgrgid(st.st_gid).gr_name == "tacc"


def test_unprivileged_user_opens_node(pf_accel: Path) -> None:
    r = subprocess.run(["su", "tacc-user", "-c", f"exec 3<>{pf_accel} && echo opened"],
                       capture_output=True, text=True, timeout=180)
    assert r.stdout.strip() == "opened", r.stderr


def asked(vm_config: str) -> dict[str, str]:
    """What scripts/test-vm asked this boot for (TACC_VM_EXPECT: IOMMU= VFS= SMP= ICOUNT= VIRTIO=);
    outside test-vm, the configuration's name is its IOMMU mode."""
    text = os.environ.get("TACC_VM_EXPECT") or f"IOMMU={vm_config}"
    return dict(w.split("=", 1) for w in text.split())


def test_iommu_mode_matches_config(pf_pci: Path, vm_config: str) -> None:
    group = pf_pci / "iommu_group"
    iommu = asked(vm_config)["IOMMU"]
    if iommu == "off":
        assert not group.exists()
        return
    want = {"strict": "DMA", "lazy": "DMA-FQ", "pt": "identity"}[iommu]
    assert (group / "type").read_text().strip() == want


def test_tracing_filesystems_mounted() -> None:
    mounts = Path("/proc/mounts").read_text()
    for fs in ("tracefs", "debugfs", "bpf"):
        assert f" {fs} " in mounts, fs
    assert Path("/sys/kernel/tracing/events").is_dir()


def test_venv_and_bcc_importable() -> None:
    import sys
    assert sys.prefix.endswith(".venv")
    import bcc  # noqa: F401  (Debian's python3-bpfcc through system site packages)
    assert Path(f"/lib/modules/{os.uname().release}/build").exists()


def test_guest_kernel_is_612() -> None:
    assert os.uname().release.startswith("6.12.")


def test_guest_qmp_channel() -> None:
    from tacc.guest_qmp import PF_QOM, GuestQMP
    with GuestQMP() as q:
        status = q.execute("query-status")
        assert status["status"] == "running"
        # The tacc device is reachable by its QOM path (id=tacc0 in run-vm).
        assert q.qom_get(PF_QOM, "type") == "tacc"


def test_boot_has_the_vfs_and_cpus_asked_for(pf_pci: Path, vm_config: str) -> None:
    # VFS=N: guest-init enabled N VFs, each bound with its accel node in group tacc (0660,
    # the node watcher); SMP=N: N CPUs online.  The extras boot asks VFS=2 SMP=2.
    want = asked(vm_config)
    if "VIRTIO" in want:  # VIRTIO=1: one virtio-tacc-pci function, bound to tacc.ko
        fns = [d for d in Path("/sys/bus/pci/devices").iterdir()
               if (d / "vendor").read_text().strip() == "0x1af4"
               and (d / "device").read_text().strip() == "0x1079"]
        assert len(fns) == int(want["VIRTIO"]), fns
    if "SMP" in want:
        assert len(os.sched_getaffinity(0)) == int(want["SMP"])
        assert Path("/sys/devices/system/cpu/online").read_text().strip() == \
            ("0" if want["SMP"] == "1" else f"0-{int(want['SMP']) - 1}")
    if "VFS" not in want:
        return
    n = int(want["VFS"])
    assert int((pf_pci / "sriov_numvfs").read_text()) == n
    vfs = sorted(pf_pci.glob("virtfn*"))
    assert len(vfs) == n
    import grp
    import time
    deadline = time.monotonic() + 10  # the watcher fixes nodes within a second
    for vf in vfs:
        assert (vf.resolve() / "driver").resolve().name == "tacc"
        node = Path("/dev/accel") / next((vf.resolve() / "accel").glob("accel*")).name
        while True:
            st = os.stat(node)
            if grp.getgrgid(st.st_gid).gr_name == "tacc" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stat.S_IMODE(st.st_mode) == 0o660 and grp.getgrgid(st.st_gid).gr_name == "tacc"
