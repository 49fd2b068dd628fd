"""Fleet analysis on existing engines: Parquet export (pyarrow), SQL over it
(DuckDB, embedded) and per-capture analysis on a Dask distributed cluster.

See docs/export.md.  pyarrow, duckdb and dask are imported lazily through
:func:`tacc.fleet.deps.require`, so a missing one is one line naming it.
"""
