"""``tacc query DIR 'SQL'``: DuckDB, embedded (in this process, no server), over an export.

Every dataset of the export is a view named after it (``device_trace``, ``api``, ...,
``captures``, ``functions``) with the hive partition columns ``node`` and ``capture``
(VARCHAR); files of different minor versions are read by column name
(``union_by_name``), so a column a capture lacks reads as NULL.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from tacc.errors import TaccError

from .deps import require
from .export import EXPORT_FORMAT, EXPORT_VERSION, MANIFEST


def load_manifest(root: Path) -> dict[str, Any]:
    p = root / MANIFEST
    if not root.is_dir():
        raise TaccError(f"query: {root}: no such export directory")
    if not p.exists():
        raise TaccError(f"query: {root}: not a tacc export (no {MANIFEST})")
    try:
        doc = json.loads(p.read_text())
    except ValueError:
        raise TaccError(f"query: {p}: not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise TaccError(f"query: {p}: does not describe a tacc export")
    if doc.get("version") != EXPORT_VERSION:
        raise TaccError(f"query: {root}: export version {doc.get('version')!r} is not "
                           f"supported (this tacc reads version {EXPORT_VERSION})")
    return doc


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def connect(root: Path) -> Any:
    """An in-memory DuckDB connection with one view per dataset of the export."""
    duckdb = require("duckdb")
    load_manifest(root)
    con = duckdb.connect(":memory:")
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not any(d.glob("node=*/capture=*/*.parquet")):
            continue
        glob = _sql_str(str(d / "node=*" / "capture=*" / "*.parquet"))
        con.execute(f'CREATE VIEW "{d.name}" AS SELECT * FROM read_parquet({glob}, '
                    "hive_partitioning = true, hive_types_autocast = false, "
                    "union_by_name = true)")
    return con


def one_line(exc: BaseException) -> str:
    """DuckDB's message on one line (it adds the SQL and a caret on further lines)."""
    text = str(exc).split("\n\nLINE ")[0]
    return " ".join(text.split())


def run_query(root: Path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    duckdb = require("duckdb")
    con = connect(root)
    try:
        cur = con.execute(sql)
        if cur.description is None:
            return [], []
        cols = [c[0] for c in cur.description]
        return cols, cur.fetchall()
    except duckdb.Error as exc:
        raise TaccError(f"query: {one_line(exc)}") from None
    finally:
        con.close()


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    try:  # Decimal (SUM of integers), HUGEINT
        i = int(v)
        return i if i == v else float(v)
    except (TypeError, ValueError):
        return str(v)


def write_json(out: TextIO, cols: list[str], rows: list[tuple[Any, ...]]) -> None:
    json.dump([{c: _plain(v) for c, v in zip(cols, r, strict=True)} for r in rows], out,
              indent=1)
    out.write("\n")


def write_csv(out: TextIO, cols: list[str], rows: list[tuple[Any, ...]]) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if v is None else _cell(v) for v in r])


def _cell(v: Any) -> str:
    v = _plain(v)
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list | dict):
        return json.dumps(v)
    return str(v)


def write_table(out: TextIO, cols: list[str], rows: list[tuple[Any, ...]]) -> None:
    """Columns aligned, numbers right-aligned, then a row count."""
    cells = [[_cell(v) for v in r] for r in rows]
    num = [all(isinstance(_plain(r[i]), int | float) or r[i] is None for r in rows)
           for i in range(len(cols))]
    width = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w)
                         for v, w, n in zip(vals, width, num, strict=True)).rstrip()

    if cols:
        out.write(line(cols) + "\n")
        out.write("  ".join("-" * w for w in width) + "\n")
    for r in cells:
        out.write(line(r) + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def main(root: Path, sql: str, fmt: str, out: TextIO | None = None) -> int:
    cols, rows = run_query(root, sql)
    {"json": write_json, "csv": write_csv}.get(fmt, write_table)(out or sys.stdout, cols, rows)
    return 0
