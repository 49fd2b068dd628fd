"""The ioctl layer: one open accel node (one hardware context) and its ioctls.

:class:`DrmBackend` talks to ``/dev/accel/accelN``; :class:`tacc.runtime.sim.SimBackend`
implements the same methods in Python for host tests.  Every errno becomes a
:mod:`tacc.runtime.errors` exception naming the ioctl.
"""

from __future__ import annotations

import ctypes as C
import errno
import fcntl
import mmap
import os
from typing import Protocol

from . import uapi as U
from .errors import DeviceNotFoundError, DevicePermissionError, ioctl_error


class Backend(Protocol):
    sim: bool

    def get_param(self, param: int, index: int = 0) -> int: ...
    def bo_create(self, size: int, type_: int, flags: int = 0, userptr: int = 0
                  ) -> tuple[int, int]: ...
    def bo_info(self, handle: int) -> U.drm_tacc_bo_info: ...
    def vm_bind(self, handle: int, va: int, bo_offset: int, size: int, flags: int
                ) -> tuple[int, int]: ...
    def vm_unbind(self, handle: int) -> None: ...
    def gem_close(self, handle: int) -> None: ...
    def mmap_bo(self, handle: int, size: int) -> mmap.mmap: ...
    def submit(self, queue: int, cmds: C.Array, ncmds: int, in_syncobjs: list[int],
               out_syncobj: int) -> int: ...
    def wait(self, seqno: int, timeout_ns: int) -> int: ...
    def syncobj_create(self, signaled: bool = False) -> int: ...
    def syncobj_destroy(self, handle: int) -> None: ...
    def syncobj_wait(self, handles: list[int], timeout_abs_ns: int, wait_all: bool = True
                     ) -> bool: ...
    def close(self) -> None: ...


class DrmBackend:
    sim = False

    def __init__(self, devnode: str) -> None:
        try:
            self.fd = os.open(devnode, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise DeviceNotFoundError(f"{devnode}: no such accel node (is tacc.ko loaded?)") from e
        except PermissionError as e:
            raise DevicePermissionError(
                f"{devnode}: permission denied (the node is for group 'tacc')") from e
        self.devnode = devnode
        self._param = U.drm_tacc_get_param()

    def _ioctl(self, req: int, arg: C.Structure, name: str) -> None:
        while True:
            try:
                fcntl.ioctl(self.fd, req, arg, True)
                return
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise ioctl_error(name, e.errno or 0) from None

    def get_param(self, param: int, index: int = 0) -> int:
        p = self._param
        p.param, p.index, p.value = param, index, 0
        self._ioctl(U.DRM_IOCTL_TACC_GET_PARAM, p, f"GET_PARAM({param})")
        return int(p.value)

    def bo_create(self, size: int, type_: int, flags: int = 0, userptr: int = 0
                  ) -> tuple[int, int]:
        a = U.drm_tacc_bo_create(size=size, userptr=userptr, type=type_, flags=flags)
        self._ioctl(U.DRM_IOCTL_TACC_BO_CREATE, a, "BO_CREATE")
        return int(a.handle), int(a.va)

    def bo_info(self, handle: int) -> U.drm_tacc_bo_info:
        a = U.drm_tacc_bo_info(handle=handle)
        self._ioctl(U.DRM_IOCTL_TACC_BO_INFO, a, "BO_INFO")
        return a

    def vm_bind(self, handle: int, va: int, bo_offset: int, size: int, flags: int
                ) -> tuple[int, int]:
        a = U.drm_tacc_vm_bind(handle=handle, flags=flags, va=va, bo_offset=bo_offset, size=size)
        self._ioctl(U.DRM_IOCTL_TACC_VM_BIND, a, "VM_BIND")
        return int(a.va), int(a.page_size)

    def vm_unbind(self, handle: int) -> None:
        self._ioctl(U.DRM_IOCTL_TACC_VM_UNBIND, U.drm_tacc_vm_unbind(handle=handle), "VM_UNBIND")

    def gem_close(self, handle: int) -> None:
        self._ioctl(U.DRM_IOCTL_TACC_GEM_CLOSE, U.drm_tacc_gem_close(handle=handle), "GEM_CLOSE")

    def mmap_bo(self, handle: int, size: int) -> mmap.mmap:
        info = self.bo_info(handle)
        if not info.mmap_offset:
            raise ioctl_error("BO_INFO", errno.EINVAL, "buffer is not CPU-mappable")
        try:
            return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                             offset=int(info.mmap_offset))
        except OSError as e:
            raise ioctl_error("mmap", e.errno or 0) from None

    def submit(self, queue: int, cmds: C.Array, ncmds: int, in_syncobjs: list[int],
               out_syncobj: int) -> int:
        a = U.drm_tacc_submit(cmds=C.addressof(cmds), num_cmds=ncmds, queue=queue,
                              out_syncobj=out_syncobj, cmd_size=C.sizeof(cmds._type_))
        if in_syncobjs:
            arr = (C.c_uint32 * len(in_syncobjs))(*in_syncobjs)
            a.in_syncobjs = C.addressof(arr)
            a.num_in_syncobjs = len(in_syncobjs)
        self._ioctl(U.DRM_IOCTL_TACC_SUBMIT, a, "SUBMIT")
        return int(a.seqno)

    def wait(self, seqno: int, timeout_ns: int) -> int:
        a = U.drm_tacc_wait(seqno=seqno, timeout_ns=timeout_ns)
        self._ioctl(U.DRM_IOCTL_TACC_WAIT, a, "WAIT")
        return int(a.status)

    def syncobj_create(self, signaled: bool = False) -> int:
        a = U.drm_tacc_syncobj_create(flags=1 if signaled else 0)
        self._ioctl(U.DRM_IOCTL_TACC_SYNCOBJ_CREATE, a, "SYNCOBJ_CREATE")
        return int(a.handle)

    def syncobj_destroy(self, handle: int) -> None:
        self._ioctl(U.DRM_IOCTL_TACC_SYNCOBJ_DESTROY, U.drm_tacc_syncobj_destroy(handle=handle),
                    "SYNCOBJ_DESTROY")

    def syncobj_wait(self, handles: list[int], timeout_abs_ns: int, wait_all: bool = True
                     ) -> bool:
        arr = (C.c_uint32 * len(handles))(*handles)
        a = U.drm_tacc_syncobj_wait(handles=C.addressof(arr), timeout_nsec=timeout_abs_ns,
                                    count_handles=len(handles),
                                    flags=U.SYNCOBJ_WAIT_FLAGS_WAIT_ALL if wait_all else 0)
        try:
            fcntl.ioctl(self.fd, U.DRM_IOCTL_TACC_SYNCOBJ_WAIT, a, True)
        except OSError as e:
            if e.errno in (errno.ETIME, errno.ETIMEDOUT):
                return False
            raise ioctl_error("SYNCOBJ_WAIT", e.errno or 0) from None
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
