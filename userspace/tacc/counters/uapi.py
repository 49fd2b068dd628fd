"""The few tacc ioctls the counter tools use: the ctypes layouts and numbers of
:mod:`tacc.runtime.uapi` (the one Python definition of the uAPI) under the names this
package uses; tests/host/test_counters_uapi.py compiles the header and checks every size
and offset of these.
"""

from __future__ import annotations

import ctypes as C
import fcntl

from tacc.runtime import uapi as _u

PARAM_FUNC = _u.PARAM_FUNC
PARAM_COUNTERS_MMAP_OFFSET = _u.PARAM_COUNTERS_MMAP_OFFSET
PARAM_COUNTERS_MMAP_SIZE = _u.PARAM_COUNTERS_MMAP_SIZE
PARAM_DEVCLK = _u.PARAM_DEVCLK
PARAM_QUEUE_SIZE = _u.PARAM_QUEUE_SIZE

OP_COPY_H2D = _u.OP_COPY_H2D
OP_COPY_D2H = _u.OP_COPY_D2H
OP_TIMESTAMP = _u.OP_TIMESTAMP
BO_HOST = _u.BO_HOST
BO_DEVICE = _u.BO_DEVICE

GetParam = _u.drm_tacc_get_param
BoCreate = _u.drm_tacc_bo_create
BoInfo = _u.drm_tacc_bo_info
Operand = _u.drm_tacc_operand
Cmd = _u.drm_tacc_cmd
Submit = _u.drm_tacc_submit
Wait = _u.drm_tacc_wait
GemClose = _u.drm_tacc_gem_close

IOCTL_GET_PARAM = _u.DRM_IOCTL_TACC_GET_PARAM
IOCTL_BO_CREATE = _u.DRM_IOCTL_TACC_BO_CREATE
IOCTL_BO_INFO = _u.DRM_IOCTL_TACC_BO_INFO
IOCTL_SUBMIT = _u.DRM_IOCTL_TACC_SUBMIT
IOCTL_WAIT = _u.DRM_IOCTL_TACC_WAIT
IOCTL_GEM_CLOSE = _u.DRM_IOCTL_TACC_GEM_CLOSE

COUNTERS_MMAP_OFFSET = _u.MMAP_COUNTERS


def ioctl(fd: int, req: int, arg: C.Structure) -> C.Structure:
    fcntl.ioctl(fd, req, arg, True)
    return arg


def get_param(fd: int, param: int, index: int = 0) -> int:
    return int(ioctl(fd, IOCTL_GET_PARAM, GetParam(param, index, 0)).value)  # type: ignore[attr-defined]
