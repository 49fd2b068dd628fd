"""Length + CRC framing of one stream file.

File layout::

    file header   "TACCSTR\\0" u16 version u16 0 u32 json_len u32 crc32(json) + json
    chunk*        "TCK1" u32 seq u32 nrecords u32 nbytes u32 crc32(payload)
                  u32 crc32(first 20 header bytes), then nbytes of records

A reader takes every whole chunk up to the first damage (short header, bad magic or
CRC, wrong sequence number, short payload) and reports where and why it stopped.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from .errors import CaptureVersionError, FramingError

try:  # ISA-L's CRC-32: the same polynomial, bit order and result as zlib's, faster
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - setup installs isal; zlib is the fallback
    _isal_crc32 = None

#: crc32(data, value=0): zlib's CRC-32 (the format's), computed by ISA-L when installed.
crc32 = _isal_crc32 if _isal_crc32 is not None else zlib.crc32
CRC32_IMPL = "isal" if _isal_crc32 is not None else "zlib"

FILE_MAGIC = b"TACCSTR\0"
FILE_VERSION = 1
CHUNK_MAGIC = b"TCK1"
_FILE_HDR = struct.Struct("<8sHHII")
_CHUNK_HDR = struct.Struct("<4sIIIII")
CHUNK_HEADER_SIZE = _CHUNK_HDR.size
MAX_HEADER_JSON = 1 << 20


def encode_file_header(info: dict) -> bytes:
    body = json.dumps(info, sort_keys=True).encode()
    return _FILE_HDR.pack(FILE_MAGIC, FILE_VERSION, 0, len(body), crc32(body)) + body


def encode_chunk_header(seq: int, nrecords: int, nbytes: int, payload_crc: int) -> bytes:
    """The 24-byte chunk header of a payload of ``nbytes`` whose crc32 is ``payload_crc``
    (a writer that has the payload in pieces crcs them in turn and writes them after it)."""
    head = struct.pack("<4sIIII", CHUNK_MAGIC, seq, nrecords, nbytes, payload_crc)
    return head + struct.pack("<I", crc32(head))


def encode_chunk(seq: int, nrecords: int, payload: bytes | memoryview) -> bytes:
    return encode_chunk_header(seq, nrecords, len(payload), crc32(payload)) + bytes(payload)


def read_file_header(f: BinaryIO, what: str) -> tuple[dict, int]:
    """Parse the stream file header; returns (info, offset of the first chunk)."""
    raw = f.read(_FILE_HDR.size)
    if len(raw) < _FILE_HDR.size:
        raise FramingError(f"{what}: truncated stream header ({len(raw)} bytes)")
    magic, version, _, jlen, crc = _FILE_HDR.unpack(raw)
    if magic != FILE_MAGIC:
        raise FramingError(f"{what}: not a tacc capture stream (bad magic)")
    if version != FILE_VERSION:
        raise CaptureVersionError(
            f"{what}: stream framing version {version} is not supported (this reader knows "
            f"{FILE_VERSION})"
        )
    if jlen > MAX_HEADER_JSON:
        raise FramingError(f"{what}: stream header too large ({jlen} bytes)")
    body = f.read(jlen)
    if len(body) < jlen:
        raise FramingError(f"{what}: truncated stream header")
    if crc32(body) != crc:
        raise FramingError(f"{what}: stream header CRC mismatch")
    try:
        info = json.loads(body)
    except ValueError as exc:
        raise FramingError(f"{what}: stream header is not JSON ({exc})") from None
    if not isinstance(info, dict):
        raise FramingError(f"{what}: stream header is not a JSON object")
    return info, _FILE_HDR.size + jlen


@dataclass(frozen=True)
class ChunkRef:
    seq: int
    offset: int  # of the payload in the file
    nrecords: int
    nbytes: int
    crc: int


@dataclass(frozen=True)
class Damage:
    offset: int  # file offset where whole chunks end
    reason: str


def scan_chunks(
    f: BinaryIO, start: int, itemsize: int, verify_payload: bool = True
) -> tuple[list[ChunkRef], Damage | None]:
    """Walk the chunk headers from ``start``; stop at EOF or at the first damage.

    With ``verify_payload`` each payload's CRC is checked (reads the data once).
    Never raises on malformed data: damage is returned.
    """
    refs: list[ChunkRef] = []
    off = start
    f.seek(off)
    seq = 0
    while True:
        head = f.read(CHUNK_HEADER_SIZE)
        if not head:
            return refs, None
        if len(head) < CHUNK_HEADER_SIZE:
            return refs, Damage(off, f"truncated chunk header at byte {off}")
        magic, cseq, nrec, nbytes, crc, hcrc = _CHUNK_HDR.unpack(head)
        if magic != CHUNK_MAGIC:
            return refs, Damage(off, f"bad chunk magic at byte {off}")
        if crc32(head[:20]) != hcrc:
            return refs, Damage(off, f"chunk header CRC mismatch at byte {off}")
        if cseq != seq:
            return refs, Damage(off, f"chunk {cseq} found where chunk {seq} was due at byte {off}")
        if itemsize <= 0 or nbytes != nrec * itemsize:
            return refs, Damage(off, f"chunk size {nbytes} is not {nrec} records at byte {off}")
        poff = off + CHUNK_HEADER_SIZE
        if verify_payload:
            payload = f.read(nbytes)
            if len(payload) < nbytes:
                return refs, Damage(off, f"truncated chunk payload at byte {poff}")
            if crc32(payload) != crc:
                return refs, Damage(off, f"chunk payload CRC mismatch at byte {poff}")
        else:
            f.seek(0, 2)
            if f.tell() < poff + nbytes:
                return refs, Damage(off, f"truncated chunk payload at byte {poff}")
            f.seek(poff + nbytes)
        refs.append(ChunkRef(cseq, poff, nrec, nbytes, crc))
        seq += 1
        off = poff + nbytes


def read_payload(f: BinaryIO, ref: ChunkRef, what: str) -> bytes:
    f.seek(ref.offset)
    payload = f.read(ref.nbytes)
    if len(payload) < ref.nbytes or crc32(payload) != ref.crc:
        raise FramingError(f"{what}: chunk {ref.seq} changed or damaged while reading")
    return payload


def iter_payloads(
    f: BinaryIO, start: int, itemsize: int, strict: bool, what: str
) -> Iterator[tuple[int, bytes]]:
    """Yield (nrecords, payload) of whole chunks in order; in strict mode damage raises
    :class:`FramingError`, otherwise iteration stops before it."""
    refs, damage = scan_chunks(f, start, itemsize)
    for ref in refs:
        yield ref.nrecords, read_payload(f, ref, what)
    if damage is not None and strict:
        raise FramingError(f"{what}: {damage.reason}")
