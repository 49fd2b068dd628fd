"""Perfetto protobuf trace writer (official protos of the ``perfetto`` package).

Descriptors, interned names, clock snapshot and metadata are built as protobuf
objects (few); the bulk events are encoded by :mod:`.protoenc` in numpy.  Tests decode
the output with ``perfetto_trace_pb2.Trace``.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from . import protoenc as pe
from .model import Batch, CounterBatch, Names, Track

SEQ_ID = 1
CLOCK_MONOTONIC = 3
CLOCK_BOOTTIME = 6

# TrackEvent field numbers
TE_TYPE, TE_TRACK, TE_NAME_IID, TE_ANN = 9, 11, 10, 4
TE_FLOW, TE_TERM, TE_DCOUNTER = 47, 48, 44
TP_TS, TP_TE, TP_SEQ, TP_FLAGS = 8, 11, 10, 13


class PerfettoSink:
    """Streams batches into a ``.pftrace`` file."""

    def __init__(self, f: BinaryIO, names: Names, t0: int, metadata: dict[str, Any],
                 os_tracks: bool = True) -> None:
        self.f = f
        self.os_tracks = os_tracks
        self.names = names
        self.ann = Names()
        self.events = 0
        tr = pb.Trace()
        p = tr.packet.add()
        p.trusted_packet_sequence_id = SEQ_ID
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.trace_packet_defaults.timestamp_clock_id = CLOCK_MONOTONIC
        p = tr.packet.add()
        p.trusted_packet_sequence_id = SEQ_ID
        p.timestamp = max(t0, 0)
        p.timestamp_clock_id = CLOCK_BOOTTIME
        for cid in (CLOCK_BOOTTIME, CLOCK_MONOTONIC):
            c = p.clock_snapshot.clocks.add()
            c.clock_id = cid
            c.timestamp = max(t0, 0)
        p = tr.packet.add()
        p.trusted_packet_sequence_id = SEQ_ID
        md = p.chrome_events.metadata.add()
        md.name = "tacc"
        md.json_value = json.dumps(metadata, default=str)
        self.f.write(tr.SerializeToString())

    # ---------------------------------------------------------- descriptors --
    def tracks(self, new: list[Track], all_tracks: list[Track]) -> None:
        if not new:
            return
        tr = pb.Trace()
        for t in new:
            p = tr.packet.add()
            p.trusted_packet_sequence_id = SEQ_ID
            d = p.track_descriptor
            d.uuid = t.uuid
            d.name = t.name
            d.sibling_order_rank = t.idx
            # OS processes and threads carry Perfetto's descriptors (pid, tid, names:
            # the UI groups them as processes and threads); a process track is a root
            # track, a thread's parent is its process.  In a timeline merged from several
            # nodes pids collide and the node is the root: named plain tracks there.
            os_kind = t.os_kind if self.os_tracks else ""
            if os_kind == "process":
                d.process.pid = t.pid
                if t.os_name:
                    d.process.process_name = t.os_name
            elif os_kind == "thread":
                d.thread.pid = t.pid
                d.thread.tid = t.tid
                if t.os_name:
                    d.thread.thread_name = t.os_name
            if t.parent is not None and os_kind != "process":
                d.parent_uuid = all_tracks[t.parent].uuid
            if t.kind == "group":
                d.child_ordering = pb.TrackDescriptor.EXPLICIT
            if t.kind == "counter":
                d.counter.unit_name = t.unit or ""
        self.f.write(tr.SerializeToString())

    def _interned(self) -> None:
        ev, an = self.names.take_pending(), self.ann.take_pending()
        if not ev and not an:
            return
        tr = pb.Trace()
        p = tr.packet.add()
        p.trusted_packet_sequence_id = SEQ_ID
        p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        for iid, name in ev:
            e = p.interned_data.event_names.add()
            e.iid, e.name = iid, name
        for iid, name in an:
            e = p.interned_data.debug_annotation_names.add()
            e.iid, e.name = iid, name
        self.f.write(tr.SerializeToString())

    # ---------------------------------------------------------- events ------
    def _tail(self) -> list[pe.Seg]:
        return pe.f_const_varint(TP_SEQ, SEQ_ID) + pe.f_const_varint(
            TP_FLAGS, pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)

    def slices(self, b: Batch, uuids: np.ndarray) -> None:
        n = len(b)
        if n == 0:
            return
        ann_ids = {k: self.ann.iid(k) for k in b.args}
        self._interned()
        uuid = uuids[b.track]
        flow = b.flow if b.flow is not None else np.zeros(n, np.uint64)
        term = b.term if b.term is not None else np.zeros(n, bool)
        has = flow != 0
        groups = []
        for gflow, gterm in ((False, False), (True, False), (True, True)):
            m = (has == gflow) & (term == gterm) if gflow else ~has
            idx = np.flatnonzero(m)
            if len(idx) == 0:
                continue
            groups.append((idx, self._slice_rows(b, idx, uuid[idx], flow[idx] if gflow else None,
                                                 gterm, ann_ids)))
        self.f.write(pe.merge_rows(n, groups))
        self.events += n

    def _slice_rows(self, b: Batch, idx: np.ndarray, uuid: np.ndarray, flow: np.ndarray | None,
                    term: bool, ann_ids: dict[str, int]) -> np.ndarray:
        k = len(idx)
        ts = b.ts[idx]
        te: list[pe.Seg] = pe.f_const_varint(TE_TYPE, 1 if b.dur is not None else 3)
        te += pe.f_varint(TE_TRACK, uuid) + pe.f_varint(TE_NAME_IID, b.name[idx])
        for name, col in b.args.items():
            v = col[idx]
            body = pe.f_const_varint(1, ann_ids[name])
            body += pe.f_fixed64(5, v) if v.dtype.kind == "f" else pe.f_varint(3, v)
            te += pe.f_message(TE_ANN, body)
        if flow is not None:
            te += pe.f_fixed64(TE_TERM if term else TE_FLOW, flow)
        begin = pe.packets(k, pe.f_varint(TP_TS, ts) + pe.f_message(TP_TE, te) + self._tail())
        if b.dur is None:
            return begin
        end_te = pe.f_const_varint(TE_TYPE, 2) + pe.f_varint(TE_TRACK, uuid)
        end = pe.packets(k, pe.f_varint(TP_TS, ts + b.dur[idx]) + pe.f_message(TP_TE, end_te)
                         + self._tail())
        return np.hstack([begin, end])

    def counters(self, c: CounterBatch, uuids: np.ndarray) -> None:
        n = len(c)
        if n == 0:
            return
        self._interned()
        te = pe.f_const_varint(TE_TYPE, 4) + pe.f_varint(TE_TRACK, uuids[c.track])
        te += pe.f_fixed64(TE_DCOUNTER, c.value.astype(np.float64))
        rows = pe.packets(n, pe.f_varint(TP_TS, c.ts) + pe.f_message(TP_TE, te) + self._tail())
        self.f.write(rows.tobytes())
        self.events += n

    def findings(self, findings: list[dict[str, Any]], parent_uuid: int, base_uuid: int) -> None:
        """Overlay analysis findings: one track per rule, a slice per time range."""
        tr = pb.Trace()
        rules = sorted({f["rule"] for f in findings})
        for i, rule in enumerate(rules):
            p = tr.packet.add()
            p.trusted_packet_sequence_id = SEQ_ID
            p.track_descriptor.uuid = base_uuid + i
            p.track_descriptor.name = f"finding: {rule}"
            p.track_descriptor.parent_uuid = parent_uuid
        for f in findings:
            uuid = base_uuid + rules.index(f["rule"])
            for t0, t1 in f.get("time_ranges", []):
                for typ, ts in ((pb.TrackEvent.TYPE_SLICE_BEGIN, t0),
                                (pb.TrackEvent.TYPE_SLICE_END, max(t1, t0))):
                    p = tr.packet.add()
                    p.trusted_packet_sequence_id = SEQ_ID
                    p.timestamp = int(ts)
                    p.track_event.type = typ
                    p.track_event.track_uuid = uuid
                    if typ == pb.TrackEvent.TYPE_SLICE_BEGIN:
                        p.track_event.name = f"{f['severity']}: {f.get('title', f['rule'])}"
                        for key in ("severity", "suggestion", "id"):
                            a = p.track_event.debug_annotations.add()
                            a.name = key
                            a.string_value = str(f.get(key, ""))
                        a = p.track_event.debug_annotations.add()
                        a.name = "time_lost_ms"
                        a.double_value = float(f.get("time_lost_ns") or 0) / 1e6
        self.f.write(tr.SerializeToString())


def baseline_packets(b: Batch, uuids: np.ndarray, names: list[str]) -> bytes:
    """The per-event protobuf-object way (benchmark baseline): one TracePacket per event."""
    out = []
    argnames = list(b.args)
    cols = [b.args[k].tolist() for k in argnames]
    ts = b.ts.tolist()
    dur = b.dur.tolist() if b.dur is not None else None
    tracks = uuids[b.track].tolist()
    nm = b.name.tolist()
    flows = b.flow.tolist() if b.flow is not None else [0] * len(ts)
    for i in range(len(ts)):
        p = pb.TracePacket()
        p.timestamp = ts[i]
        p.trusted_packet_sequence_id = SEQ_ID
        te = p.track_event
        te.type = pb.TrackEvent.TYPE_SLICE_BEGIN if dur else pb.TrackEvent.TYPE_INSTANT
        te.track_uuid = tracks[i]
        te.name = names[nm[i]]
        for k, c in zip(argnames, cols, strict=True):
            a = te.debug_annotations.add()
            a.name = k
            if isinstance(c[i], float):
                a.double_value = c[i]
            else:
                a.uint_value = c[i]
        if flows[i]:
            te.flow_ids.append(flows[i])
        out.append(p.SerializeToString())
        if dur:
            e = pb.TracePacket()
            e.timestamp = ts[i] + dur[i]
            e.trusted_packet_sequence_id = SEQ_ID
            e.track_event.type = pb.TrackEvent.TYPE_SLICE_END
            e.track_event.track_uuid = tracks[i]
            out.append(e.SerializeToString())
    return b"".join(out)
