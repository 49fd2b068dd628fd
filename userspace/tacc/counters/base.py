"""What every counter backend is: a :class:`Backend` reads one function's counters
into a :class:`Snapshot` (tacc.counters.backends: sysfs, mmap, perf; tacc.counters.device:
the device's sample ring)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from .catalogue import Catalogue, Function


@dataclass
class Snapshot:
    values: np.ndarray  # uint64, one per counter of the backend's catalogue
    t_ns: int  # CLOCK_MONOTONIC, middle of the read
    valid: bool = True  # False: the source returned no defined value (see state)
    state: str = "ok"  # ok | unavailable (function in D3hot or in reset) | torn
    retries: int = 0  # seqlock retries (mmap)


class Backend(ABC):
    name = "?"

    def __init__(self, fn: Function, catalogue: Catalogue | None = None) -> None:
        self.fn = fn
        self.catalogue = catalogue if catalogue is not None else fn.catalogue

    @abstractmethod
    def read(self) -> Snapshot: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        return None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
