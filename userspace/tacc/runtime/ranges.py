"""``tacc.range("name")``: a named span of the program, NVTX-like, recorded in the API ring.

    import tacc

    with tacc.range("decode step 3"):
        with tacc.range("L0"):
            ...

    @tacc.range("prefill")
    def prefill(...): ...

    @tacc.range          # the range is named after the function
    def step(...): ...

A range is one API record (name ``range``, the range's name in ``args``, ``tag`` 0, its
start and end in ``t_start`` / ``t_end``) written to the calling thread's ring when the
range ends, so it costs what a traced call costs (one ``begin`` at entry, one ``end`` at
exit; with tracing off, one byte read of the ring header).  Ranges of a thread nest by
time; the API calls made inside a range, and through their tags the jobs and device
commands they submitted, belong to it (``tacc timeline`` nests them, docs/timeline.md).
A range left by an exception is recorded with status -1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

from . import apitrace as tr

N_RANGE = tr.NAME_ID["range"]
F = TypeVar("F", bound=Callable[..., Any])


class Range:
    """A named range: a context manager (reentrant: nested ``with`` of one object keep
    their own start times) and a decorator."""

    __slots__ = ("name", "_t0")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("tacc.range: the name must be a non-empty string")
        self.name = name
        self._t0: list[int] = []

    def __enter__(self) -> Range:
        self._t0.append(tr.begin())
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t0 = self._t0.pop()
        if t0:
            tr.end(t0, N_RANGE, 0, 0, tr.NO_DEV, tr.NO_CTX, -1 if exc_type else 0, self.name)

    def __call__(self, fn: F) -> F:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = tr.begin()
            st = -1
            try:
                out = fn(*a, **kw)
                st = 0
                return out
            finally:
                if t0:
                    tr.end(t0, N_RANGE, 0, 0, tr.NO_DEV, tr.NO_CTX, st, name)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"tacc.range({self.name!r})"


@overload
def range(name: str) -> Range: ...  # noqa: A001


@overload
def range(name: F) -> F: ...  # noqa: A001


def range(name: Any) -> Any:  # noqa: A001  (NVTX's name for it; tacc.range)
    """``tacc.range("name")`` (context manager or decorator), or ``@tacc.range`` on a
    function (the range takes the function's qualified name)."""
    if callable(name):
        return Range(getattr(name, "__qualname__", None) or repr(name))(name)
    return Range(name)
