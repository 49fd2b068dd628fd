"""numpy structured dtypes -> Arrow schemas and record batches, generically.

The export knows no stream by name: every field of the dtype a capture's stream file
declares becomes a column (docs/export.md, "Types"):

- integers, floats (float16 widened to float32), bool: the same Arrow type, native order;
- fixed-size bytes ``S<n>``: ``string``, read as a C string (up to the first NUL, as the
  kernel's ``comm`` and the writer's NUL-padded text are meant); bytes that are not UTF-8
  replaced by U+FFFD; ``U<n>``: ``string`` (up to the first NUL too);
- a sub-array field ``(type, shape)``: ``fixed_size_list`` of its elements in C order;
- a nested structured field: ``struct`` of its fields, recursively;
- void fields without fields (``V<n>``: padding), and structures or sub-arrays of nothing
  else: no column;
- datetime64 / timedelta64: Arrow timestamp / duration.

Conversion is one numpy -> Arrow call per column and chunk; no Python per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .deps import require


class UnsupportedDtype(ValueError):
    """A dtype this mapping has no Arrow type for (object fields)."""


@dataclass(frozen=True)
class Column:
    name: str
    dtype: np.dtype  # the field's dtype (sub-array and struct dtypes included)


def columns(dt: np.dtype) -> list[Column]:
    """The fields of ``dt`` that become columns (void padding dropped), in order."""
    out = []
    for name in dt.names or ():
        fdt = dt.fields[name][0]
        if _is_padding(fdt):
            continue
        out.append(Column(name, fdt))
    return out


def _is_padding(fdt: np.dtype) -> bool:
    """Void bytes, or a nested structure of nothing but void bytes."""
    if fdt.subdtype is not None:
        return _is_padding(fdt.subdtype[0])
    if fdt.names is not None:
        return not columns(fdt)
    return fdt.kind == "V"


def arrow_type(fdt: np.dtype) -> Any:
    """The Arrow type of one field's dtype."""
    pa = require("pyarrow")
    if fdt.subdtype is not None:
        base, shape = fdt.subdtype
        return pa.list_(arrow_type(base), int(np.prod(shape)))
    if fdt.names is not None:
        return pa.struct([pa.field(c.name, arrow_type(c.dtype)) for c in columns(fdt)])
    k = fdt.kind
    if k in "iub":
        return pa.from_numpy_dtype(fdt.newbyteorder("="))
    if k == "f":
        return pa.float32() if fdt.itemsize == 2 else pa.from_numpy_dtype(fdt.newbyteorder("="))
    if k in "SU":
        return pa.string()
    if k in "Mm":
        return pa.from_numpy_dtype(fdt.newbyteorder("="))
    raise UnsupportedDtype(f"no Arrow type for numpy dtype {fdt.str!r}")


def schema(dt: np.dtype, metadata: dict[str, str] | None = None) -> Any:
    pa = require("pyarrow")
    if not columns(dt):  # a batch without columns cannot carry its row count
        raise UnsupportedDtype(f"numpy dtype {dt} has no fields other than padding")
    return pa.schema([pa.field(c.name, arrow_type(c.dtype)) for c in columns(dt)],
                     metadata=metadata)


def to_array(col: np.ndarray) -> Any:
    """One field's values (``arr[name]``: one row per record; a sub-array field gives
    more dimensions) as an Arrow array."""
    pa = require("pyarrow")
    if col.ndim > 1:
        n = int(np.prod(col.shape[1:]))
        return pa.FixedSizeListArray.from_arrays(to_array(np.ascontiguousarray(col).reshape(-1)),
                                                 n)
    fdt = col.dtype
    if fdt.names is not None:
        cols = columns(fdt)
        return pa.StructArray.from_arrays([to_array(col[c.name]) for c in cols],
                                          fields=[pa.field(c.name, arrow_type(c.dtype))
                                                  for c in cols])
    k = fdt.kind
    if k in "iubfMm":
        want = np.dtype("<f4") if k == "f" and fdt.itemsize == 2 else fdt.newbyteorder("=")
        return pa.array(np.ascontiguousarray(col, dtype=want), type=arrow_type(fdt))
    if k == "U":
        return pa.array(col, type=pa.string())
    if k == "S":
        return _bytes_to_string(col)
    raise UnsupportedDtype(f"no Arrow type for numpy dtype {fdt.str!r}")


def _bytes_to_string(col: np.ndarray) -> Any:
    """``S<n>`` -> Arrow string: up to the first NUL (Arrow's reading of numpy ``S``),
    UTF-8 checked by Arrow's cast; a chunk with invalid UTF-8 is decoded with
    replacement characters instead."""
    pa = require("pyarrow")
    binary = pa.array(np.ascontiguousarray(col), type=pa.binary())
    text = binary.view(pa.string())  # same buffers; not pyarrow.compute's cast, whose
    try:  # import costs seconds in the test VM
        text.validate(full=True)  # UTF-8
        return text
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", "replace") for b in binary.to_pylist()],
                        type=pa.string())


def to_batch(arr: np.ndarray, schema_: Any, extra: dict[str, Any] | None = None) -> Any:
    """A record batch of ``arr`` (structured) with the columns of ``schema_``; ``extra``
    gives ready Arrow arrays for columns that are not fields of ``arr``."""
    pa = require("pyarrow")
    extra = extra or {}
    cols = [extra[f.name] if f.name in extra else to_array(arr[f.name]) for f in schema_]
    return pa.RecordBatch.from_arrays(cols, schema=schema_)
