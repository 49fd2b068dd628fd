"""tacc: development and profiling stack for the tacc PCIe ML inference accelerator."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``tacc.range`` (tacc.runtime.ranges), imported on first use: ``import tacc`` stays
    light for the tools that never touch the runtime."""
    if name in ("range", "Range"):
        from tacc.runtime import ranges

        return getattr(ranges, name)
    raise AttributeError(f"module 'tacc' has no attribute {name!r}")
