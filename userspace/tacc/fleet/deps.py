"""Optional engines: imported on first use; a missing one is one clear line."""

from __future__ import annotations

import importlib
from types import ModuleType

from tacc.errors import MissingExtraError

# import name -> (pip requirement, what it is used for)
ENGINES: dict[str, tuple[str, str]] = {
    "pyarrow": ("pyarrow", "Parquet export"),
    "pyarrow.parquet": ("pyarrow", "Parquet export"),
    "duckdb": ("duckdb", "tacc query (SQL)"),
    "dask": ("dask[distributed]", "distributed analysis"),
    "distributed": ("dask[distributed]", "distributed analysis"),
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg, what = ENGINES.get(module, (module, "this command"))
        why = " ".join(str(exc).split())
        raise MissingExtraError(
            f"{what} needs the Python package {pkg!r}, which cannot be imported "
            f"({exc.__class__.__name__}: {why}); install it with: pip install 'tacc[fleet]'"
        ) from None
