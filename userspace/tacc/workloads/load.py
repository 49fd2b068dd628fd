"""``load``: model weights read from storage and uploaded to the device (docs/workloads.md
"load").

The weights are a safetensors file (an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets"}}`` padded with spaces so the tensors start on
a 4 KiB boundary, then the tensors' bytes, each a multiple of 4 KiB) written to
``storage``: a block device (the VM's NVMe scratch disk, ``$TACC_NVME_DEV``) or a file.
Each tensor is then read with ``O_DIRECT`` in ``READ_CHUNK`` requests into a page-aligned
bounce buffer (real block I/O: no page cache; a file system without ``O_DIRECT`` is read
after ``POSIX_FADV_DONTNEED``), copied into pinned staging memory (the host copy) and
uploaded (``copy_h2d``) into its own device buffer; the uploaded bytes are compared with
the file's.  Each step is a ``tacc.range`` named ``tensor <name>: read`` / ``: copy`` /
``: upload`` (``tacc timeline`` draws one flow per tensor through its block I/O, its
ranges and its upload).

Twins (the bad variant first).  bad: read a tensor, copy it, upload it and wait, then
the next.  good: a reader thread reads tensor i+1 into the other bounce buffer while the
loader copies tensor i into its staging buffer and the device uploads it (two bounce and
two staging buffers, an event per staging buffer).

The bad twin leaves the storage idle while the device uploads and the device idle while
the storage reads: ``tacc analyze`` reports ``load_serialised``.
"""

from __future__ import annotations

import json
import os
import queue
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import tacc
from tacc.runtime import Context

from .common import PAGE, KiB, Result, Span, aligned_empty

READ_CHUNK = 128 * KiB  # bytes per read request (QEMU's NVMe takes up to 512 KiB)
TENSOR_SHAPE = (256, 512)  # float32: 512 KiB
LAYERS = 2  # 4 tensors a layer: 8 tensors, 4 MiB at scale 1


def tensor_names(scale: int = 1) -> list[str]:
    """A GPT-2-like block's weight names, ``LAYERS * scale`` layers."""
    return [f"h.{i}.{w}" for i in range(LAYERS * scale)
            for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]


def make_tensors(scale: int = 1, seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(TENSOR_SHAPE, dtype=np.float32) * 0.02
            for n in tensor_names(scale)}


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


def encode_header(tensors: dict[str, np.ndarray]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The safetensors header (with its 8-byte length) padded to a 4 KiB multiple, and
    each tensor's (file offset, bytes)."""
    off = 0
    meta: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "tacc.workloads.load"}}
    for name, a in tensors.items():
        if a.nbytes % PAGE:
            raise ValueError(f"tensor {name}: {a.nbytes} bytes, not a multiple of {PAGE}")
        meta[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    js = json.dumps(meta, separators=(",", ":")).encode()
    hlen = _align(8 + len(js)) - 8
    header = hlen.to_bytes(8, "little") + js.ljust(hlen, b" ")
    base = len(header)
    return header, {n: (base + m["data_offsets"][0], m["data_offsets"][1] - m["data_offsets"][0])
                    for n, m in meta.items() if n != "__metadata__"}


def read_header(fd: int) -> tuple[dict[str, tuple[int, int, tuple[int, ...]]], int]:
    """name -> (file offset, bytes, shape) from a safetensors file's header, and the bytes
    read for it (page-aligned reads: the first page, then the rest of a longer header)."""
    raw = aligned_empty(PAGE, np.uint8)
    raw[:] = 0
    if os.preadv(fd, [raw], 0) < 8:
        raise ValueError("weights: shorter than a safetensors header")
    hlen = int.from_bytes(raw[:8].tobytes(), "little")
    if hlen > 1 << 24:
        raise ValueError(f"weights: header of {hlen} bytes")
    buf = raw
    if 8 + hlen > PAGE:  # the rest of a header longer than the page read
        buf = aligned_empty(_align(8 + hlen), np.uint8)
        buf[:PAGE] = raw
        if os.preadv(fd, [buf[PAGE:]], PAGE) < 8 + hlen - PAGE:
            raise ValueError("weights: header cut short")
    try:
        meta = json.loads(buf[8:8 + hlen].tobytes())
    except ValueError as e:
        raise ValueError(f"weights: header not JSON: {e}") from None
    out = {}
    for name, m in meta.items():
        if name == "__metadata__":
            continue
        if m.get("dtype") != "F32":
            raise ValueError(f"weights: tensor {name}: dtype {m.get('dtype')}, only F32")
        try:
            a, b = (int(x) for x in m["data_offsets"])
            shape = tuple(int(x) for x in m["shape"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"weights: tensor {name}: no data_offsets [begin, end] and "
                             "shape") from None
        if not 0 <= a <= b:
            raise ValueError(f"weights: tensor {name}: data_offsets [{a}, {b}]")
        out[name] = (8 + hlen + a, b - a, shape)
    return out, len(buf)


def write_weights(path: str, tensors: dict[str, np.ndarray]) -> int:
    """Writes the safetensors file to ``path`` (a block device's first bytes, or a file),
    synced to the device and out of the page cache; returns its size."""
    header, offs = encode_header(tensors)
    flags = os.O_WRONLY | (0 if _is_block(path) else os.O_CREAT | os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        size = len(header) + sum(n for _, n in offs.values())
        if _is_block(path):
            dev_size = os.lseek(fd, 0, os.SEEK_END)
            if dev_size < size:
                raise ValueError(f"{path}: {dev_size} bytes, the weights need {size}")
        os.pwrite(fd, header, 0)
        for name, a in tensors.items():
            os.pwrite(fd, a.tobytes(), offs[name][0])
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return size


def _is_block(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def open_direct(path: str) -> tuple[int, bool]:
    """``path`` opened for reading with O_DIRECT (True), or, where the file system refuses
    it (tmpfs), buffered with its page cache dropped (False)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return fd, False


def default_storage() -> str:
    """$TACC_NVME_DEV (the VM's NVMe scratch disk, scripts/run-vm NVME=1), else a file in
    the temporary directory."""
    dev = os.environ.get("TACC_NVME_DEV", "")
    if dev:
        return dev
    return str(Path(tempfile.gettempdir()) / f"tacc-load-{os.getpid()}.safetensors")


def _read_into(fd: int, buf: np.ndarray, offset: int) -> int:
    """``buf`` (page-aligned, a multiple of 4 KiB) from ``offset``, READ_CHUNK per request."""
    done = 0
    view = memoryview(buf)
    while done < len(buf):
        n = os.preadv(fd, [view[done:done + READ_CHUNK]], offset + done)
        if n <= 0:
            raise ValueError(f"weights: short read at {offset + done}")
        done += n
    return done


def load(ctx: Context, bad: bool, scale: int = 1, check: bool = True,
         storage: str | None = None) -> Result:
    """Writes the weights to ``storage``, then reads and uploads every tensor: in turn
    (bad) or pipelined (good); the measured section is the load."""
    if scale < 1:
        raise ValueError("scale must be >= 1")
    path = storage or default_storage()
    own_file = not storage and not os.environ.get("TACC_NVME_DEV")
    tensors = make_tensors(scale)
    file_bytes = write_weights(path, tensors)
    try:
        return _load(ctx, bad, path, tensors, file_bytes, check)
    finally:
        if own_file:
            Path(path).unlink(missing_ok=True)


def _load(ctx: Context, bad: bool, path: str, tensors: dict[str, np.ndarray],
          file_bytes: int, check: bool) -> Result:
    fd, direct = open_direct(path)
    try:
        index, header_read = read_header(fd)
        names = list(index)
        biggest = max(n for _, n, _ in index.values())
        dev = {n: ctx.device_buffer(index[n][1], np.uint8) for n in names}
        nbuf = 1 if bad else 2
        bounce = [aligned_empty(biggest, np.uint8) for _ in range(nbuf)]
        staging = [ctx.host_buffer(biggest, np.uint8) for _ in range(nbuf)]
        s = ctx.stream()
        stages = {"read_ns": 0, "copy_ns": 0}
        span = Span(ctx, [s])
        t0 = time.monotonic_ns()

        def read(name: str, b: int) -> None:
            off, n, _ = index[name]
            t = time.monotonic_ns()
            with tacc.range(f"tensor {name}: read"):
                _read_into(fd, bounce[b][:n], off)
            stages["read_ns"] += time.monotonic_ns() - t

        def copy_upload(name: str, b: int) -> None:
            n = index[name][1]
            t = time.monotonic_ns()
            with tacc.range(f"tensor {name}: copy"):
                np.copyto(staging[b].array[:n], bounce[b][:n])
            stages["copy_ns"] += time.monotonic_ns() - t
            with tacc.range(f"tensor {name}: upload"):
                s.copy_h2d(dev[name], staging[b], n)

        if bad:
            for name in names:
                read(name, 0)
                copy_upload(name, 0)
                s.synchronize()  # staging is reused by the next tensor
        else:
            # the reader thread reads tensor i+1 into the other bounce buffer while this
            # thread copies tensor i into its staging buffer and the device uploads it
            ready: queue.Queue[tuple[str, int] | BaseException] = queue.Queue()
            bounce_free = [threading.Semaphore(1) for _ in range(nbuf)]

            def reader() -> None:
                try:
                    for i, name in enumerate(names):
                        bounce_free[i % nbuf].acquire()  # copied out by the loader
                        read(name, i % nbuf)
                        ready.put((name, i % nbuf))
                except BaseException as e:  # noqa: BLE001 (handed to the loader)
                    ready.put(e)

            th = threading.Thread(target=reader, name="tacc-load-reader", daemon=True)
            th.start()
            events: list[Any] = [None] * nbuf
            for _ in names:
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                name, b = item
                if events[b] is not None:
                    events[b].synchronize()  # staging[b]'s previous upload has finished
                copy_upload(name, b)
                bounce_free[b].release()
                events[b] = s.record()
            s.synchronize()
            th.join()
        wall = time.monotonic_ns() - t0
        span.stop()
        ok = False
        if check:  # every tensor downloaded into one pinned buffer, one wait, compared
            back = ctx.host_buffer(sum(index[n][1] for n in names), np.uint8)
            offs = np.cumsum([0] + [index[n][1] for n in names])
            for name, o in zip(names, offs.tolist(), strict=False):
                s.copy_d2h(back, dev[name], index[name][1], dst_offset=o)
            s.synchronize()
            for name, o in zip(names, offs.tolist(), strict=False):
                want = np.ascontiguousarray(tensors[name]).view(np.uint8).reshape(-1)
                got = back.array[o:o + len(want)]
                assert np.array_equal(got, want), f"load: tensor {name} differs from the file"
            back.free()
            ok = True
        tensor_bytes = sum(n for _, n, _ in index.values())
        r = Result(workload="load", variant="bad" if bad else "good", device=ctx.device.pci,
                   device_ns=span.device_ns, wall_ns=wall, jobs=s.jobs_submitted,
                   api_calls=len(names), bytes_h2d=tensor_bytes, checked=ok,
                   params={"tensors": len(names), "tensor_bytes": tensor_bytes,
                           "read_chunk": READ_CHUNK, "storage": path},
                   extra={"file_bytes": file_bytes, "o_direct": direct,
                          "bytes_read": header_read + tensor_bytes,
                          "read_requests": sum(-(-n // READ_CHUNK) for _, n, _ in
                                               index.values()),
                          "offsets": {n: [o, m] for n, (o, m, _) in index.items()},
                          **stages})
        for bufs in (staging, list(dev.values())):
            for x in bufs:
                x.free()
        return r
    finally:
        os.close(fd)
