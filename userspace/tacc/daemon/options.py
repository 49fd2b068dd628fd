"""A capture's options (``tacc trace start``'s, taccd's ``start`` request): checked here,
before any device is touched, by the client and by taccd alike.  No numpy and no capture
module at import: ``tacc trace start`` is a socket request, and each module a command
imports costs seconds of a guest's time under TCG (docs/measurements.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTER_SOURCES = ("device", "host")


@dataclass
class Options:
    host_events: bool = True
    device_trace: bool = True
    api: bool = True
    # the IOCTL records (one per tacc ioctl of a traced process); false: the per-job facts
    # only (docs/capture-format.md), the ioctl tracepoints not attached
    ioctl_events: bool = True
    counters_hz: float = 20.0
    # "host" (default): mmap/sysfs reads from taccd's loop (one tick each); "device": the
    # device samples into each function's sample ring (a function whose ring cannot be
    # opened, e.g. another consumer has it, falls back to "host", with a warning).  Not
    # the default: an open sample ring keeps the device out of runtime suspend and its
    # link out of L1 for the whole capture, which a capture of PM must not change
    # (test_capture_device_events, test_linkpm's L1 exits on the timeline)
    counters_source: str = "host"
    clock_hz: float = 1.0
    max_bytes: int = 1 << 30
    pids: list[int] = field(default_factory=list)
    comm: str = ""
    device: str | None = None
    flush_s: float = 1.0
    trace_entries: int = 0  # device trace ring records per function (0 = driver default)
    peers: list[str] = field(default_factory=list)  # clock exchange: ADDR[:PORT]
    # the TLP stream (format minor 7): every PF's TLP capture ring; opt-in, CAP_PERFMON
    tlp: bool = False
    tlp_entries: int = 0  # TLP capture ring records (0 = the driver's default)
    # the TLP stream's device-side filters (docs/capture-format.md "TLP stream"): the
    # functions on the PF's link (0 = PF, n = VF n; [] = all), TLP kinds (mrd, mwr, cpld;
    # [] = all), a bus address range [lo, hi) ([] = all), the device's own control
    # traffic left out
    tlp_funcs: list[int] = field(default_factory=list)
    tlp_kinds: list[str] = field(default_factory=list)
    tlp_addr: list[int] = field(default_factory=list)
    tlp_no_ctrl: bool = False

    def __post_init__(self) -> None:
        """Options a device would refuse are refused here, before any device is touched
        (ValueError, one line)."""
        from tacc.runtime.uapi import TRACE_MAX_ENTRIES, TRACE_MIN_ENTRIES

        for name in ("tlp", "ioctl_events"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r}: true or false")
        from tacc.runtime.uapi import TLPCAP_MAX_ENTRIES, TLPCAP_MIN_ENTRIES

        self.tlp_filters()  # raises on a bad filter
        if self.counters_source not in COUNTER_SOURCES:
            raise ValueError(f"counters_source {self.counters_source!r}: one of "
                             f"{', '.join(COUNTER_SOURCES)}")
        t = self.tlp_entries
        if not isinstance(t, int) or t < 0 or (t and not (
                TLPCAP_MIN_ENTRIES <= t <= TLPCAP_MAX_ENTRIES and t & (t - 1) == 0)):
            raise ValueError(f"TLP ring entries {t}: a power of two from "
                             f"{TLPCAP_MIN_ENTRIES} to {TLPCAP_MAX_ENTRIES}")
        n = self.trace_entries
        if not isinstance(n, int) or n < 0 or (n and not (
                TRACE_MIN_ENTRIES <= n <= TRACE_MAX_ENTRIES and n & (n - 1) == 0)):
            raise ValueError(f"trace ring entries {n}: a power of two from "
                             f"{TRACE_MIN_ENTRIES} to {TRACE_MAX_ENTRIES}")
        if self.peers:  # clockx imports numpy: only when there are peers to check
            from tacc.capture.clockx import parse_peer

            for p in self.peers:
                parse_peer(p)

    def tlp_filters(self) -> tuple[int, int, tuple[int, int] | None, bool]:
        """(function mask, kind mask, address range, no control traffic) for the TLP
        capture ring (``tacc.pcie.ring.TlpRing``); ValueError, one line, on a bad one."""
        funcs = kinds = 0
        for f in self.tlp_funcs:
            if not isinstance(f, int) or isinstance(f, bool) or not 0 <= f < 32:
                raise ValueError(f"TLP filter function {f!r}: 0 (the PF) .. 31 (VF n)")
            funcs |= 1 << f
        if self.tlp_kinds:  # tacc.pcie imports numpy: only when there are kinds to check
            from tacc.pcie import KINDS
        for k in self.tlp_kinds:
            if k not in KINDS:
                raise ValueError(f"TLP filter kind {k!r}: one of {', '.join(KINDS)}")
            kinds |= 1 << KINDS[k]
        a = self.tlp_addr
        if a and (len(a) != 2 or not all(isinstance(x, int) and x >= 0 for x in a)
                  or a[1] <= a[0]):
            raise ValueError(f"TLP filter address range {a!r}: [lo, hi) with hi > lo >= 0")
        if not isinstance(self.tlp_no_ctrl, bool):
            raise ValueError(f"tlp_no_ctrl {self.tlp_no_ctrl!r}: true or false")
        return funcs, kinds, (a[0], a[1]) if a else None, self.tlp_no_ctrl

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
