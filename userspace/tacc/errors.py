"""The root of tacc's exceptions: a :class:`TaccError` is a failure its user can act
on, and its message is one line.  The ``tacc`` CLI prints any of them as
``tacc: error: <message>`` without a traceback and exits with status 1 (a runtime
failure: a device error, a bad capture file, nothing found), or 2 for a
:class:`UsageError` (a bad option value or combination, as argparse's own errors); every
package's own errors (captures, counters, devices, the runtime, VFIO, the fleet tools)
derive from it (docs/cli.md)."""

from __future__ import annotations


class TaccError(Exception):
    """A library failure with a one-line message."""


class UsageError(TaccError):
    """The command line asked for something it cannot mean: an option value out of its
    range or syntax, options that exclude each other, a missing argument argparse could
    not check.  Exit status 2, as argparse's own errors; a library error about an
    argument derives from its package's error and this one."""


class DeviceError(TaccError):
    """A device, or a request to one, failed: a job's fault, a refused step, a device
    argument that sysfs cannot satisfy.  ``status``: the device's status, when it gave one."""

    def __init__(self, msg: str, status: int = 0) -> None:
        super().__init__(msg)
        self.status = status


class VfioError(TaccError, OSError):
    """A VFIO step (bind, unbind, container, group, mmap, ioctl) failed: ``VfioError(msg)``
    or, with the kernel's errno, ``VfioError(errno, msg)``."""


class MissingExtraError(TaccError, ImportError):
    """An optional dependency is not installed: the message names the extra to install."""


def require_extra(module: str, extra: str, what: str) -> object:
    """Import @module, or raise :class:`MissingExtraError` naming ``pip install
    'tacc[EXTRA]'`` for @what."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = " ".join(str(exc).split())
        raise MissingExtraError(
            f"{what} needs {module.split('.')[0]!r}, which cannot be imported "
            f"({exc.__class__.__name__}: {why}); install it with: pip install 'tacc[{extra}]'"
        ) from None
