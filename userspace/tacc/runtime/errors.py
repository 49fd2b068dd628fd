"""Exceptions of the tacc runtime: every failure names what went wrong, never a bare errno."""

from __future__ import annotations

import errno as _errno
import os

from tacc.errors import DeviceError, TaccError


class DeviceNotFoundError(TaccError):
    """No tacc device matches (no module loaded, wrong PCI address, no accel node)."""


class DevicePermissionError(TaccError):
    """The accel node exists but this user may not open it."""


class ContextClosedError(TaccError):
    """An operation on a closed Context (or an object of one)."""


class UseAfterFreeError(TaccError):
    """A buffer (or event/stream) used after ``free()``/``close()``."""


class WrongDeviceError(TaccError):
    """An object of one context/device used with another."""


class DtypeError(TaccError, TypeError):
    """An operand has a dtype the operation does not support."""


class ShapeError(TaccError, ValueError):
    """Operand shapes or sizes do not fit the operation."""


class BufferKindError(TaccError, TypeError):
    """The operation needs another kind of buffer (host vs device)."""


class OutOfMemoryError(TaccError, MemoryError):
    """Device memory, pinned-memory quota or buffer count exhausted."""


class DeviceTimeoutError(DeviceError, TimeoutError):
    """A wait timed out."""


class DriverError(TaccError):
    """An ioctl failed for a reason the runtime did not anticipate; carries the errno."""

    def __init__(self, msg: str, err: int = 0) -> None:
        super().__init__(msg)
        self.errno = err


JOB_STATUS = {
    -_errno.ETIMEDOUT: "the job hung and was reset (timeout)",
    -_errno.EFAULT: "device MMU fault (an operand is not mapped for the device)",
    -_errno.EIO: "DMA error (the IOMMU refused an access)",
    -_errno.EINVAL: "the device rejected a command (bad length, shape or alignment)",
    -_errno.ECANCELED: "the job was aborted (queue or device reset)",
}


def job_error(status: int, what: str) -> DeviceError:
    text = JOB_STATUS.get(status, os.strerror(-status) if status < 0 else f"status {status}")
    cls = DeviceTimeoutError if status == -_errno.ETIMEDOUT else DeviceError
    return cls(f"{what}: {text}", status)


def ioctl_error(name: str, err: int, detail: str = "") -> TaccError:
    """Maps an ioctl errno to the exception a user understands."""
    what = f"{name}{': ' + detail if detail else ''}"
    if err in (_errno.ENOSPC, _errno.ENOMEM):
        return OutOfMemoryError(f"{what}: out of device memory or pinned-memory quota "
                                f"({_errno.errorcode.get(err, err)})")
    if err == _errno.EMFILE:
        return OutOfMemoryError(f"{what}: too many buffers in this context")
    if err == _errno.EDQUOT:
        return OutOfMemoryError(f"{what}: this user's limit on the function reached (contexts, "
                                "buffers or device memory: tacc.ko's per-user limits)")
    if err == _errno.ENOENT:
        return UseAfterFreeError(f"{what}: the driver does not know this buffer handle "
                                 "(freed, or from another context)")
    if err in (_errno.EACCES, _errno.EPERM):
        return DevicePermissionError(f"{what}: permission denied")
    if err == _errno.ENODEV:
        return DeviceNotFoundError(f"{what}: the device is gone (removed or reset)")
    if err == _errno.ETIME:
        return DeviceTimeoutError(f"{what}: timed out")
    return DriverError(f"{what}: {os.strerror(err)} ({_errno.errorcode.get(err, err)})", err)
