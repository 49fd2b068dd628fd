"""What a scan of memory found: the byte values a buffer holds."""

from __future__ import annotations

import numpy as np


def byte_values(buf: object) -> set[int]:
    """Every byte value in ``buf`` (anything the buffer protocol exposes as bytes).

    One counting pass (``np.bincount`` over 256 bins), not a sort or a hash of every byte
    as ``np.unique`` does: isolation tests scan whole device windows with it, and in the
    test VM ``np.unique`` on their 1 MiB chunks took 8 s of guest time per extras boot."""
    counts = np.bincount(np.frombuffer(buf, np.uint8), minlength=256)
    return {int(v) for v in np.flatnonzero(counts)}
