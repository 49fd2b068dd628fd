"""The software PCIe analyzer: the device's TLP capture ring, pcapng, Perfetto.

The device records every TLP of its link model (docs/hardware.md section 11,
``struct tacc_tlp_rec`` of tacc_hw.h) into a ring the driver exposes
(DRM_IOCTL_TACC_TLPCAP_OPEN/ADVANCE/CLOSE, uAPI 3, CAP_PERFMON).  This package
drains it (:mod:`tacc.pcie.ring`), writes and reads pcapng files with link-layer
type ``LINKTYPE_USER0`` (147) whose packets are the raw records
(:mod:`tacc.pcie.pcapng`, decoded by ``tools/tacc-tlp.lua`` in Wireshark), and turns
them into a Perfetto timeline with per-direction TLP tracks and read-latency flows
(:mod:`tacc.pcie.perfetto`).
"""

from __future__ import annotations

import numpy as np

from tacc.capture.schema import TLP_REC_DTYPE

# struct tacc_tlp_rec (tacc_hw.h; one definition, the capture's: tacc.capture.schema);
# tests/host/test_pcie.py checks it against the header
TLP_DTYPE = TLP_REC_DTYPE

MRD, MWR, CPLD = 0, 1, 2  # TACC_TLP_*
KIND_NAMES = {MRD: "MRd", MWR: "MWr", CPLD: "CplD"}
KINDS = {"mrd": MRD, "mwr": MWR, "cpld": CPLD}
F_UP, F_CTRL = 1, 2  # TACC_TLP_F_*
LINKTYPE = 147  # LINKTYPE_USER0 / DLT_USER0 (the user range 147-162)


def summary(recs: np.ndarray) -> dict[str, dict[str, int]]:
    """Per direction (``h2d`` = down, ``d2h`` = up) and traffic class (``cmd``,
    ``ctrl``): TLP count, payload and link bytes, and counts by kind.  The numbers the
    device counters hold (docs/hardware.md section 11, "Agreement with the counters")."""
    out: dict[str, dict[str, int]] = {}
    up = (recs["flags"] & F_UP) != 0
    ctrl = (recs["flags"] & F_CTRL) != 0
    for dname, dm in (("h2d", ~up), ("d2h", up)):
        for cname, cm in (("cmd", ~ctrl), ("ctrl", ctrl)):
            m = dm & cm
            r = recs[m]
            row = {"tlps": int(m.sum()), "link_bytes": int(r["link_bytes"].sum()),
                   "payload": int(r["payload"][r["kind"] != MRD].sum())}
            for k, name in KIND_NAMES.items():
                row[name] = int((r["kind"] == k).sum())
            out[f"{dname}_{cname}"] = row
    return out
